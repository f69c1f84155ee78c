"""States are str enums: equal to, printed as and serialized as their text, and a status outside the set fails early."""

from __future__ import annotations

import json

import pytest

from ddops.bench.runs import HostRun, RunStatus
from ddops.fleet import HostStatus, TaskOutcome
from ddops.patching.journal import JournalState, effective_state
from ddops.patching.kinds import PatchState
from ddops.pins import PinState


@pytest.mark.parametrize("member", [HostStatus.UNREACHABLE, PatchState.MODIFIED, JournalState.NOT_APPLIED,
                                    RunStatus.COMPLETED, PinState.OFF])
def test_a_state_reads_as_its_text_in_messages_and_json(member):
    assert member == member.value and str(member) == member.value
    assert f"{member}|{member:>3}" == f"{member.value}|{member.value:>3}"
    assert json.loads(json.dumps({member: [member]})) == {member.value: [member.value]}


def test_a_task_outcome_with_a_status_outside_the_set_is_refused_when_made():
    assert TaskOutcome("changed").status is HostStatus.CHANGED
    with pytest.raises(ValueError):
        TaskOutcome("chnaged")


def test_the_journal_spells_not_applied_one_way_and_modified_wins_over_the_plan():
    assert JournalState.NOT_APPLIED == "not-applied"
    assert effective_state(PatchState.PENDING, JournalState.NOT_APPLIED) is PatchState.PENDING
    assert effective_state(PatchState.APPLIED, JournalState.MODIFIED) is PatchState.MODIFIED


def test_a_run_status_this_ddops_does_not_know_reads_as_unknown():
    run = HostRun.from_state("h", {"status": "exploded", "runs": [{"status": "ok"}]})
    assert run.status is RunStatus.UNKNOWN and not run.terminal and not run.ok


def test_a_task_reports_a_value_that_spells_its_own_json_never_a_dict():
    with pytest.raises(TypeError, match="not a dict"):
        TaskOutcome("ok", "", {"files": []})
