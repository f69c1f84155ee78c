"""`ddops --help` stays fast: the CLI module imports none of the heavy dependencies a command may need later."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "libcst", "paramiko", "cryptography", "yaml", "matplotlib")


def test_loading_the_cli_imports_no_heavy_dependency():
    code = ("import sys, ddops.cli.app; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_help_lists_every_command_group():
    out = subprocess.run([sys.executable, "-m", "ddops", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    for command in ("hosts", "inventory", "ping", "patch", "verify", "rollback", "status", "sync", "deploy", "bench",
                    "testbed"):
        assert f" {command} " in out, command


def test_version():
    out = subprocess.run([sys.executable, "-m", "ddops", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ddops ")
