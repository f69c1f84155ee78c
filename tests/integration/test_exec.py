"""`ddops exec` on real sshd hosts: output, exit codes, --json, --timeout, --in-repo, hostile arguments, --grouped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddops.testbed import stop_host
from tests import conftest
from tests.conftest import host_processes, requires_sshd, run_ddops, run_ddops_json, wait_until

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    # The commands here leave the hosts as they found them, so one testbed serves the whole module.
    with conftest.testbeds(tmp_path_factory) as start:
        yield start(3)


def ddops_exec(bed, *args: str, inventory: Path | None = None):
    return run_ddops("exec", *args, inventory=inventory or bed.inventory_path)


def exec_json(bed, *args: str) -> tuple[int, dict]:
    return run_ddops_json("exec", *args, inventory=bed.inventory_path)


def test_exec_streams_each_hosts_output_prefixed_by_the_host(bed):
    proc = ddops_exec(bed, "--all", "--", "hostname")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["host1 | host1", "host2 | host2", "host3 | host3"]
    assert "3 hosts: 3 ok" in proc.stderr


def test_stderr_lines_go_to_stderr_with_their_host(bed):
    proc = ddops_exec(bed, "--host", "host2", "--shell", "echo out; echo err >&2")
    assert proc.returncode == 0
    assert proc.stdout == "host2 | out\n"
    assert "host2 | err" in proc.stderr


def test_one_failing_host_makes_the_exit_code_1_and_json_has_each_hosts_exit_code(bed):
    code, doc = exec_json(bed, "--all", "--shell", 'echo "on $(hostname)"; [ "$(hostname)" != host2 ] || exit 7')
    assert code == 1
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert {name: h["data"]["exit_code"] for name, h in by_host.items()} == {"host1": 0, "host2": 7, "host3": 0}
    assert {name: h["status"] for name, h in by_host.items()} == {"host1": "ok", "host2": "failed", "host3": "ok"}
    assert by_host["host3"]["data"]["stdout"] == "on host3\n"
    assert by_host["host2"]["message"] == "exit 7"
    assert doc["command"] == "exec" and doc["exit_code"] == 1 and doc["summary"] == {"ok": 2, "failed": 1}


def test_hostile_arguments_stay_arguments(bed, tmp_path):
    marker = tmp_path / "pwned"  # the hosts share this machine's /tmp: a command that ran would create it
    hostile = [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"&& touch {marker}", "$HOME", "*"]
    code, doc = exec_json(bed, "--host", "host1", "--", "printf", "%s\\n", *hostile)
    assert code == 0, doc
    assert doc["hosts"][0]["data"]["stdout"].splitlines() == hostile
    assert not marker.exists()


def test_a_pipeline_runs_only_when_passed_explicitly_with_shell(bed):
    code, doc = exec_json(bed, "--host", "host1", "--", "echo", "a|b", "|", "tr", "a", "X")
    assert doc["hosts"][0]["data"]["stdout"] == "a|b | tr a X\n"  # one program, its words as given
    code, doc = exec_json(bed, "--host", "host1", "--shell", "echo a-b | tr a X")
    assert code == 0 and doc["hosts"][0]["data"]["stdout"] == "X-b\n"


def test_in_repo_runs_in_each_hosts_repo_directory(bed):
    (bed.hosts[1].repo_dir / "only-on-host2.txt").write_text("x")
    try:
        code, doc = exec_json(bed, "--all", "--in-repo", "--", "ls")
        assert code == 0
        listings = {h["host"]: h["data"]["stdout"].split() for h in doc["hosts"]}
        assert "only-on-host2.txt" in listings["host2"] and "only-on-host2.txt" not in listings["host1"]
        code, doc = exec_json(bed, "--host", "host1", "--in-repo", "--", "pwd")
        assert doc["hosts"][0]["data"]["stdout"].strip() == bed.repo_path
    finally:
        (bed.hosts[1].repo_dir / "only-on-host2.txt").unlink()


def test_timeout_ends_the_command_on_the_host_and_fails_that_host(bed):
    started = time.monotonic()
    code, doc = exec_json(bed, "--host", "host3", "--timeout", "1", "--shell", "sleep 41 | sleep 42")
    assert time.monotonic() - started < 41, "exec waited for the sleeps"
    assert code == 1
    [entry] = doc["hosts"]
    assert entry["status"] == "failed" and entry["data"]["timed_out"] is True
    assert "timed out after 1s" in entry["message"]

    def sleeps_left() -> list[str]:
        found = []
        for pid in host_processes(bed, "host3"):
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
        return [c for c in found if c.startswith("sleep 4")]

    wait_until(lambda: not sleeps_left(), timeout=10)  # both ends of the pipeline, not just the shell


def commands_left(bed, name: str, marker: str) -> list[str]:
    """Command lines of the host's processes that contain `marker` (a number no other process would have)."""
    found = []
    for pid in host_processes(bed, name):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(cmdline)
    return found


@pytest.mark.parametrize("case, line, marker", [
    # The review's case: the end that ignores TERM survived `timeout` (which only waits for its own child) and kept
    # the channel open until the controller gave up ("cut off").
    ("pipeline", "sh -c \"trap '' TERM; sleep 300.25\" | cat", "sleep 300.25"),
    # One command that ignores TERM: `timeout` KILLed its own group too, and the host said no exit status.
    ("single", "trap '' TERM; sleep 300.5", "sleep 300.5"),
])
def test_a_command_that_ignores_term_is_killed_at_its_timeout_and_reported_as_timed_out(bed, case, line, marker):
    code, doc = exec_json(bed, "--host", "host2", "--timeout", "1", "--shell", line)
    [entry] = doc["hosts"]
    assert code == 1 and entry["status"] == "failed" and entry["data"]["timed_out"] is True, entry
    assert entry["message"] == "timed out after 1s (ended on the host)"
    assert commands_left(bed, "host2", marker) == []


def test_a_background_process_holding_the_output_is_ended_at_the_timeout_and_the_host_reported_timed_out(bed):
    # The audit's case: the shell exits at once and its `sleep` holds the session open; exec used to wait for the
    # controller's own deadline (timeout + 15 s), say "cut off", and leave the sleep running on the host.
    code, doc = exec_json(bed, "--host", "host1", "--timeout", "3", "--shell", "sleep 321.75 & echo hi")
    [entry] = doc["hosts"]
    assert code == 1 and entry["status"] == "failed" and entry["data"]["timed_out"] is True, entry
    assert entry["message"] == "timed out after 3s (ended on the host)" and entry["data"]["stdout"] == "hi\n"
    assert commands_left(bed, "host1", "sleep 321.75") == []


def test_grouped_shows_identical_output_once(bed):
    proc = ddops_exec(bed, "--all", "--grouped", "--shell", 'echo same; [ "$(hostname)" != host3 ] || echo odd')
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("same") == 2  # once for host1+host2, once for host3
    assert "2 hosts · exit 0 (host1, host2)" in out and "host3 · exit 0" in out
    assert "host1 |" not in out  # not streamed


def test_sudo_as_root_runs_the_command_without_sudo(bed):
    # Testbed hosts log in as root, where --sudo needs no sudo (not even installed here); the non-root command
    # line and the refusal when sudo wants a password are specified in tests/unit/test_adhoc.py.
    code, doc = exec_json(bed, "--host", "host1", "--sudo", "--", "id", "-u")
    assert code == 0 and doc["hosts"][0]["data"]["stdout"] == "0\n"
    assert "sudo" not in doc["hosts"][0]["data"]["command"]


def test_missing_command_or_both_forms_is_a_usage_error(bed):
    assert ddops_exec(bed, "--all").returncode == 2
    proc = ddops_exec(bed, "--all", "--shell", "ls", "--", "ls")
    assert proc.returncode == 2 and "not both" in proc.stderr


def test_an_unreachable_host_is_reported_and_the_others_still_run(make_testbed):
    small = make_testbed(2)
    stop_host(small, "host2")
    code, doc = exec_json(small, "--all", "--", "true")
    assert code == 1
    assert {h["host"]: h["status"] for h in doc["hosts"]} == {"host1": "ok", "host2": "unreachable"}
