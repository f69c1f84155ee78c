"""The journal: what is applied, what was edited since, and which rollbacks are safe."""

from __future__ import annotations

import pytest

from ddops.errors import DdopsError
from ddops.patching.journal import (JOURNAL_APPLIED, MODIFIED, NOT_APPLIED, active_applications, effective_state,
                                    last_written, modified_files, patch_state, plan_rollback)
from tests.unit.test_agent import ORIGINAL, PATCHED, PATCHED_AGAIN, change, commit_payload, ok, sha


def apply(patch: str, file: str, before: str, after: str) -> dict:
    return {"event": "apply", "patch": patch, "file": file, "before": before, "after": after,
            "time": "2025-01-01T00:00:00Z", "id": f"{patch}@{file}"}


def rollback(patch: str | None, file: str, before: str, after: str) -> dict:
    return {"event": "rollback", "patch": patch, "file": file, "before": before, "after": after, "time": "t"}


# ddtree.py: s0 -hybrid-> s1 -crop-> s2 ; dflash.py: d0 -hybrid-> d1 -cpu-> d2
JOURNAL = [
    apply("hybrid-cache", "ddtree.py", "s0", "s1"),
    apply("hybrid-cache", "dflash.py", "d0", "d1"),
    apply("crop-relative", "ddtree.py", "s1", "s2"),
    apply("cpu-timing", "dflash.py", "d1", "d2"),
]
AS_LEFT = {"ddtree.py": "s2", "dflash.py": "d2"}


def test_active_applications_are_the_applies_not_rolled_back():
    assert [(a.patch, a.file) for a in active_applications(JOURNAL)] == [
        ("hybrid-cache", "ddtree.py"), ("hybrid-cache", "dflash.py"), ("crop-relative", "ddtree.py"),
        ("cpu-timing", "dflash.py")]
    later = JOURNAL + [rollback("cpu-timing", "dflash.py", "d2", "d1")]
    assert ("cpu-timing", "dflash.py") not in [(a.patch, a.file) for a in active_applications(later)]
    reverted = JOURNAL + [{"event": "revert", "file": "ddtree.py", "before": "s2", "after": "s0"}]
    assert [a.file for a in active_applications(reverted)] == ["dflash.py", "dflash.py"]


def test_a_reapplied_patch_is_active_again():
    journal = JOURNAL + [rollback("cpu-timing", "dflash.py", "d2", "d1"), apply("cpu-timing", "dflash.py", "d1", "d2")]
    assert ("cpu-timing", "dflash.py") in [(a.patch, a.file) for a in active_applications(journal)]


def test_patch_state_says_modified_when_the_file_changed_since_ddops_wrote_it():
    assert patch_state(JOURNAL, "crop-relative", "ddtree.py", "s2") == JOURNAL_APPLIED
    assert patch_state(JOURNAL, "hybrid-cache", "ddtree.py", "s2") == JOURNAL_APPLIED
    assert patch_state(JOURNAL, "crop-relative", "ddtree.py", "edited") == MODIFIED
    assert patch_state(JOURNAL, "cpu-timing", "ddtree.py", "s2") == NOT_APPLIED
    assert effective_state("applied", MODIFIED) == MODIFIED
    assert effective_state("pending", NOT_APPLIED) == "pending"


def test_last_written_follows_rollbacks_too():
    journal = JOURNAL + [rollback("crop-relative", "ddtree.py", "s2", "s1")]
    assert last_written(journal, "ddtree.py") == "s1"
    assert modified_files(journal, {"ddtree.py": "s1", "dflash.py": "x"}) == {"dflash.py": ("d2", "x")}


def test_rolling_back_everything_restores_each_file_to_before_its_oldest_application():
    plan = plan_rollback(JOURNAL, AS_LEFT)
    assert plan.ok and plan.not_applied == ()
    by_file = {r.file: r for r in plan.restores}
    assert by_file["ddtree.py"].restore == "s0"
    assert by_file["ddtree.py"].patches == ("crop-relative", "hybrid-cache")  # newest first
    assert by_file["dflash.py"].restore == "d0"
    assert set(plan.patches) == {"hybrid-cache", "crop-relative", "cpu-timing"}


def test_rolling_back_the_newest_patch_restores_the_state_after_the_one_before():
    plan = plan_rollback(JOURNAL, AS_LEFT, ["crop-relative"])
    assert plan.ok
    [restore] = plan.restores
    assert (restore.file, restore.restore, restore.expected, restore.current) == ("ddtree.py", "s1", "s2", "s2")


def test_rollback_refuses_a_patch_under_a_later_one_and_names_the_later_patch():
    plan = plan_rollback(JOURNAL, AS_LEFT, ["hybrid-cache"])
    assert not plan.ok and plan.restores == ()
    blocking = {(r.file, r.blocking_patch) for r in plan.refused}
    assert ("ddtree.py", "crop-relative") in blocking or ("dflash.py", "cpu-timing") in blocking
    assert all(r.patch == "hybrid-cache" for r in plan.refused)
    assert "roll back" in plan.refused[0].reason


def test_rollback_of_a_patch_is_all_files_or_none():
    # cpu-timing is above hybrid-cache in dflash.py only; hybrid-cache must not be undone in ddtree.py alone.
    plan = plan_rollback(JOURNAL, AS_LEFT, ["hybrid-cache", "crop-relative"])
    assert [r.file for r in plan.restores] == ["ddtree.py"]
    assert plan.restores[0].patches == ("crop-relative",)
    assert [(r.patch, r.blocking_patch) for r in plan.refused] == [("hybrid-cache", "cpu-timing")]


def test_rollback_refuses_when_file_was_edited_after_patch():
    plan = plan_rollback(JOURNAL, {"ddtree.py": "edited", "dflash.py": "d2"}, ["crop-relative"])
    assert not plan.ok and plan.restores == ()
    assert "ddtree.py changed since ddops wrote it" in plan.refused[0].reason
    assert "--force" in plan.refused[0].reason


def test_forced_rollback_over_an_edit_saves_it_first():
    plan = plan_rollback(JOURNAL, {"ddtree.py": "edited", "dflash.py": "d2"}, ["crop-relative"], force=True)
    assert plan.ok
    [restore] = plan.restores
    assert restore.save_foreign and restore.modified and restore.restore == "s1"


def carry_out(repo, plan, force=False) -> list:
    """The agent's rollback of `plan`, sent as rollback_host sends it; the journal it leaves."""
    ok("rollback", {"repo": str(repo), "actor": "alice@laptop", "ddops_version": "0.1.0", "lock_timeout": 2,
                    "restores": [{"path": r.file, "patch_ids": list(r.patches), "expected_sha256": r.expected,
                                  "restore_sha256": r.restore, "force": force} for r in plan.restores]})
    return ok("journal", {"repo": str(repo)})["entries"]


def stacked(repo) -> list:
    """ddtree.py patched twice by the agent (hybrid-cache, then crop-relative over it); the journal it wrote."""
    (repo / "ddtree.py").write_bytes(ORIGINAL)
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED, ["hybrid-cache"])))
    ok("commit", commit_payload(repo, change("ddtree.py", PATCHED, PATCHED_AGAIN, ["crop-relative"])))
    return ok("journal", {"repo": str(repo)})["entries"]


def test_the_journal_the_agent_leaves_after_a_forced_rollback_over_an_edit_says_not_applied(tmp_path):
    entries = stacked(tmp_path)
    (tmp_path / "ddtree.py").write_bytes(b"edited = True\n")
    plan = plan_rollback(entries, {"ddtree.py": sha(PATCHED_AGAIN)}, ["crop-relative"], force=True)
    after = carry_out(tmp_path, plan, force=True)
    assert [e["event"] for e in after[len(entries):]] == ["save-foreign", "rollback"]
    assert (tmp_path / "ddtree.py").read_bytes() == PATCHED
    assert patch_state(after, "crop-relative", "ddtree.py", sha(PATCHED)) == NOT_APPLIED
    assert patch_state(after, "hybrid-cache", "ddtree.py", sha(PATCHED)) == JOURNAL_APPLIED


def test_the_journal_the_agent_leaves_after_rolling_back_stacked_patches_has_nothing_active(tmp_path):
    entries = stacked(tmp_path)
    plan = plan_rollback(entries, {"ddtree.py": sha(PATCHED_AGAIN)})
    assert plan.restores[0].patches == ("crop-relative", "hybrid-cache")
    after = carry_out(tmp_path, plan)
    assert (tmp_path / "ddtree.py").read_bytes() == ORIGINAL
    assert active_applications(after) == []
    assert last_written(after, "ddtree.py") == sha(ORIGINAL)


def test_a_missing_file_is_refused_unless_forced_and_then_nothing_is_saved():
    plan = plan_rollback(JOURNAL, {"dflash.py": "d2"}, ["crop-relative"])
    assert not plan.ok and "ddtree.py is missing" in plan.refused[0].reason
    forced = plan_rollback(JOURNAL, {"dflash.py": "d2"}, ["crop-relative"], force=True)
    assert forced.ok and not forced.restores[0].save_foreign


def test_asking_for_a_patch_that_is_not_applied_says_so():
    plan = plan_rollback(JOURNAL, AS_LEFT, ["nope"])
    assert plan.ok and plan.restores == () and plan.not_applied == ("nope",)


def test_a_malformed_entry_is_an_error_and_unknown_events_are_skipped():
    with pytest.raises(DdopsError, match="journal entry 1"):
        active_applications([{"event": "apply", "file": "x"}])
    assert active_applications([{"event": "lock", "file": "x"}] + JOURNAL[:1])[0].patch == "hybrid-cache"


def test_an_entry_of_a_newer_ddops_without_a_file_is_skipped_and_a_malformed_one_names_its_number():
    newer = [{"event": "x-from-a-newer-ddops", "id": "x"}, {"event": "x-other", "patch": ["a"], "file": 3}]
    assert [a.patch for a in active_applications(newer + JOURNAL[:1])] == ["hybrid-cache"]
    for bad, says in ((dict(JOURNAL[0], patch=["hybrid-cache"]), "`patch` must be a string or null, not list"),
                      (dict(JOURNAL[0], before={"sha": 1}), "`before` must be a string or null, not dict"),
                      ({"event": "rollback", "patch": "p"}, "a rollback entry needs `file`"),
                      ({"event": None, "file": "x"}, "`event` must be a non-empty string"),
                      (["apply"], "not an object")):
        with pytest.raises(DdopsError, match="^journal entry 2: " + says.replace("(", r"\(").replace(")", r"\)")):
            active_applications([JOURNAL[1], bad])
        with pytest.raises(DdopsError, match="^journal entry 2"):
            plan_rollback([JOURNAL[1], bad], AS_LEFT)
