"""The patch tasks against the real agent run as a local subprocess (LocalSession): no sshd, no root.

The same tasks over SSH, on many hosts and through the CLI, are tests/integration/test_patch.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ddops.errors import AgentError
from ddops.fleet import CHANGED, DRIFTED, FAILED, OK, run_fleet
from ddops.inventory import Host
from ddops.patching.kinds import PatchState
from ddops.patching.plan import Planner
from ddops.patching.playbook import load_playbooks
from ddops.tasks.patch import patch_host, rollback_host, status_host, verify_host
from ddops.transport.local import LocalSession
from tests.conftest import agent_program_with_faults

PATCHES = ["cpu-timing", "hybrid-cache", "crop-relative"]
TARGET_NEW = 'past_key_values_target = DynamicCache(config=target.config if hasattr(target, "config") else None)'


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def repo(seed, tmp_path) -> Path:
    import shutil

    dest = tmp_path / "repo"
    shutil.copytree(seed, dest, symlinks=True)
    return dest


@pytest.fixture
def host(repo) -> Host:
    return Host(name="here", address="localhost", repo=str(repo), command_timeout=60)


@pytest.fixture(scope="module")
def books():
    return load_playbooks(PATCHES)


@pytest.fixture(scope="module")
def touched(books, seed) -> tuple[str, ...]:
    """The mini-DDTree files the built-in playbooks patch (their `files:` that the checkout holds)."""
    return tuple(dict.fromkeys(f for book in books for f in book.files if (seed / f).is_file()))


_PLANNER = Planner()


def planner() -> Planner:
    """One in-memory planner for the module: plans are pure and keyed by content, so tests may share them."""
    return _PLANNER


def test_patch_host_writes_every_file_then_says_already_applied(host, session, books, repo, touched):
    first = patch_host(host, session, books, planner=planner(), actor="tester@here")
    assert first.status == CHANGED, first.message
    assert set(first.report.written) == set(touched) >= {"ddtree.py", "dflash.py"}
    assert TARGET_NEW in (repo / "ddtree.py").read_text()
    assert (repo / ".ddops" / "journal.jsonl").is_file()
    again = patch_host(host, session, books, planner=planner())
    assert again.status == OK and again.message.startswith("already applied")
    assert set(again.report.patches.values()) == {PatchState.APPLIED}


def test_patch_host_in_check_mode_reports_the_change_and_writes_nothing(host, session, books, repo, touched):
    before = {f: sha(repo / f) for f in touched}
    outcome = patch_host(host, session, books, planner=planner(), check=True)
    assert outcome.status == CHANGED and outcome.message.startswith(f"would change {len(touched)} files")
    assert {f: sha(repo / f) for f in touched} == before
    assert not (repo / ".ddops" / "journal.jsonl").exists()


def test_patch_host_writes_nothing_when_one_file_drifted(host, session, books, repo):
    before = sha(repo / "dflash.py")
    (repo / "ddtree.py").write_text("# upstream rewrote this file\n")
    outcome = patch_host(host, session, books, planner=planner())
    assert outcome.status in (DRIFTED, FAILED)
    assert outcome.message.startswith(("nothing written", "ddtree.py"))
    assert sha(repo / "dflash.py") == before


def test_status_host_says_modified_when_a_patched_file_was_edited_after(host, session, books, repo):
    assert patch_host(host, session, books, planner=planner()).status == CHANGED
    with open(repo / "ddtree.py", "a") as fh:
        fh.write("# edited by hand\n")
    status = status_host(host, session, books, planner=planner())
    assert status.status == DRIFTED
    assert PatchState.MODIFIED in status.report.patches.values()
    assert "modified" in status.message


def test_rollback_host_restores_the_exact_original_bytes(host, session, books, repo, seed, touched):
    assert patch_host(host, session, books, planner=planner()).status == CHANGED
    outcome = rollback_host(host, session, actor="tester@here")
    assert outcome.status == CHANGED, outcome.message
    assert {f: sha(repo / f) for f in touched} == {f: sha(seed / f) for f in touched}
    assert set(outcome.report.restored) == set(touched) and outcome.report.refused == ()
    assert rollback_host(host, session).message == "nothing to roll back"


def test_verify_host_runs_the_checks_against_the_files_as_they_are(host, session, books):
    unpatched = verify_host(host, session, books)
    assert unpatched.status == FAILED
    assert patch_host(host, session, books, planner=planner()).status == CHANGED
    verified = verify_host(host, session, books)
    assert verified.status == OK, verified.message
    assert verified.report.checks and all(c.ok for c in verified.report.checks)


def test_an_agent_killed_mid_commit_says_which_files_the_host_now_holds_patched(host, books, repo, monkeypatch):
    from ddops.transport import agent

    program = agent_program_with_faults()
    monkeypatch.setattr(agent, "agent_program", lambda: program)
    (repo / ".ddops").mkdir(mode=0o700)
    (repo / ".ddops" / "faults.json").write_text('{"commit": {"journalled": "oom"}}')  # after the first file
    with LocalSession(host) as session:
        outcome = patch_host(host, session, books, planner=planner())
    assert outcome.status == FAILED
    assert outcome.message.startswith("the agent ended during the commit without answering (exit -9: no output); "
                                      "the host now holds: dflash.py patched, ddtree.py original"), outcome.message
    assert outcome.report.written == ("dflash.py",)


@pytest.mark.parametrize("make, reason", [
    (lambda p: (p.unlink(), p.symlink_to("ddtree.py")), "dflash.py: refusing dflash.py: it is a symlink"),
    (lambda p: (p.unlink(), os.mkfifo(p)), "dflash.py: dflash.py is a FIFO, not a regular file"),
    (lambda p: p.write_bytes(b"#" * (16 * 1024 * 1024 + 1)), "dflash.py: dflash.py is 16777217 bytes, over the "),
])
def test_status_says_why_a_target_it_cannot_read_is_an_error(host, session, books, repo, make, reason):
    make(repo / "dflash.py")
    status = status_host(host, session, books, planner=planner())
    assert status.status == FAILED and "error" in status.message
    assert reason in status.message, status.message


def test_local_session_raises_the_agents_error_with_its_kind_and_keeps_serving(host, session, tmp_path):
    with pytest.raises(AgentError) as caught:
        session.call_agent("journal", {"repo": str(tmp_path / "nowhere")})
    assert caught.value.kind == "no_repo" and str(caught.value).startswith("here: ")
    assert session.call_agent("journal", {"repo": host.repo})["entries"] == []


def test_the_fleet_runs_a_task_on_local_sessions_and_counts_their_round_trips(host, books):
    (result,) = run_fleet([host], lambda h, s: patch_host(h, s, books, planner=planner()), LocalSession)
    assert result.status == CHANGED
    assert result.round_trips == 2  # one snapshot, one commit
    assert result.agent == "started"
