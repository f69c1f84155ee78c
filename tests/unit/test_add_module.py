"""add_module: a playbook adds one whole Python module file to the repo, planned, committed, journalled and rolled
back like an edit, with "absent" as the file's state before it (the contract in the playbooks README)."""

from __future__ import annotations

import base64
import hashlib
import shutil
import textwrap
from pathlib import Path

import pytest

from ddops.errors import PlaybookError
from ddops.fleet import CHANGED, DRIFTED, FAILED, OK
from ddops.patching import journal as jr
from ddops.patching.kinds import APPLIED, BLOCKED, PENDING, PatchState
from ddops.patching.plan import Planner, plan_file
from ddops.patching.playbook import fingerprint, load_playbook
from ddops.tasks.patch import patch_host, rollback_host, status_host, verify_host
from tests.unit.test_agent import ACTOR, fails, journal, ok
from tests.unit.test_tasks_patch import host, repo

__all__ = ["host", "repo"]  # fixtures: a copy of mini-DDTree and its local host

FIXTURE = Path(__file__).parent / "fixtures" / "add-module"
PLAYBOOK = FIXTURE / "timing-module.yaml"
MODULE = (FIXTURE / "timing_module.py").read_bytes()
TARGET = "ddops_timing.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def book():
    return load_playbook(PLAYBOOK)


@pytest.fixture
def module_patch(book):
    return book.patch("timing-module")


# -- planning ---------------------------------------------------------------------------------------------------


def test_a_missing_module_is_pending_and_its_diff_is_the_whole_file_from_dev_null(module_patch):
    plan = plan_file(TARGET, None, [module_patch])
    assert plan.state == PENDING and plan.changed
    assert (plan.before_sha, plan.after_sha, plan.new) == (None, sha(MODULE), MODULE)
    lines = MODULE.decode().splitlines()
    assert plan.diff == f"--- /dev/null\n+++ b/{TARGET}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(
        f"+{line}\n" for line in lines)
    assert plan.outcome("timing-module").message == f"{TARGET}: module timing_module.py: would create it"


def test_a_file_holding_the_source_bytes_is_applied_whoever_wrote_it(module_patch):
    plan = plan_file(TARGET, MODULE, [module_patch])
    assert plan.state == APPLIED and not plan.changed and plan.diff == ""


def test_an_older_version_that_ddops_wrote_is_pending_and_replaced(module_patch):
    older = b"def wall_seconds(start):\n    return 0.0\n"
    plan = plan_file(TARGET, older, [module_patch], ours=sha(older))
    assert plan.state == PENDING and plan.new == MODULE and plan.before_sha == sha(older)
    assert "would replace the older version ddops wrote" in plan.outcome("timing-module").message


def test_a_file_ddops_did_not_write_is_drifted_and_never_overwritten(module_patch):
    mine = b"# the user's own ddops_timing.py\n"
    plan = plan_file(TARGET, mine, [module_patch])
    assert plan.state == PatchState.DRIFTED and not plan.changed and plan.new == mine
    assert "a file ddops did not write is there: not overwritten" in plan.outcome("timing-module").message


def test_a_module_edited_since_ddops_wrote_it_is_modified_and_not_overwritten(module_patch):
    edited = MODULE + b"# edited on the host\n"
    plan = plan_file(TARGET, edited, [module_patch], ours=sha(MODULE))
    assert plan.state == PatchState.MODIFIED and not plan.changed
    assert "changed since ddops wrote it: not overwritten" in plan.outcome("timing-module").message


def test_a_patch_requiring_a_refused_module_is_blocked_in_its_own_file(book):
    ddtree = b"import torch\n\nx = 1\n"
    host = Planner().plan_host(book.patches, {TARGET: b"# someone else's\n", "ddtree.py": ddtree})
    assert host.patch_state("timing-module") == PatchState.DRIFTED
    assert host.patch_state("timing-import") == BLOCKED and not host.changed


def test_what_ddops_wrote_there_is_part_of_the_cache_key(module_patch):
    planner, older = Planner(), b"x = 1\n"
    assert planner.plan_file(TARGET, older, [module_patch]).state == PatchState.DRIFTED
    assert planner.plan_file(TARGET, older, [module_patch], ours=sha(older)).state == PENDING
    assert planner.cache_misses == 2


# -- the playbook -----------------------------------------------------------------------------------------------


def playbook_with(tmp_path: Path, transform: str, files: str = "[ddops_timing.py]", source: bytes = MODULE) -> Path:
    (tmp_path / "timing_module.py").write_bytes(source)
    path = tmp_path / "pb.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: pb
        patches:
          - id: mod
            files: {files}
            transform: {transform}
        """))
    return path


@pytest.mark.parametrize("transform, files, source, error", [
    ("{kind: add_module, source: missing.py}", "[ddops_timing.py]", MODULE, "pb.yaml:5: patches[0].transform.source: "
                                                                             "cannot read"),
    ("{kind: add_module, source: sub/timing_module.py}", "[ddops_timing.py]", MODULE, "no folder"),
    ("{kind: add_module, source: timing_module.py}", "[a.py, b.py]", MODULE, "creates exactly one file"),
    ("{kind: add_module, source: timing_module.py}", "[notes.txt]", MODULE, "creates exactly one file"),
    ("{kind: add_module, source: timing_module.py}", "[ddops_timing.py]", b"def f(:\n", "timing_module.py:1: does "
                                                                                        "not compile"),
    ("{kind: add_module}", "[ddops_timing.py]", MODULE, "add_module needs `source:`"),
])
def test_the_source_must_be_a_python_file_beside_the_playbook_that_compiles(tmp_path, transform, files, source, error):
    with pytest.raises(PlaybookError) as info:
        load_playbook(playbook_with(tmp_path, transform, files, source))
    assert error in str(info.value)
    assert str(info.value).startswith(str(tmp_path / "pb.yaml"))


def test_a_new_version_of_the_source_changes_the_patches_fingerprint(tmp_path):
    path = playbook_with(tmp_path, "{kind: add_module, source: timing_module.py}")
    first = load_playbook(path)
    (tmp_path / "timing_module.py").write_bytes(MODULE + b"\nVERSION = 2\n")
    second = load_playbook(path)
    assert second.patches[0].transform.module == MODULE + b"\nVERSION = 2\n"
    assert fingerprint(first.patches) != fingerprint(second.patches)


# -- the journal ------------------------------------------------------------------------------------------------


def entry(event: str, before: str | None, after: str | None, index: int, patch: str = "mod") -> dict:
    return {"event": event, "patch": patch, "file": TARGET, "before": before, "after": after, "id": f"e{index}"}


def test_rolling_back_a_module_replaced_by_a_newer_version_removes_it():
    journal_entries = [entry("apply", None, "a" * 64, 0), entry("apply", "a" * 64, "b" * 64, 1)]
    [application] = jr.active_applications(journal_entries)
    assert (application.before, application.after) == (None, "b" * 64)
    [restore] = jr.plan_rollback(journal_entries, {TARGET: "b" * 64}).restores
    assert (restore.restore, restore.expected) == (None, "b" * 64)


def test_an_apply_over_bytes_the_patch_did_not_write_starts_a_new_application():
    journal_entries = [entry("apply", None, "a" * 64, 0), entry("apply", "c" * 64, "b" * 64, 1)]
    [application] = jr.active_applications(journal_entries)
    assert application.before == "c" * 64


def test_a_removal_is_the_files_last_write():
    journal_entries = [entry("apply", None, "a" * 64, 0), entry("rollback", "a" * 64, None, 1)]
    assert jr.last_written_by_file(journal_entries) == {TARGET: None}
    assert jr.active_applications(journal_entries) == []


# -- the agent --------------------------------------------------------------------------------------------------


@pytest.fixture
def agent_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".git" / "info").mkdir(parents=True)
    return root


def create(path: str = TARGET, data: bytes = MODULE, expected: str | None = None) -> dict:
    return {"path": path, "patch_ids": ["mod"], "expected_sha256": expected,
            "new_content_b64": base64.b64encode(data).decode(), "new_sha256": sha(data)}


def commit(repo: Path, *changes: dict, checks=()) -> dict:
    return {"repo": str(repo), "actor": ACTOR, "changes": list(changes), "post_checks": list(checks),
            "lock_timeout": 2}


def remove(repo: Path, expected: bytes, force: bool = False) -> dict:
    return {"repo": str(repo), "actor": ACTOR, "lock_timeout": 2, "restores": [
        {"path": TARGET, "patch_ids": ["mod"], "expected_sha256": sha(expected), "restore_sha256": None,
         "force": force}]}


def test_the_agent_creates_a_file_expected_absent_and_journals_it_with_no_before(agent_repo):
    assert ok("commit", commit(agent_repo, create()))["written"] == [TARGET]
    assert (agent_repo / TARGET).read_bytes() == MODULE
    [applied] = journal(agent_repo)
    assert (applied["event"], applied["before"], applied["after"]) == ("apply", None, sha(MODULE))
    assert list((agent_repo / ".ddops" / "backups").iterdir()) == []  # nothing was there to back up


def test_a_file_appearing_between_plan_and_commit_is_a_conflict_and_is_left_alone(agent_repo):
    (agent_repo / TARGET).write_bytes(b"# written meanwhile\n")
    error = fails("commit", commit(agent_repo, create()))
    assert error["kind"] == "conflict" and f"{TARGET} changed since it was read" in error["message"]
    assert (agent_repo / TARGET).read_bytes() == b"# written meanwhile\n" and journal(agent_repo) == []


def test_a_module_whose_folder_is_missing_is_refused_before_anything_is_written(agent_repo):
    error = fails("commit", commit(agent_repo, create("tools/ddops_timing.py")))
    assert error["kind"] == "io" and "its folder does not exist" in error["message"]
    assert not (agent_repo / "tools").exists() and journal(agent_repo) == []


def test_a_failed_post_check_removes_the_created_file_again(agent_repo):
    done = ok("commit", commit(agent_repo, create(), checks=[{"name": "no", "command": "false"}]))
    assert done["reverted"] and not (agent_repo / TARGET).exists()
    assert [(e["event"], e["after"]) for e in journal(agent_repo)] == [("apply", sha(MODULE)), ("revert", None)]


def test_rollback_removes_the_file_and_a_second_rollback_finds_it_gone(agent_repo):
    ok("commit", commit(agent_repo, create()))
    assert ok("rollback", remove(agent_repo, MODULE))["restored"] == [TARGET]
    assert not (agent_repo / TARGET).exists()
    assert ok("rollback", remove(agent_repo, MODULE))["unchanged"] == [TARGET]


def test_rollback_refuses_an_edited_module_and_force_saves_the_edit_before_removing_it(agent_repo):
    ok("commit", commit(agent_repo, create()))
    edited = MODULE + b"# edited on the host\n"
    (agent_repo / TARGET).write_bytes(edited)
    refused = ok("rollback", remove(agent_repo, MODULE))["refused"]
    assert refused == [{"path": TARGET, "reason": "modified", "current_sha256": sha(edited)}]
    assert (agent_repo / TARGET).read_bytes() == edited
    forced = ok("rollback", remove(agent_repo, MODULE, force=True))
    assert forced["saved"] == [{"path": TARGET, "sha256": sha(edited)}] and forced["restored"] == [TARGET]
    assert not (agent_repo / TARGET).exists()
    assert (agent_repo / ".ddops" / "backups" / sha(edited)).read_bytes() == edited


def test_a_snapshots_live_entries_keep_where_a_replaced_module_began(agent_repo):
    newer = MODULE + b"\nVERSION = 2\n"
    ok("commit", commit(agent_repo, create()))
    ok("commit", commit(agent_repo, create(data=newer, expected=sha(MODULE))))
    assert (agent_repo / ".ddops" / "backups" / sha(MODULE)).read_bytes() == MODULE  # the older version, backed up
    live = ok("snapshot", {"repo": str(agent_repo), "files": [TARGET]})["journal"]
    [application] = jr.active_applications(live)
    assert (application.before, application.after) == (None, sha(newer))


# -- the tasks, on the agent as a local subprocess ----------------------------------------------------------------


def tree(root: Path) -> dict[str, bytes]:
    """Every file of the checkout but ddops' state and git's."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in (".ddops", ".git")}


def test_check_patch_status_verify_and_rollback_treat_the_module_like_any_patch(host, session, book, repo):
    before = tree(repo)
    planned = patch_host(host, session, [book], planner=Planner(), check=True)
    assert planned.status == CHANGED and f"--- /dev/null\n+++ b/{TARGET}\n" in planned.report.diff
    assert tree(repo) == before
    assert status_host(host, session, [book]).report.patches == {"timing-module": PENDING,
                                                                  "timing-import": PENDING}
    assert verify_host(host, session, [book]).status == FAILED  # the module is not there yet

    applied = patch_host(host, session, [book], planner=Planner())
    assert applied.status == CHANGED and set(applied.report.written) == {TARGET, "ddtree.py"}
    assert (repo / TARGET).read_bytes() == MODULE and "import ddops_timing\n" in (repo / "ddtree.py").read_text()
    assert status_host(host, session, [book]).report.patches == {"timing-module": APPLIED,
                                                                  "timing-import": APPLIED}
    assert verify_host(host, session, [book]).status == OK
    assert patch_host(host, session, [book], planner=Planner()).status == OK

    undone = rollback_host(host, session)
    assert undone.status == CHANGED, undone.message
    assert tree(repo) == before


def test_an_edited_module_is_modified_never_overwritten_and_rolled_back_only_by_force(host, session, book, repo):
    assert patch_host(host, session, [book], planner=Planner()).status == CHANGED
    with open(repo / TARGET, "ab") as fh:
        fh.write(b"# edited on the host\n")
    edited = (repo / TARGET).read_bytes()
    status = status_host(host, session, [book])
    assert status.status == DRIFTED and status.report.patches["timing-module"] == PatchState.MODIFIED
    assert status.report.patches["timing-import"] == APPLIED  # what requires it is still in place
    again = patch_host(host, session, [book], planner=Planner())
    assert again.status == DRIFTED and again.message.startswith("nothing written: ddops_timing.py: timing-module "
                                                                 "modified")
    assert (repo / TARGET).read_bytes() == edited
    refused = rollback_host(host, session)
    assert refused.status == FAILED and (repo / TARGET).read_bytes() == edited
    forced = rollback_host(host, session, force=True)
    assert forced.status == CHANGED and not (repo / TARGET).exists()
    assert forced.report.saved[0].sha256 == sha(edited)


def test_a_file_someone_else_put_at_the_modules_path_is_left_and_nothing_is_written(host, session, book, repo):
    (repo / TARGET).write_bytes(b"# the user's own\n")
    before = tree(repo)
    outcome = patch_host(host, session, [book], planner=Planner())
    assert outcome.status == FAILED and "requires timing-module, which is drifted" in outcome.message
    [module] = [f for f in outcome.report.files if f.path == TARGET]
    assert "a file ddops did not write is there: not overwritten" in module.patches[0].message
    assert tree(repo) == before


def test_a_newer_source_replaces_the_version_ddops_wrote_and_rollback_still_removes_it(host, session, repo, tmp_path):
    folder = shutil.copytree(FIXTURE, tmp_path / "playbook")
    assert patch_host(host, session, [load_playbook(folder / PLAYBOOK.name)], planner=Planner()).status == CHANGED
    newer = MODULE + b"\nVERSION = 2\n"
    (folder / "timing_module.py").write_bytes(newer)
    book = load_playbook(folder / PLAYBOOK.name)
    assert status_host(host, session, [book]).report.patches["timing-module"] == PENDING
    replaced = patch_host(host, session, [book], planner=Planner())
    assert replaced.status == CHANGED and replaced.report.written == (TARGET,)
    assert (repo / TARGET).read_bytes() == newer
    assert rollback_host(host, session).status == CHANGED
    assert not (repo / TARGET).exists()
