"""Faults during patch and rollback on real sshd hosts: whatever is cut, killed or stopped, and wherever, every file
ends fully old or fully new, the journal agrees with the files, `status` tells the truth, and running ddops again
converges (and `rollback` still restores the original bytes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from ddops.testbed import start_host, stop_host
from tests.conftest import REPO_ROOT, one_json, requires_sshd, wait_until
from tests.reliability.conftest import host_statuses, messages, quiet, session_pids, with_inventory

pytestmark = [pytest.mark.sshd, requires_sshd]

# Where the agent's fault points sit in the write of one file (see remote/README.md, "Fault injection"). The first
# file a commit of the built-in playbooks writes is dflash.py, then ddtree.py.
COMMIT_STAGES = {
    "locked": {"dflash.py": "old", "ddtree.py": "old"},          # lock held, nothing written
    "pending": {"dflash.py": "old", "ddtree.py": "old"},         # backup and pending note written, file untouched
    "temp-written": {"dflash.py": "old", "ddtree.py": "old"},    # new bytes in a temp file, not renamed
    "renamed": {"dflash.py": "new", "ddtree.py": "old"},         # renamed into place, journal line not written
    "before-journal": {"dflash.py": "new", "ddtree.py": "old"},  # read back and verified, journal line not written
    "journalled": {"dflash.py": "new", "ddtree.py": "old"},      # first file done, second not begun
    "renamed:ddtree.py": {"dflash.py": "new", "ddtree.py": "new"},  # the second file renamed, not journalled
}


@pytest.fixture(scope="module")
def fleet(make_fleet):
    return make_fleet(3)


class CutBefore:
    """Stands in for a session: just before `verb` is sent, `cut()` runs (e.g. kills the host's SSH session)."""

    def __init__(self, session: Any, verb: str, cut: Any) -> None:
        self._session, self._verb, self._cut = session, verb, cut

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def call_agent(self, verb: str, payload: dict, **kwargs: Any) -> dict:
        if verb == self._verb:
            self._cut()
        return self._session.call_agent(verb, payload, **kwargs)


def kill_sessions(fleet, name: str) -> None:
    for pid in session_pids(fleet, name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_cut_off(result: Any) -> None:
    assert result.status == "unreachable" and "connection lost" in result.message, (result.status, result.message)


@pytest.mark.parametrize("stage", list(COMMIT_STAGES))
def test_connection_killed_at_each_stage_of_a_commit_then_patch_converges_and_rollback_restores(fleet, stage):
    fleet.reset("host1")
    fleet.arm("host1", {"commit": {stage: "kill"}})
    assert_cut_off(fleet.patch("host1")["host1"])
    assert not (fleet.repo("host1") / ".ddops" / "faults.json").exists()  # one shot
    assert fleet.assert_nothing_lost("host1")["host1"] == COMMIT_STAGES[stage]

    rerun = fleet.patch("host1")["host1"]
    # Only what is left is written; model/dflash.py, the third file the playbooks patch, is left at every stage.
    assert rerun.status == "changed", rerun.message
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}

    assert fleet.rollback("host1")["host1"].status == "changed"
    fleet.assert_original("host1")
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "old", "ddtree.py": "old"}
    fleet.assert_clean("host1")  # the rollback tidied up what the killed agent left


@pytest.mark.parametrize("stage", ["renamed", "journalled"])
def test_an_agent_killed_alone_mid_commit_says_which_files_the_host_now_holds_patched(fleet, stage):
    # As the OOM killer does: the agent dies, the connection stays. It used to read "agent commit failed (exit -1):
    # no output", with no word that dflash.py was already patched.
    fleet.reset("host1")
    fleet.arm("host1", {"commit": {stage: "oom"}})
    result = fleet.patch("host1")["host1"]
    assert result.status == "failed", result.message
    assert result.message.startswith("the agent ended during the commit without answering"), result.message
    assert "the host now holds: dflash.py patched, ddtree.py original" in result.message
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "old"}
    assert fleet.patch("host1")["host1"].status == "changed"
    assert fleet.rollback("host1")["host1"].status == "changed"
    fleet.assert_original("host1")


@pytest.mark.parametrize("stage", ["locked", "temp-written", "renamed", "before-journal"])
def test_connection_killed_at_each_stage_of_a_rollback_then_rollback_converges(fleet, stage):
    fleet.reset("host1")
    assert fleet.patch("host1")["host1"].status == "changed"
    fleet.arm("host1", {"rollback": {stage: "kill"}})
    assert_cut_off(fleet.rollback("host1")["host1"])
    first = "old" if stage in ("renamed", "before-journal") else "new"
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": first, "ddtree.py": "new"}

    rerun = fleet.rollback("host1")["host1"]
    assert rerun.status == "changed", rerun.message
    fleet.assert_original("host1")
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "old", "ddtree.py": "old"}
    fleet.assert_clean("host1")
    assert fleet.patch("host1")["host1"].status == "changed"  # and it can be patched again


def test_connection_killed_before_the_commit_is_sent_writes_nothing_and_a_rerun_converges(fleet):
    fleet.reset("host1")
    cut = lambda host, session: CutBefore(session, "commit", lambda: kill_sessions(fleet, host.name))  # noqa: E731
    assert_cut_off(fleet.patch("host1", wrap=cut)["host1"])
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "old", "ddtree.py": "old"}
    assert not (fleet.repo("host1") / ".ddops").exists()  # the commit never reached the host
    assert fleet.patch("host1")["host1"].status == "changed"
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}


def test_a_dropped_connection_does_not_stop_the_agent_finishing_its_commit(fleet):
    fleet.reset("host1")
    fleet.arm("host1", {"commit": {"renamed": "drop"}})  # the SSH session dies; the agent carries on
    assert_cut_off(fleet.patch("host1")["host1"])
    wait_until(lambda: quiet(fleet, "host1"), timeout=20)  # the agent finishes on its own
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}
    fleet.assert_clean("host1")
    again = fleet.patch("host1")["host1"]
    assert again.status == "ok" and "already applied" in again.message


def test_sshd_stopped_mid_fleet_fails_that_host_only_and_a_rerun_converges(fleet):
    fleet.reset()
    stop = lambda host, session: (CutBefore(session, "commit", lambda: stop_host(fleet.bed, "host2"))  # noqa: E731
                                  if host.name == "host2" else session)
    try:
        results = fleet.patch(wrap=stop)
    finally:
        if not fleet.bed.host("host2").running():
            start_host(fleet.bed, "host2")
    assert host_statuses(results) == {"host1": "changed", "host2": "unreachable", "host3": "changed"}, \
        messages(results)
    states = fleet.assert_nothing_lost()
    assert states["host2"] == {"dflash.py": "old", "ddtree.py": "old"}
    assert host_statuses(fleet.patch()) == {"host1": "ok", "host2": "changed", "host3": "ok"}
    assert all(s == {"dflash.py": "new", "ddtree.py": "new"} for s in fleet.assert_nothing_lost().values())


def test_a_host_that_accepts_tcp_but_never_answers_ssh_is_unreachable_within_the_connect_timeout(fleet, tmp_path):
    import socket

    fleet.reset()
    listener = socket.socket()
    listener.bind((fleet.bed.hosts[0].address, 0))
    listener.listen()  # accepts connections, never says a word
    inventory = with_inventory(fleet, tmp_path / "silent.yaml",
                               f"  silent: {{address: {fleet.bed.hosts[0].address}, "
                               f"port: {listener.getsockname()[1]}}}\n",
                               **{"connect_timeout: 5": "connect_timeout: 1"})
    try:
        proc = fleet.cli("--json", "patch", "--all", inventory=inventory)
    finally:
        listener.close()
    doc = one_json(proc)
    statuses = {h["host"]: h for h in doc["hosts"]}
    assert proc.returncode == 1
    assert {n: h["status"] for n, h in statuses.items()} == {
        "host1": "changed", "host2": "changed", "host3": "changed", "silent": "unreachable"}
    # Ended by the 1 s connect timeout (the message names it), not by a wall time that load stretches.
    assert "within 1s" in statuses["silent"]["message"]


def test_two_controllers_patching_and_rolling_back_the_same_hosts_never_corrupt_a_file_or_the_journal(fleet):
    fleet.reset()
    names = ("host1", "host2")
    hosts = fleet.hosts(*names)
    outcomes: list[tuple[str, str, str]] = []
    torn: list[str] = []
    done = threading.Event()

    def controller() -> None:
        for _ in range(20):
            for what, run in (("patch", fleet.patch), ("rollback", fleet.rollback)):
                for r in run(hosts=hosts).values():
                    outcomes.append((what, r.status, r.message))

    def watcher() -> None:  # every read of every file, all along, is the old file or the new one
        while not done.is_set():
            for name in names:
                try:
                    fleet.file_states(name)
                except AssertionError as exc:
                    torn.append(str(exc))

    threads = [threading.Thread(target=controller) for _ in range(2)]
    watch = threading.Thread(target=watcher)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    done.set()
    watch.join()
    assert torn == []
    assert len(outcomes) == 2 * 20 * 2 * len(names)
    for what, status, message in outcomes:
        # The loser of a race is told so (lock or compare-and-swap), never half applied.
        assert status in ("changed", "ok") or (status == "failed" and (
            "locked by" in message or "changed since it was read" in message)), (what, status, message)
    fleet.assert_nothing_lost(*names)
    assert set(host_statuses(fleet.rollback(*names)).values()) <= {"changed", "ok"}
    for name in names:
        fleet.assert_original(name)
        fleet.assert_clean(name)
        lines = (fleet.repo(name) / ".ddops" / "journal.jsonl").read_bytes().splitlines()
        assert all(isinstance(json.loads(line), dict) for line in lines)  # no torn or interleaved line


def test_controller_sigkilled_in_the_middle_of_a_ten_host_run_then_a_rerun_converges(make_fleet):
    fleet = make_fleet(10)
    proc = subprocess.Popen([sys.executable, "-m", "ddops", "-i", str(fleet.bed.inventory_path), "--json", "patch",
                             "--all", "--forks", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT)
    journals = [fleet.repo(h.name) / ".ddops" / "journal.jsonl" for h in fleet.bed.hosts]
    try:
        wait_until(lambda: any(j.exists() and j.stat().st_size for j in journals), timeout=60, interval=0.01)
    finally:
        proc.kill()  # SIGKILL: no cleanup of any kind on the controller
        proc.communicate()
    patched_hosts = sum(1 for j in journals if j.exists() and j.stat().st_size)
    assert patched_hosts < 10, "the run finished before it could be killed"
    wait_until(lambda: all(quiet(fleet, h.name) for h in fleet.bed.hosts), timeout=30)  # agents may finish
    fleet.assert_nothing_lost()

    rerun = fleet.cli("--json", "patch", "--all")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert {h["status"] for h in one_json(rerun)["hosts"]} <= {"changed", "ok"}
    assert all(s == {"dflash.py": "new", "ddtree.py": "new"} for s in fleet.assert_nothing_lost().values())
    back = fleet.cli("--json", "rollback", "--all")
    assert back.returncode == 0, back.stdout + back.stderr
    for h in fleet.bed.hosts:
        fleet.assert_original(h.name)
