"""Faults while ddops creates (patch) or removes (rollback) a module file on a real sshd host: wherever the agent is
killed, the module is there whole or not at all, the journal and `status` agree with the files, a rerun converges,
and rollback leaves the repo as it was. A file that appears between plan and commit is never overwritten."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import REPO_ROOT, requires_sshd
from tests.conftest import testbeds as start_testbeds
from tests.reliability.conftest import Fleet
from tests.reliability.test_faults import CutBefore, assert_cut_off

pytestmark = [pytest.mark.sshd, requires_sshd]

PLAYBOOK = REPO_ROOT / "tests" / "unit" / "fixtures" / "add-module" / "timing-module.yaml"
MODULE = PLAYBOOK.with_name("timing_module.py").read_bytes()
TARGET = "ddops_timing.py"

# The commit writes the module first, then ddtree.py (which imports it); the states each stage leaves.
COMMIT_STAGES = {
    "locked": ("old", "old"),
    "pending": ("old", "old"),
    "temp-written": ("old", "old"),
    "renamed": ("new", "old"),
    "before-journal": ("new", "old"),
    "journalled": ("new", "old"),
    "renamed:ddtree.py": ("new", "new"),
}
# The rollback removes the module first (the oldest application): `renamed` is its removal.
ROLLBACK_STAGES = {"locked": "new", "pending": "new", "renamed": "old", "before-journal": "old"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, seed) -> Any:
    from ddops.patching.plan import Planner
    from ddops.patching.playbook import load_playbook

    with start_testbeds(tmp_path_factory) as start:
        yield Fleet(start(1, seed=seed), seed, [load_playbook(PLAYBOOK)], Planner(), {}, {})


@pytest.fixture(scope="module")
def imported(fleet) -> bytes:
    """ddtree.py with the module imported: the only 'new' it may hold."""
    from ddops.patching.plan import plan_file

    book = fleet.books[0]
    return plan_file("ddtree.py", (fleet.seed / "ddtree.py").read_bytes(), [book.patch("timing-import")]).new


def states(fleet: Fleet, imported: bytes) -> tuple[str, str]:
    """('old' | 'new') for the module and ddtree.py, after asserting that the journal and status say the same."""
    from ddops.patching import journal as jr

    repo = fleet.repo("host1")
    module = repo / TARGET
    assert not module.exists() or module.read_bytes() == MODULE, "the module is torn"
    ddtree = (repo / "ddtree.py").read_bytes()
    assert ddtree in ((fleet.seed / "ddtree.py").read_bytes(), imported), "ddtree.py is torn"
    found = ("new" if module.exists() else "old", "new" if ddtree == imported else "old")
    journal = fleet.agent("host1", "journal", {})
    assert journal["corrupt"] == []
    active = {(a.patch, a.file) for a in jr.active_applications(journal["entries"])}
    assert ((("timing-module", TARGET) in active), (("timing-import", "ddtree.py") in active)) == \
        (found[0] == "new", found[1] == "new"), (found, active)
    status = fleet.status("host1")["host1"]
    want = {"timing-module": "applied" if found[0] == "new" else "pending",
            "timing-import": "applied" if found[1] == "new" else "pending"}
    assert status.report.patches == want, (status.message, status.report.patches)
    return found


def assert_as_seeded(fleet: Fleet) -> None:
    repo = fleet.repo("host1")
    assert not (repo / TARGET).exists()
    assert (repo / "ddtree.py").read_bytes() == (fleet.seed / "ddtree.py").read_bytes()
    fleet.assert_clean("host1")


@pytest.mark.parametrize("stage", list(COMMIT_STAGES))
def test_killed_at_each_stage_of_creating_the_module_then_patch_converges_and_rollback_removes_it(fleet, imported,
                                                                                                   stage):
    fleet.reset("host1")
    fleet.arm("host1", {"commit": {stage: "kill"}})
    assert_cut_off(fleet.patch("host1")["host1"])
    assert states(fleet, imported) == COMMIT_STAGES[stage]

    rerun = fleet.patch("host1")["host1"]
    assert rerun.status == ("ok" if COMMIT_STAGES[stage] == ("new", "new") else "changed"), rerun.message
    assert states(fleet, imported) == ("new", "new")
    assert fleet.rollback("host1")["host1"].status == "changed"
    assert states(fleet, imported) == ("old", "old")
    assert_as_seeded(fleet)


@pytest.mark.parametrize("stage", list(ROLLBACK_STAGES))
def test_killed_at_each_stage_of_removing_the_module_then_rollback_converges(fleet, imported, stage):
    fleet.reset("host1")
    assert fleet.patch("host1")["host1"].status == "changed"
    fleet.arm("host1", {"rollback": {stage: "kill"}})
    assert_cut_off(fleet.rollback("host1")["host1"])
    assert states(fleet, imported) == (ROLLBACK_STAGES[stage], "new")

    rerun = fleet.rollback("host1")["host1"]
    assert rerun.status == "changed", rerun.message
    assert states(fleet, imported) == ("old", "old")
    assert_as_seeded(fleet)
    assert fleet.patch("host1")["host1"].status == "changed"  # and it can be added again


def test_a_file_appearing_between_plan_and_commit_is_left_as_it_is_and_nothing_is_written(fleet, imported):
    fleet.reset("host1")
    theirs = fleet.repo("host1") / TARGET
    appear = lambda host, session: CutBefore(session, "commit", lambda: theirs.write_bytes(b"# theirs\n"))  # noqa: E731
    result = fleet.patch("host1", wrap=appear)["host1"]
    assert result.status == "failed" and "changed since it was read: nothing written" in result.message
    assert theirs.read_bytes() == b"# theirs\n"
    assert (fleet.repo("host1") / "ddtree.py").read_bytes() == (fleet.seed / "ddtree.py").read_bytes()
    assert fleet.agent("host1", "journal", {})["entries"] == []
    again = fleet.patch("host1")["host1"]  # planned again: a file ddops did not write, refused
    assert again.status == "failed" and theirs.read_bytes() == b"# theirs\n"
