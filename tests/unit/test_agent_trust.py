"""The agent's file safety against a hostile repo (issue 11, items 7, 8, 10, 4): aliased paths, symlinked
directories into .git/, result globs through symlink loops, and a revert that cannot finish."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ddops.transport.agent import build_program
from tests.unit.test_agent import (ORIGINAL, PATCHED, PATCHED_AGAIN, change, commit_payload, fails, journal, ok,
                                   repo, run_agent)

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
import ddops_agent.verbs as verbs

real_store_backup = verbs.store_backup


def store_backup(state, data, sha):
    real_store_backup(state, data, sha)
    other = verbs.os.path.join(verbs.os.path.dirname(state), "other.py")
    with open(other, "rb") as handle:
        current = handle.read()
    if current == data:
        with open(other, "ab") as handle:
            handle.write(b"# edited by someone else meanwhile\\n")


verbs.store_backup = store_backup
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
