"""The agent's file safety against a hostile repo (issue 11, items 7, 8, 10, 4): aliased paths, symlinked
directories into .git/, result globs through symlink loops, and a revert that cannot finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddops.transport.agent import agent_program, build_program
from tests.unit.test_agent import (ORIGINAL, PATCHED, PATCHED_AGAIN, change, commit_payload, fails, journal, ok, repo,
                                   run_agent)

__all__ = ["repo"]  # the fixture, imported for these tests


# -- aliased paths (item 7) ----------------------------------------------------------------------------------------


def test_commit_refuses_two_names_of_one_file_through_a_symlinked_directory(repo):
    (repo / "a").mkdir()
    (repo / "a" / "x.py").write_bytes(ORIGINAL)
    (repo / "b").symlink_to("a")
    error = fails("commit", commit_payload(repo, change("a/x.py", ORIGINAL, PATCHED),
                                           change("b/x.py", ORIGINAL, PATCHED_AGAIN)))
    assert error["kind"] == "unsafe_path" and "a/x.py and b/x.py are the same file" in error["message"]
    assert (repo / "a" / "x.py").read_bytes() == ORIGINAL
    assert journal(repo) == []


def test_commit_refuses_two_hard_links_to_one_file(repo):
    (repo / "twin.py").write_bytes(ORIGINAL)
    os.link(repo / "twin.py", repo / "ddtree_copy.py")
    error = fails("commit", commit_payload(repo, change("twin.py", ORIGINAL, PATCHED),
                                           change("ddtree_copy.py", ORIGINAL, PATCHED)))
    assert error["kind"] == "unsafe_path"
    assert (repo / "twin.py").read_bytes() == ORIGINAL


# A concurrent writer, simulated exactly between the commit's first compare-and-swap and its second file's write:
# the hook edits other.py when the commit backs it up (what the commit does right before writing it).
RACE_MODULE = '''
import ddops_agent.patch_verbs as patch_verbs

real_store_backup = patch_verbs.store_backup


def store_backup(state, data, sha):
    real_store_backup(state, data, sha)
    other = patch_verbs.os.path.join(patch_verbs.os.path.dirname(state), "other.py")
    with open(other, "rb") as handle:
        current = handle.read()
    if current == data:
        with open(other, "ab") as handle:
            handle.write(b"# edited by someone else meanwhile\\n")


patch_verbs.store_backup = store_backup
'''


def test_commit_checks_each_file_again_right_before_writing_it_and_puts_back_the_others(repo):
    (repo / "other.py").write_bytes(ORIGINAL)
    program = build_program({"ddops_agent.race": RACE_MODULE})
    response = run_agent("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED),
                                                  change("other.py", ORIGINAL, PATCHED)), program=program)
    assert not response["ok"] and response["error"]["kind"] == "conflict", response
    assert "other.py changed while the commit ran" in response["error"]["message"]
    # ddtree.py was written, then put back; the foreign edit of other.py is left alone, never overwritten.
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL
    assert (repo / "other.py").read_bytes() == ORIGINAL + b"# edited by someone else meanwhile\n"
    assert [(e["event"], e["file"]) for e in journal(repo)] == [("apply", "ddtree.py"), ("revert", "ddtree.py")]


# -- the .git/ and .ddops/ guard on resolved paths (item 8) ---------------------------------------------------------


@pytest.mark.parametrize("link_to, path", [(".git", "lnk/config"), (".ddops", "lnk/journal.jsonl"),
                                           (".git/info", "lnk/exclude"), ("sub/.git", "lnk/config")])
def test_commit_refuses_a_symlinked_directory_into_git_or_ddops_state(repo, link_to, path):
    (repo / ".ddops").mkdir(exist_ok=True)
    (repo / ".ddops" / "journal.jsonl").write_bytes(b"")
    (repo / "sub" / ".git").mkdir(parents=True)
    target = repo / link_to / Path(path).name
    target.write_bytes(ORIGINAL)
    (repo / "lnk").symlink_to(link_to)
    error = fails("commit", commit_payload(repo, change(path, ORIGINAL, b"[core]\n\tfsmonitor = touch /tmp/owned\n")))
    assert error["kind"] == "unsafe_path" and "resolves to" in error["message"], error
    assert target.read_bytes() == ORIGINAL


def test_snapshot_does_not_read_git_config_through_a_symlinked_directory(repo):
    (repo / ".git" / "config").write_bytes(b"[core]\n")
    (repo / "lnk").symlink_to(".git")
    record = ok("snapshot", {"repo": str(repo), "files": ["lnk/config"]})["files"]["lnk/config"]
    assert record["error"]["kind"] == "unsafe_path" and record["content_b64"] is None


# -- results globs and request deadlines (item 10) ----------------------------------------------------------------


def run_request(request: dict, *, program=None, timeout: float = 20) -> tuple[dict, float]:
    """(the agent's answer, seconds it took) for a raw request document."""
    program = agent_program() if program is None else program
    started = time.monotonic()
    done = subprocess.run(program.argv(sys.executable, cache=False),
                          input=program.bundle + json.dumps(request).encode(), capture_output=True, timeout=timeout)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout.decode().splitlines()[0]), time.monotonic() - started


@pytest.fixture
def run_results(repo: Path) -> Path:
    """A finished bench run's results folder (run id r1), holding a.pt and sub/b.pt."""
    results = repo / ".ddops" / "runs" / "r1" / "results"
    (results / "sub").mkdir(parents=True)
    (results / "a.pt").write_bytes(b"abc")
    (results / "sub" / "b.pt").write_bytes(b"def")
    return results


def test_a_results_glob_does_not_follow_symlink_loops_and_answers_at_once(repo, run_results):
    # Two links to their own folder: glob's `**` followed them into 2**depth paths and never answered.
    (run_results / "loop1").symlink_to(".")
    (run_results / "sub" / "loop2").symlink_to("..")
    answer, seconds = run_request({"verb": "bench_files", "deadline": 15,
                                   "payload": {"repo": str(repo), "run_id": "r1", "pattern": "**/*.pt"}})
    assert answer["ok"], answer
    assert [f["path"] for f in answer["result"]["files"]] == ["a.pt", "sub/b.pt"]
    # Passed by, not followed: nothing below them could be collected, and they fail nothing.
    assert [r["path"] for r in answer["result"]["skipped"]] == ["loop1", "sub/loop2"]
    assert answer["result"]["refused"] == []
    assert seconds < 10


def test_a_results_glob_matches_as_glob_does_without_leaving_the_result_dir(repo, run_results, tmp_path):
    (run_results / ".hidden.pt").write_bytes(b"x")
    (run_results / "sub" / "deeper").mkdir()
    (run_results / "sub" / "deeper" / "c.pt").write_bytes(b"c")
    (run_results / "notes.txt").write_bytes(b"n")
    (tmp_path / "outside.pt").write_bytes(b"o")
    (run_results / "out.pt").symlink_to(tmp_path / "outside.pt")
    for pattern, files in [("*.pt", ["a.pt"]), ("**/*.pt", ["a.pt", "sub/b.pt", "sub/deeper/c.pt"]),
                           ("sub/*.pt", ["sub/b.pt"]), ("sub/**/*.pt", ["sub/b.pt", "sub/deeper/c.pt"]),
                           ("**", ["a.pt", "notes.txt", "sub/b.pt", "sub/deeper/c.pt"])]:
        listing = ok("bench_files", {"repo": str(repo), "run_id": "r1", "pattern": pattern})
        assert [f["path"] for f in listing["files"]] == files, pattern
    assert [r["path"] for r in listing["refused"]] == ["out.pt"]


SLOW_MODULE = '''
import time

from ddops_agent.protocol import verb


@verb("spin_test")
def spin_test(payload):
    while True:  # a verb that would never answer: a hostile glob, a hung filesystem
        sum(range(1000))
'''


def test_every_request_is_stopped_at_its_deadline_and_answered_as_timeout():
    program = build_program({"ddops_agent.spin": SLOW_MODULE})
    answer, seconds = run_request({"verb": "spin_test", "payload": {}, "deadline": 1}, program=program)
    assert answer == {"ok": False, "error": {"kind": "timeout", "message": answer["error"]["message"]}}
    assert "deadline (1s)" in answer["error"]["message"] and seconds < 8


def test_the_controller_sends_its_deadline_with_every_request(repo):
    from ddops.inventory import Host
    from ddops.transport.local import LocalSession

    session = LocalSession(Host(name="local", address="127.0.0.1", repo=str(repo)))
    try:
        # A post check that outlives the call's timeout: the agent cuts it at the deadline and reverts, answering
        # before the controller gives up, instead of leaving a commit running behind a "timed out".
        reply = session.call_agent("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED),
                                                            checks=[{"name": "slow", "command": "sleep 30",
                                                                     "timeout": 60}]), timeout=20)
    finally:
        session.close()
    assert reply["reverted"] is True and reply["checks"][0]["timed_out"] is True
    assert "deadline" in reply["checks"][0]["output"]
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL


# -- a revert that cannot finish (item 4) --------------------------------------------------------------------------


def test_a_revert_that_fails_names_what_each_file_holds_now(repo):
    (repo / "dflash.py").write_bytes(ORIGINAL)
    # The check fails and takes the backups with it: the originals cannot be put back.
    error = fails("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED),
                                           change("dflash.py", ORIGINAL, PATCHED_AGAIN),
                                           checks=[{"name": "vandal", "command": "rm -rf .ddops/backups; exit 3"}]))
    assert error["kind"] == "revert_failed", error
    assert error["message"].startswith("post check vandal failed; putting the originals back failed (backup ")
    assert error["message"].endswith(": ddtree.py still patched, dflash.py still patched")
    # What the journal says agrees with the files: both applied, nothing claims a revert.
    assert [(e["event"], e["file"]) for e in journal(repo)] == [("apply", "ddtree.py"), ("apply", "dflash.py")]
