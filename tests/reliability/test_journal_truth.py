"""The journal stays true when two controllers race and when its last line is torn (issue 25, items 3 and 8)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import requires_sshd

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture(scope="module")
def fleet(make_fleet):
    return make_fleet(1)


@pytest.fixture
def clean(fleet):
    fleet.reset()
    return fleet


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
    assert status.data["journal_corrupt"][0]["line"] == first_of_last_append + 1

    rolled = fleet.rollback("host1")["host1"]
    assert rolled.status == "changed", rolled.message
    assert last_file in rolled.message
    fleet.assert_original("host1")
