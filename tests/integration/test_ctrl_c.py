"""Ctrl-C on a fleet run, sent as SIGINT to a real `ddops` process working on real sshd hosts: the first stops
starting hosts, lets commits in flight finish, ends commands that are only running on their hosts, and says what
it did (a recap, or under --json one document with "interrupted": true), exit 130."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, as_at_a_terminal, host_processes, requires_sshd, wait_until

pytestmark = [pytest.mark.sshd, requires_sshd]

ORIGINAL_LINE = "past_key_values_target = DynamicCache()\n"


def start_ddops(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ddops", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, env={**os.environ, "COLUMNS": "200"}, preexec_fn=as_at_a_terminal)


def processes_with(bed, name: str, predicate) -> list[int]:
    """The pids of the host's processes (sshd listener aside) for which predicate(pid) holds."""
    found = []
    for pid in host_processes(bed, name):
        try:
            if predicate(pid):
                found.append(pid)
        except OSError:
            continue  # ended since it was listed
    return found


def running(argv: list[str]):
    want = ("\0".join(argv) + "\0").encode()
    return lambda pid: Path(f"/proc/{pid}/cmdline").read_bytes() == want


def has_open(suffix: str):
    def check(pid: int) -> bool:
        fds = Path(f"/proc/{pid}/fd")
        return any(os.readlink(fd).endswith(suffix) for fd in fds.iterdir())
    return check


def interrupt(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_ctrl_c_ends_a_running_exec_on_every_host_at_once(make_testbed):
    bed = make_testbed(2)
    sleeper = ["sleep", "3001"]
    proc = start_ddops("-i", str(bed.inventory_path), "exec", "--all", "--", *sleeper)
    try:
        wait_until(lambda: all(processes_with(bed, h.name, running(sleeper)) for h in bed.hosts), timeout=60)
        code, out, err = interrupt(proc)
    finally:
        proc.kill()
    assert code == 130, err
    assert "interrupted: 0 done, 0 finished their commit, 2 cancelled, 0 not started" in err
    # Ended on the hosts, not only on the controller's side of the connection.
    wait_until(lambda: not any(processes_with(bed, h.name, running(sleeper)) for h in bed.hosts), timeout=30)


def test_ctrl_c_under_json_still_prints_one_document_saying_interrupted(make_testbed):
    bed = make_testbed(3)
    sleeper = ["sleep", "3002"]
    proc = start_ddops("-i", str(bed.inventory_path), "exec", "--all", "--json", "--forks", "1", "--", *sleeper)
    try:
        wait_until(lambda: processes_with(bed, "host1", running(sleeper)), timeout=60)
        code, out, err = interrupt(proc)
    finally:
        proc.kill()
    doc = json.loads(out)
    assert code == 130 and doc["exit_code"] == 130 and doc["interrupted"] is True
    assert [h.get("interrupted") for h in doc["hosts"]] == ["cancelled", "not_started", "not_started"]
    assert doc["summary"] == {"failed": 1, "skipped": 2}
    wait_until(lambda: not processes_with(bed, "host1", running(sleeper)), timeout=30)


def test_ctrl_c_during_a_commit_lets_it_finish_and_starts_no_other_host(make_testbed, seed):
    bed = make_testbed(3, seed=seed, patches=("hybrid-cache",))
    state = bed.hosts[0].repo_dir / ".ddops"
    state.mkdir(mode=0o700)
    with open(state / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # host1's commit waits for this lock: in flight, and held there
        proc = start_ddops("-i", str(bed.inventory_path), "patch", "--all", "--forks", "1", "--lock-timeout", "300")
        try:
            wait_until(lambda: processes_with(bed, "host1", has_open("/.ddops/lock")), timeout=60)
            proc.send_signal(signal.SIGINT)
            wait_until(lambda: "no new host starts" in proc.stderr.readline(), timeout=60)
            fcntl.flock(held, fcntl.LOCK_UN)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted: 0 done, 1 finished their commit, 2 not started" in err
    assert "host1" in out and "changed" in out  # the recap
    assert ORIGINAL_LINE not in (bed.hosts[0].repo_dir / "ddtree.py").read_text()
    for host in bed.hosts[1:]:
        assert ORIGINAL_LINE in (host.repo_dir / "ddtree.py").read_text()
        assert not (host.repo_dir / ".ddops" / "journal.jsonl").exists()


def test_a_second_ctrl_c_abandons_the_hosts_in_flight_at_once(make_testbed, seed):
    bed = make_testbed(2, seed=seed, patches=("hybrid-cache",))
    state = bed.hosts[0].repo_dir / ".ddops"
    state.mkdir(mode=0o700)
    with open(state / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # host1's commit waits here for as long as the test holds it
        proc = start_ddops("-i", str(bed.inventory_path), "patch", "--all", "--forks", "1", "--lock-timeout", "300")
        try:
            wait_until(lambda: processes_with(bed, "host1", has_open("/.ddops/lock")), timeout=60)
            proc.send_signal(signal.SIGINT)
            wait_until(lambda: "no new host starts" in proc.stderr.readline(), timeout=60)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)  # gone while the lock is still held: it waited for nothing
        finally:
            proc.kill()
        assert proc.returncode == 130
        assert "abandoned" in err
    assert ORIGINAL_LINE in (bed.hosts[1].repo_dir / "ddtree.py").read_text()  # never started
