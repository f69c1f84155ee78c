"""Text a host or a result file sends never reaches the terminal raw: escape sequences in an agent's answer, a run's
state or a `.pt`'s args are shown as `\\xNN`, through the real CLI (a `connection: local` host whose python is a
hostile agent), and CSV cells that a spreadsheet would run as formulas are neutralised."""

from __future__ import annotations

import csv
import io
import json
import re
import stat
import sys
from pathlib import Path

import pytest

from ddops.safe_text import csv_cell, csv_safe, one_line, printable
from tests.conftest import MINI_DDTREE, git_seed, run_ddops

# Set the window title, clear the screen, home the cursor, draw a fake line, a C1 CSI, an OSC 52 clipboard write.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[Hall green\x9b31m\x1b]52;c;ZXZpbA==\x07\r"
# What may reach a terminal from ddops itself without colours (a pipe): text, newlines and tabs only.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
ENV = {"SSH_AUTH_SOCK": "", "NO_COLOR": "1", "TERM": "dumb"}


def assert_inert(text: str) -> None:
    found = RAW_CONTROL.search(text)
    assert found is None, f"raw control character {found.group()!r} reached the terminal: {text!r}"


# -- the sanitizer ---------------------------------------------------------------------------------------------


def test_every_c0_and_c1_control_but_tab_and_newline_is_shown_as_its_code():
    assert printable(HOSTILE) == ("\\x1b]0;pwned\\x07\\x1b[2J\\x1b[Hall green\\x9b31m\\x1b]52;c;ZXZpbA==\\x07\\x0d")
    assert printable("a\tb\nc\x7fd\x85") == "a\tb\nc\\x7fd\\x85"
    assert one_line("a\nb\tc") == "a\\x0ab\tc"
    assert printable("plain · text ✓") == "plain · text ✓"


@pytest.mark.parametrize("cell, shown", [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1+cmd|'/C calc'!A0", "'+1+cmd|'/C calc'!A0"),
    ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"), ("\t=1", "'\t=1"),
    ("-0.25", "-0.25"), ("+3", "+3"), ("1e-3", "1e-3"), ("gsm8k", "gsm8k"), ("", ""),
])
def test_csv_cells_that_would_start_a_formula_get_a_leading_quote_and_numbers_stay_numbers(cell, shown):
    assert csv_cell(cell) == shown


def test_csv_safe_keeps_rows_and_quoting_and_neutralises_each_cell():
    text = "host,dataset,speedup\nh1,\"=1+1,x\",-0.5\nh2,\"a\nb\",2\n"
    rows = list(csv.reader(io.StringIO(csv_safe(text))))
    assert rows == [["host", "dataset", "speedup"], ["h1", "'=1+1,x", "-0.5"], ["h2", "a\nb", "2"]]


# -- through the CLI ------------------------------------------------------------------------------------------


def hostile_agent(tmp_path: Path, answers: dict) -> Path:
    """An executable that serves the agent protocol with `answers` (verb -> reply document; "*": any other)."""
    table = tmp_path / "answers.json"
    table.write_text(json.dumps(answers))
    agent = tmp_path / "hostile-agent"
    agent.write_text(f"""#!{sys.executable}
import json, sys
answers = json.load(open({str(table)!r}))
size = next(int(word) for word in sys.argv[1:] if word.isdigit())
sys.stdin.buffer.read(size)  # the agent bundle
for line in sys.stdin.buffer:
    verb = json.loads(line)["verb"]
    sys.stdout.write(json.dumps(answers.get(verb, answers.get("*"))) + "\\n")
    sys.stdout.flush()
""")
    agent.chmod(agent.stat().st_mode | stat.S_IXUSR)
    return agent


def local_inventory(tmp_path: Path, python: Path | None = None) -> Path:
    checkout = git_seed(MINI_DDTREE, tmp_path / "checkout")
    path = tmp_path / "inventory.yaml"
    extra = f", python: {json.dumps(str(python))}" if python else ""
    path.write_text(f"ssh_config: /dev/null\nknown_hosts: {tmp_path / 'known_hosts'}\n"
                    f"hosts:\n  here: {{connection: local, repo: {json.dumps(str(checkout))}{extra}}}\n")
    return path


@pytest.mark.parametrize("args", [("status", "--all"), ("patch", "--all", "cpu-timing"), ("-v", "ping", "--all"),
                                  ("rollback", "--all")])
def test_an_agents_error_full_of_escape_sequences_is_shown_inert(tmp_path, args):
    agent = hostile_agent(tmp_path, {"*": {"ok": False, "error": {"kind": "x", "message": HOSTILE}}})
    proc = run_ddops(*args, inventory=local_inventory(tmp_path, agent), env=ENV)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    shown = proc.stdout + proc.stderr
    assert_inert(shown)
    assert "\\x1b]0;pwned" in shown.replace("\n", "")  # said, not done


def test_a_snapshots_file_error_and_facts_full_of_escape_sequences_are_shown_inert(tmp_path):
    files = {name: {"exists": True, "error": {"kind": "io", "message": f"{name}: {HOSTILE}"}}
             for name in ("ddtree.py", "dflash.py", "model/dflash.py")}
    snapshot = {"repo": "/r", "files": files, "journal": [], "journal_corrupt": [], "lock": None,
                "facts": {"git_commit": HOSTILE}}
    agent = hostile_agent(tmp_path, {"snapshot": {"ok": True, "result": snapshot}})
    for args in (("status", "--all", "cpu-timing"), ("patch", "--all", "cpu-timing")):
        proc = run_ddops(*args, inventory=local_inventory(tmp_path / args[0], agent), env=ENV)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert_inert(proc.stdout + proc.stderr)


def test_bench_list_shows_a_run_whose_status_this_ddops_does_not_know(tmp_path):
    inventory = local_inventory(tmp_path)
    run = tmp_path / "checkout" / ".ddops" / "runs" / "r-newer"
    run.mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({"status": "hibernating", "done": 1, "total": 2}))  # a newer ddops's
    proc = run_ddops("bench", "list", "--all", inventory=inventory, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "r-newer" in proc.stdout and "hibernating" in proc.stdout and "1/2" in proc.stdout


def test_bench_list_shows_hostile_run_values_inert_and_as_text_not_markup(tmp_path):
    run = {"run_id": "r1[/]", "plan": "[red]plan\x1b[2J", "status": "[/]\x9b", "done": 1, "total": 3,
           "started": "[link=x]" + HOSTILE, "ended": None}
    agent = hostile_agent(tmp_path, {"bench_list": {"ok": True, "result": {"runs": [run]}}})
    proc = run_ddops("bench", "list", "--all", inventory=local_inventory(tmp_path, agent), env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_inert(proc.stdout + proc.stderr)
    shown = proc.stdout.replace("\n", "").replace(" ", "").replace("│", "")
    assert "r1[/]" in shown and "[red]plan\\x1b[2J" in shown and "[/]\\x9b" in shown and "1/3" in shown


def _hostile_run(root: Path, dataset: str) -> None:
    torch = pytest.importorskip("torch")
    run = root / "r1"
    (run / "h1").mkdir(parents=True)
    doc = {"responses": [{"baseline": {"time_per_output_token": 0.03, "output_ids": [1, 2]},
                          "ddtree_tb32": {"time_per_output_token": 0.01, "output_ids": [1, 2],
                                          "acceptance_lengths": [2]}}],
           "args": {"dataset": dataset, "temperature": 0.0, "model_name_or_path": "=cmd|' /C calc'!A0"}}
    torch.save(doc, run / "h1" / "result.pt")
    entry = {"files": [{"path": "result.pt"}], "status": "completed"}
    (run / "manifest.json").write_text(json.dumps({"run_id": "r1", "summarizer": "ddtree", "hosts": {"h1": entry}}))


@pytest.mark.torch
@pytest.mark.parametrize("fmt", ["table", "md", "csv"])
def test_a_result_files_dataset_full_of_escape_sequences_is_shown_inert_in_every_report_format(tmp_path, fmt):
    _hostile_run(tmp_path, "gsm8k" + HOSTILE)
    proc = run_ddops("bench", "report", "r1", "--format", fmt, "--results-dir", str(tmp_path), env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_inert(proc.stdout + proc.stderr)
    assert "gsm8k\\x1b]0;pwned" in proc.stdout.replace("\n", "")


@pytest.mark.torch
def test_a_report_csv_cell_that_would_start_a_formula_is_neutralised(tmp_path):
    _hostile_run(tmp_path, "=HYPERLINK(\"http://evil\",\"x\")")
    proc = run_ddops("bench", "report", "r1", "--format", "csv", "--results-dir", str(tmp_path), env=ENV)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert rows and {r["dataset"] for r in rows} == {"'=HYPERLINK(\"http://evil\",\"x\")"}
    assert {r["model"] for r in rows} == {"'=cmd|' /C calc'!A0"}
    assert all(not cell.startswith(("=", "+", "@")) for r in rows for cell in r.values())


@pytest.mark.parametrize("grouped", [(), ("--grouped",)])
def test_exec_shows_a_commands_escape_sequences_inert_and_json_keeps_the_bytes(tmp_path, grouped):
    inventory = local_inventory(tmp_path)
    line = r"printf '\033]0;pwned\007\033[2Jhi\n'; printf '\033[31merr\n' >&2; exit 3"
    proc = run_ddops("exec", "--all", *grouped, "--shell", line, inventory=inventory, env=ENV)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert_inert(proc.stdout + proc.stderr)
    assert "\\x1b]0;pwned\\x07\\x1b[2Jhi" in proc.stdout and "\\x1b[31merr" in proc.stderr
    doc = json.loads(run_ddops("--json", "exec", "--all", "--shell", line, inventory=inventory, env=ENV).stdout)
    assert doc["hosts"][0]["data"]["stdout"] == "\x1b]0;pwned\x07\x1b[2Jhi\n"
