"""The journal stays true when two controllers race and when its last line is torn (issue 25, items 3 and 8)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import requires_sshd

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture(scope="module")
def fleet(make_fleet):
    return make_fleet(1)


class PatchedInBetween:
    """A session whose first `rollback` request is preceded by another controller's `patch` of every playbook:
    the race between a rollback's plan (the journal it read) and its commit."""

    def __init__(self, fleet: Any, session: Any) -> None:
        self.fleet, self.session, self.raced = fleet, session, []

    def call_agent(self, verb: str, payload: dict[str, Any], **kwargs: Any) -> Any:
        if verb == "rollback" and not self.raced:
            self.raced.append(self.fleet.patch("host1")["host1"].status)
        return self.session.call_agent(verb, payload, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def test_a_forced_rollback_racing_another_controllers_patch_plans_again_and_files_and_journal_agree(clean):
    from ddops.tasks.patch import patch_host, rollback_host

    fleet = clean
    one_book = fleet.books[:1]
    first = fleet.run(lambda h, s: patch_host(h, s, one_book, planner=fleet.planner, lock_timeout=5))
    assert first["host1"].status == "changed", first["host1"].message
    wrapped: list[PatchedInBetween] = []

    def racing(host: Any, session: Any) -> PatchedInBetween:
        wrapped.append(PatchedInBetween(fleet, session))
        return wrapped[-1]

    result = fleet.run(lambda h, s: rollback_host(h, s, force=True, lock_timeout=5), wrap=racing)["host1"]

    assert wrapped[0].raced == ["changed"]  # the other controller's patch landed between our plan and our commit
    assert result.status == "changed", result.message
    fleet.assert_original("host1")  # planned again from the journal as it is now: every patch rolled back
    fleet.assert_nothing_lost("host1")


def test_a_torn_last_journal_line_is_shown_by_status_and_rollback_uses_the_backup_it_points_to(clean):
    fleet = clean
    assert fleet.patch("host1")["host1"].status == "changed"
    path = fleet.repo("host1") / ".ddops" / "journal.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    last_file = lines[-1].split('"file": "', 1)[1].split('"', 1)[0]
    first_of_last_append = next(i for i, line in enumerate(lines) if f'"file": "{last_file}"' in line)
    # A power cut during the last append (one write of every entry for that file): its first line cut short
    # after the patch id, the rest never reached the disk.
    torn = lines[first_of_last_append]
    path.write_text("".join(lines[:first_of_last_append]) + torn[:torn.index(', "time"')])

    status = fleet.status("host1")["host1"]
    assert f".ddops/journal.jsonl line {first_of_last_append + 1} torn (read as far as it goes)" in status.message
    assert status.report.journal_corrupt[0]["line"] == first_of_last_append + 1

    rolled = fleet.rollback("host1")["host1"]
    assert rolled.status == "changed", rolled.message
    assert last_file in rolled.message
    fleet.assert_original("host1")


def cut_last_append_before_its_patch_id(fleet, name: str) -> tuple[str, int]:
    """The last append's first line cut short before its patch id, the rest lost: (its file, its line number)."""
    path = fleet.repo(name) / ".ddops" / "journal.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    last_file = lines[-1].split('"file": "', 1)[1].split('"', 1)[0]
    first = next(i for i, line in enumerate(lines) if f'"file": "{last_file}"' in line)
    path.write_text("".join(lines[:first]) + lines[first][:lines[first].index(', "patch"')])
    return last_file, first + 1


def test_a_journal_line_cut_before_its_patch_id_is_still_rolled_back_from_the_backup_it_names(clean):
    # The line holds the file and both hashes, not which patch wrote it: rollback used to leave that file patched
    # and exit 0 ("restored" the others).
    fleet = clean
    assert fleet.patch("host1")["host1"].status == "changed"
    last_file, line = cut_last_append_before_its_patch_id(fleet, "host1")
    assert f"line {line} unreadable (skipped)" in fleet.status("host1")["host1"].message

    rolled = fleet.rollback("host1")["host1"]
    assert rolled.status == "changed", rolled.message
    assert f"{last_file} (its journal line {line} cut before the patch id: restored from the backup it names)" \
        in rolled.message
    fleet.assert_original("host1")
    again = fleet.rollback("host1")["host1"]
    assert (again.status, again.message) == ("ok", "nothing to roll back"), again.message


def test_a_rollback_of_named_patches_fails_on_a_file_whose_journal_line_lost_its_patch_id(clean):
    from ddops.tasks.patch import rollback_host

    fleet = clean
    assert fleet.patch("host1")["host1"].status == "changed"
    last_file, line = cut_last_append_before_its_patch_id(fleet, "host1")
    named = [p.id for b in fleet.books for p in b.patches]
    rolled = fleet.run(lambda h, s: rollback_host(h, s, named, lock_timeout=5))["host1"]
    assert rolled.status == "failed", rolled.message
    assert (f"{last_file}: journal line {line} was cut before its patch id: which patch wrote it is unknown; "
            "`ddops rollback` without naming patches restores it") in rolled.message
    assert (fleet.repo("host1") / last_file).read_bytes() == fleet.patched[last_file]


def test_rollback_check_names_a_file_whose_journal_line_lost_its_patch_id_and_writes_nothing(clean):
    from ddops.tasks.patch import rollback_host

    fleet = clean
    assert fleet.patch("host1")["host1"].status == "changed"
    last_file, _ = cut_last_append_before_its_patch_id(fleet, "host1")
    checked = fleet.run(lambda h, s: rollback_host(h, s, check=True))["host1"]
    assert checked.status == "changed" and last_file in checked.report.restored, checked.message
    assert checked.report.check_mode and (fleet.repo("host1") / last_file).read_bytes() == fleet.patched[last_file]


def seed_long_history(fleet, name: str, pairs: int = 1200) -> bytes:
    """A journal of a host patched and rolled back for months (history.py, a file no playbook touches): over the
    size at which the next commit or rollback compacts it. Returns its bytes."""
    import json

    state = fleet.repo(name) / ".ddops"
    state.mkdir(mode=0o700, exist_ok=True)
    lines = []
    for i in range(pairs):
        for event, before, after in (("apply", "a" * 64, "b" * 64), ("rollback", "b" * 64, "a" * 64)):
            lines.append(json.dumps({"event": event, "patch": "old", "file": "history.py", "before": before,
                                     "after": after, "time": "2025-01-01T00:00:00.000Z", "id": f"{event}-{i}",
                                     "actor": "alice@laptop", "ddops_version": "0.1.0"}, sort_keys=True))
    data = ("\n".join(lines) + "\n").encode()
    path = state / "journal.jsonl"
    path.write_bytes(data)
    path.chmod(0o600)
    return data


@pytest.mark.parametrize("stage", ["compact-planned", "compact-rotated", "compact-written"])
def test_connection_killed_at_each_stage_of_a_journal_compaction_then_patch_converges_and_rollback_restores(
        clean, stage):
    fleet = clean
    old = seed_long_history(fleet, "host1")
    fleet.arm("host1", {"commit": {stage: "kill"}})

    first = fleet.patch("host1")["host1"]
    assert first.status == "unreachable", first.message  # the commit's own work was done; compaction was cut
    assert fleet.assert_nothing_lost("host1")["host1"] == {"ddtree.py": "new", "dflash.py": "new"}
    journal = fleet.repo("host1") / ".ddops" / "journal.jsonl"
    rotated = sorted((fleet.repo("host1") / ".ddops" / "journal-old").glob("*.jsonl")) \
        if (fleet.repo("host1") / ".ddops" / "journal-old").exists() else []
    if stage == "compact-written":
        assert len(journal.read_bytes()) < 16 * 1024 and len(rotated) == 1
    else:
        assert journal.read_bytes().startswith(old)  # still the whole journal

    again = fleet.patch("host1")["host1"]
    assert again.status == "ok" and again.message.startswith("already applied"), again.message
    rolled = fleet.rollback("host1")["host1"]
    assert rolled.status == "changed", rolled.message
    fleet.assert_original("host1")
    fleet.assert_nothing_lost("host1")
    fleet.assert_clean("host1")
    # Compacted by now (the rollback did it if the patch's compaction was cut): one rotated file, which holds every
    # old line, and no name left over from the compaction that was cut off.
    [rotated] = (fleet.repo("host1") / ".ddops" / "journal-old").glob("*.jsonl")
    assert rotated.read_bytes().startswith(old) and len(journal.read_bytes()) < 16 * 1024
