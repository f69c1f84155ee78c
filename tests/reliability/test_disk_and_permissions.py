"""A full disk, read-only files, files of another user, a permissive umask: ddops fails cleanly with a message naming
the host and the file, changes nothing it cannot finish, and keeps every file's mode and owner."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import requires_sshd
from tests.reliability.conftest import FILES, as_host, sha

pytestmark = [pytest.mark.sshd, requires_sshd]

NOBODY = 65534
PAGE = 4096


# -- a full disk --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full(make_fleet):
    """One host whose repo is a 1 MiB tmpfs, mounted inside that host's own mount namespace only."""
    fleet = make_fleet(1)
    host = fleet.bed.host("host1")
    stage = Path(host.dir) / "tmpfs"
    stage.mkdir()
    script = 'mount -t tmpfs -o size=1m,mode=0755 ddops-full "$1" && cp -a "$2"/. "$1"/ && mount --bind "$1" "$2"'
    subprocess.run(["nsenter", "--mount", f"--target={host.pid()}", "sh", "-c", script, "sh", str(stage),
                    fleet.bed.repo_path], check=True, capture_output=True)
    # The test reads and fills it through the host's own view of its filesystem.
    fleet.repo_dirs["host1"] = Path(f"/proc/{host.pid()}/root{fleet.bed.repo_path}")
    assert os.statvfs(fleet.repo("host1")).f_blocks * os.statvfs(fleet.repo("host1")).f_frsize <= 1 << 20
    return fleet


def fill(repo: Path, leave_pages: int) -> None:
    """Fill the repo's filesystem until exactly `leave_pages` pages are free."""
    filler = repo / ".filler"
    if filler.exists():
        filler.unlink()
    st = os.statvfs(repo)
    with open(filler, "wb") as fh:
        fh.write(b"\0" * (st.f_bavail * st.f_frsize - leave_pages * PAGE))


def fresh(fleet, repo: Path) -> None:
    """Back to the original files and no ddops state, on the tmpfs."""
    shutil.rmtree(repo / ".ddops", ignore_errors=True)
    for f in FILES:
        shutil.copy2(fleet.seed / f, repo / f)


def test_a_full_disk_at_every_step_of_a_commit_fails_cleanly_with_the_originals_intact(full):
    repo = full.repo("host1")
    failures: dict[int, str] = {}
    leave = 0
    while True:
        fresh(full, repo)
        fill(repo, leave)
        result = full.patch("host1")["host1"]
        states = full.assert_nothing_lost("host1")["host1"]
        if result.status == "changed":
            assert states == {"dflash.py": "new", "ddtree.py": "new"}
            break
        assert result.status == "failed" and "No space left on device" in result.message, result.message
        assert "\n" not in result.message and not result.message.startswith("host1")  # shown beside the host
        assert states == {"dflash.py": "old", "ddtree.py": "old"}, (leave, result.message)
        failures[leave] = result.message
        needs = re.search(r"needs about (\d+) KiB", result.message)
        # Below what ddops holds in reserve every step fails alike: skip to where the writes themselves run out.
        leave = max(leave + 1, int(needs.group(1)) * 1024 // PAGE - 1) if needs else leave + 1
        assert leave < 200, failures
    # The sweep ran out of room in every kind of write: the reserve, backups, pending notes, the target files.
    named = " ".join(failures.values())
    assert "needs about" in named and "/.ddops/backups/" in named and "/.ddops/pending/" in named
    assert f"{full.bed.repo_path}/dflash.py" in named and f"{full.bed.repo_path}/ddtree.py" in named

    # A rollback on a full disk fails for each file it cannot write, leaving it as it was; then it converges.
    fill(repo, 0)
    result = full.rollback("host1")["host1"]
    assert result.status == "failed" and "No space left on device" in result.message, result.message
    assert full.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}
    (repo / ".filler").unlink()
    assert full.rollback("host1")["host1"].status == "changed"
    full.assert_original("host1")
    full.assert_nothing_lost("host1")
    full.assert_clean("host1")


class WithPostCheck:
    """A session whose commits carry one more post check (as a playbook's `run:` check would)."""

    def __init__(self, session, check: dict) -> None:
        self.session, self.check = session, check

    def call_agent(self, verb: str, payload: dict, **kwargs):
        if verb == "commit":
            payload = {**payload, "post_checks": [*payload["post_checks"], self.check]}
        return self.session.call_agent(verb, payload, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.session, name)


def filling_check(command: str = "") -> dict:
    """A post check that fills the disk (after `command`), then fails."""
    return {"name": "fills-the-disk", "timeout": 30,
            "command": f"{command} cat /dev/zero > .check-filler 2>/dev/null; exit 1"}


def test_a_post_check_that_fills_the_disk_cannot_stop_the_revert(full):
    repo = full.repo("host1")
    fresh(full, repo)
    result = full.patch("host1", wrap=lambda host, session: WithPostCheck(session, filling_check()))["host1"]
    assert (repo / ".check-filler").stat().st_size > 0  # the check did fill the disk
    (repo / ".check-filler").unlink()
    # The room held back for the originals was still held while the check ran: they are back.
    assert result.status == "failed" and "check failed after writing, originals restored" in result.message, \
        result.message
    assert full.assert_nothing_lost("host1")["host1"] == {"dflash.py": "old", "ddtree.py": "old"}
    assert full.patch("host1")["host1"].status == "changed"
    assert full.rollback("host1")["host1"].status == "changed"
    full.assert_clean("host1")


def test_a_revert_that_still_fails_says_each_file_is_still_patched_and_fails_the_host(full):
    repo = full.repo("host1")
    fresh(full, repo)
    # The check also frees the reserve itself, so that the disk is full when the originals go back.
    check = filling_check("rm -f .ddops/reserve;")
    result = full.patch("host1", wrap=lambda host, session: WithPostCheck(session, check))["host1"]
    assert result.status == "failed", result.message
    assert "\n" not in result.message and "No space left on device" in result.message, result.message
    assert result.message.endswith(
        ": dflash.py still patched, ddtree.py still patched, model/dflash.py still patched"), result.message
    # Exactly so: both files patched, and journalled as such.
    assert full.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}
    (repo / ".check-filler").unlink()
    assert full.rollback("host1")["host1"].status == "changed"
    full.assert_original("host1")
    full.assert_clean("host1")


# -- permissions, owners, umask -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def perm(make_fleet):
    """One host whose repo path every user can reach (not under /root), and wrappers that run its agent as another
    user or under another umask, through the inventory's `python:`."""
    base = Path(f"/tmp/ddops-reliability-{uuid.uuid4().hex[:8]}")
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    try:
        fleet = make_fleet(1, repo_path=str(base / "ddtree"))
        yield fleet
    finally:
        shutil.rmtree(base, ignore_errors=True)


def python_for_nobody() -> str:
    """A Python interpreter user `nobody` can run (the venv's may live under /root)."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", candidate,
                                "-c", "import json"], capture_output=True, cwd="/")
        if probe.returncode == 0:
            return candidate
    raise AssertionError("no python3 that user nobody can run")


def wrapper(fleet, name: str, as_nobody: bool, umask: str = "000") -> str:
    """A `python:` for the inventory that runs the agent under `umask` (and as nobody)."""
    path = Path(fleet.bed.root).parent / f"{Path(fleet.bed.root).name}-{name}"
    drop = f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups " if as_nobody else ""
    python = python_for_nobody() if as_nobody else sys.executable
    path.write_text(f"#!/bin/sh\numask {umask}\nexec {drop}{python} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def owner_and_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def nothing_changed(fleet, name: str = "host1") -> None:
    fleet.assert_original(name)
    state = fleet.repo(name) / ".ddops"
    assert not (state / "journal.jsonl").exists() and not list(state.glob("backups/*"))


def test_a_read_only_file_is_refused_with_a_clear_error_and_nothing_changes(perm):
    perm.reset()
    (perm.repo("host1") / "ddtree.py").chmod(0o444)
    result = perm.patch("host1")["host1"]  # the agent runs as root, who could write it anyway
    assert result.status == "failed"
    assert result.message.startswith("ddtree.py is read-only (mode 0444, owner root)"), result.message
    nothing_changed(perm)
    (perm.repo("host1") / "ddtree.py").chmod(0o644)
    assert perm.patch("host1")["host1"].status == "changed"


@pytest.mark.parametrize("mode", [0o644, 0o666])
def test_files_of_another_user_are_refused_when_their_owner_could_not_be_kept(perm, mode):
    perm.reset()
    repo = perm.repo("host1")
    for path in [repo, *(repo / ".git").rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)  # nobody may create .ddops/ and rename files here ...
    for f in FILES:
        (repo / f).chmod(mode)  # ... but the files are root's (0666: writable, but a rename would make them nobody's)
    host = as_host(perm.hosts("host1")[0], python=wrapper(perm, "nobody", as_nobody=True))
    result = perm.patch(hosts=[host])["host1"]
    assert result.status == "failed"
    assert re.match(r"dflash\.py belongs to root \(mode 0(644|666)\): nobody could not write it in place",
                    result.message), result.message
    nothing_changed(perm)
    assert all(owner_and_mode(repo / f) == (0, 0, mode) for f in FILES)


def test_a_repo_the_agent_may_not_write_in_is_a_clear_error_naming_the_path(perm):
    perm.reset()
    host = as_host(perm.hosts("host1")[0], python=wrapper(perm, "nobody", as_nobody=True))
    result = perm.patch(hosts=[host])["host1"]
    assert result.status == "failed"
    assert result.message == f"Permission denied: {perm.bed.repo_path}/.ddops", result.message
    perm.assert_original("host1")
    assert not (perm.repo("host1") / ".ddops").exists()


def test_mode_and_owner_survive_patch_rollback_and_a_revert_and_state_stays_private_under_umask_000(perm, tmp_path):
    from ddops.patching.playbook import load_playbooks

    perm.reset()
    repo = perm.repo("host1")
    os.chown(repo / "ddtree.py", NOBODY, NOBODY)
    (repo / "ddtree.py").chmod(0o640)
    (repo / "dflash.py").chmod(0o751)
    before = {f: owner_and_mode(repo / f) for f in FILES}
    host = as_host(perm.hosts("host1")[0], python=wrapper(perm, "umask0", as_nobody=False))

    assert perm.patch(hosts=[host])["host1"].status == "changed"
    assert {f: owner_and_mode(repo / f) for f in FILES} == before
    state = repo / ".ddops"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for private_dir in (state / "backups", state / "pending"):
        assert stat.S_IMODE(private_dir.stat().st_mode) == 0o700
    for private in [state / "journal.jsonl", state / "lock", *state.glob("backups/*")]:
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    for f in FILES:  # a backup is never more readable than its original
        backup = state / "backups" / sha((perm.seed / f).read_bytes())
        assert stat.S_IMODE(backup.stat().st_mode) & ~before[f][2] & 0o444 == 0

    assert perm.rollback(hosts=[host])["host1"].status == "changed"
    perm.assert_original("host1")
    assert {f: owner_and_mode(repo / f) for f in FILES} == before

    # A post check that fails puts the originals back: with their mode and owner too.
    failing = tmp_path / "failing.yaml"
    failing.write_text("name: failing\npatches:\n  - id: failing\n    files: [ddtree.py, dflash.py]\n"
                       "    transform: {kind: text_replace, old: 'import torch', new: 'import torch  # x'}\n"
                       "    checks: [{kind: command, run: 'exit 3'}]\n")
    books = load_playbooks([str(failing)])
    from ddops.tasks.patch import patch_host

    result = perm.run(lambda h, s: patch_host(h, s, books, planner=perm.planner, lock_timeout=5), [host])["host1"]
    assert result.status == "failed" and "originals restored" in result.message, result.message
    perm.assert_original("host1")
    assert {f: owner_and_mode(repo / f) for f in FILES} == before


def test_a_non_root_agent_keeps_its_state_private_under_umask_000_and_restores_its_own_files(perm):
    perm.reset()
    repo = perm.repo("host1")
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    host = as_host(perm.hosts("host1")[0], python=wrapper(perm, "nobody", as_nobody=True))
    assert perm.patch(hosts=[host])["host1"].status == "changed"
    state = repo / ".ddops"
    assert owner_and_mode(state) == (NOBODY, NOBODY, 0o700)
    for private in [state / "journal.jsonl", state / "lock", *state.glob("backups/*")]:
        assert owner_and_mode(private) == (NOBODY, NOBODY, 0o600), private
    assert all(owner_and_mode(repo / f) == (NOBODY, NOBODY, 0o644) for f in FILES)
    assert perm.rollback(hosts=[host])["host1"].status == "changed"
    perm.assert_original("host1")
    assert all(owner_and_mode(repo / f) == (NOBODY, NOBODY, 0o644) for f in FILES)
