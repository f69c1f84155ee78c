"""A commit's answer is waited for as long as the host may take (lock wait and post checks included), and when it
still does not come in time, ddops reads the host and reports what it really holds (issue 11, item 5)."""

from __future__ import annotations

import pytest

from tests.conftest import requires_sshd, wait_until
from tests.reliability.conftest import as_host
from tests.reliability.test_disk_and_permissions import WithPostCheck

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture(scope="module")
def fleet(make_fleet):
    return make_fleet(1)


def test_the_commit_waits_for_its_post_checks_beyond_the_hosts_command_timeout(fleet):
    fleet.reset()
    host = as_host(fleet.hosts("host1")[0], command_timeout=1)
    slow = {"name": "slow-but-fine", "command": "sleep 2.5", "timeout": 30}
    result = fleet.patch(hosts=[host], wrap=lambda h, s: WithPostCheck(s, slow))["host1"]
    # Before: the call gave up after the command timeout (1 s) and said "failed" while the host went on committing.
    assert result.status == "changed", result.message
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}
    assert fleet.rollback("host1")["host1"].status == "changed"


def test_a_commit_answer_that_comes_too_late_reports_what_the_host_really_holds(fleet):
    fleet.reset()
    host = as_host(fleet.hosts("host1")[0], command_timeout=1)
    # The disk stalls for 4 s right after the first file is replaced: the answer cannot come within 1 s + 0.5 s.
    fleet.arm("host1", {"commit": {"renamed": "stall"}})
    result = fleet.patch(hosts=[host], lock_timeout=0.5)["host1"]
    assert result.status == "failed", result.message
    assert "the commit's answer did not come within 1.5s; a commit is still running on the host" in result.message
    assert "so far dflash.py patched, ddtree.py original" in result.message, result.message
    assert result.report.written == ("dflash.py",)
    # The host did go on committing, and finished: ddops status and the invariant agree with the files.
    state = fleet.repo("host1") / ".ddops"
    wait_until(lambda: not (state / "lock.info").exists(), timeout=20)
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}


def test_a_late_answer_of_a_commit_that_finished_meanwhile_is_reported_as_changed(fleet):
    fleet.reset()
    host = as_host(fleet.hosts("host1")[0], command_timeout=1)
    fleet.arm("host1", {"commit": {"renamed": "stall"}})
    # The answer is late (1 s + 2.5 s < the 4 s stall), but ddops then waits up to the lock timeout for the commit
    # still running there to end before it reads the host: it ended, with both files patched and journalled.
    result = fleet.patch(hosts=[host], lock_timeout=2.5)["host1"]
    assert result.status == "changed", result.message
    assert result.message == ("patched dflash.py, ddtree.py, model/dflash.py (the commit's answer did not come within "
                              "3.5s, but the host's files and journal show that it finished)")
    assert fleet.assert_nothing_lost("host1")["host1"] == {"dflash.py": "new", "ddtree.py": "new"}
