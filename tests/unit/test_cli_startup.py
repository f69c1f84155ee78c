"""`ddops --help` stays fast: the CLI module imports none of the heavy dependencies a command may need later."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "libcst", "paramiko", "cryptography", "yaml", "matplotlib")


def test_loading_the_cli_imports_no_heavy_dependency():
    code = ("import sys, ddops.cli.app; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_a_json_command_that_connects_loads_no_part_of_rich(tmp_path):
    # --json draws nothing: rich's console alone is ~15 ms of a command's start.
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"ssh_config: /dev/null\nhosts:\n  h1: {{address: 127.0.0.1, port: {free_port()}}}\n")
    rich = ("rich", "rich.console", "rich.text")
    assert modules_loaded_by(["-i", str(inventory), "ping", "--all", "--json"], rich) == []
    # ... and the same command for a person still draws its table with it.
    assert "rich.console" in modules_loaded_by(["-i", str(inventory), "ping", "--all"], rich)


def free_port() -> int:
    """A port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_tables_and_progress_bars_load_only_when_something_is_drawn():
    # Every command pays the CLI's imports (~12 ms for these two), and `--json` or a plain log draws neither.
    code = "import sys, ddops.cli.app; print(','.join(m for m in ('rich.table', 'rich.progress') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_help_lists_every_command_group():
    out = subprocess.run([sys.executable, "-m", "ddops", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    for command in ("hosts", "inventory", "ping", "exec", "patch", "verify", "rollback", "status", "sync", "deploy",
                    "bench", "testbed"):
        assert f" {command} " in out, command


def test_version():
    out = subprocess.run([sys.executable, "-m", "ddops", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ddops ")


def modules_loaded_by(argv: list[str], candidates: tuple[str, ...]) -> list[str]:
    """Which of `candidates` are imported once `ddops ARGV` has run (in a fresh interpreter)."""
    code = ("import sys\n"
            "from ddops.cli.app import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit:\n"
            "    pass\n"
            f"print('loaded:' + ','.join(m for m in {candidates!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    [line] = [line for line in out.splitlines() if line.startswith("loaded:")]
    return [m for m in line[len("loaded:"):].split(",") if m]


def test_a_connecting_command_loads_invoke_only_if_paramiko_s_match_exec_uses_it(tmp_path):
    # The `fabric` extra installs invoke, which paramiko imports for ssh_config's `Match exec` (~50 ms: asyncio,
    # unittest.mock); the CLI reads ssh_config through `ssh -G` and never uses it.
    pytest.importorskip("invoke")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"ssh_config: /dev/null\nhosts:\n  h1: {{address: 127.0.0.1, port: {free_port()}}}\n")
    assert modules_loaded_by(["-i", str(inventory), "ping", "--all", "--json"], ("invoke", "asyncio")) == []
    # paramiko still reaches the real invoke once `Match exec` uses it, and `import invoke` later gets the real one
    code = ("import sys, ddops.transport, paramiko.config\n"
            "run = paramiko.config.invoke.run\n"
            "import invoke\n"
            "print(run is invoke.run, type(invoke).__name__, 'asyncio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "module", "True"]


def test_parsing_a_command_s_options_imports_no_validation_library():
    # Some typer releases build a pydantic TypeAdapter per option on every command (~0.15 s of startup).
    argv = ["--inventory", "/nonexistent/inventory.yaml", "inventory", "check"]
    assert modules_loaded_by(argv, ("pydantic",)) == []


def test_a_bad_option_or_value_is_a_usage_error_not_a_traceback():
    for argv, says in ((["patch", "--bogus"], "No such option: --bogus"),
                       (["patch", "--all", "--forks", "0"], "0 is not in the range x>=1")):
        proc = subprocess.run([sys.executable, "-m", "ddops", *argv], capture_output=True, text=True)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert says in proc.stderr and "Traceback" not in proc.stderr


def test_help_is_rendered_without_rich_s_markdown_and_syntax_machinery():
    # typer's rich help formatter imports a markdown parser, pygments and rich's traceback: ~0.1 s of `--help` here.
    assert modules_loaded_by(["--help"], ("markdown_it", "pygments", "typer.rich_utils")) == []
