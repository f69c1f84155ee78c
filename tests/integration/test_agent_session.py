"""A session keeps one agent process for all its calls, over real sshd hosts."""

from __future__ import annotations

import os

import pytest

from ddops.errors import AgentError
from ddops.inventory import load_inventory
from ddops.transport import Connector
from ddops.transport import agent as agent_module
from tests.conftest import requires_sshd, wait_until

pytestmark = [pytest.mark.sshd, requires_sshd]

PROBE = '''
import os
import sys

from ddops_agent.protocol import verb


@verb("probe_test")
def probe_test(payload):
    if payload.get("die"):
        sys.stderr.write("probe: dying on request\\n")
        sys.stderr.flush()
        os._exit(3)
    return {"pid": os.getpid()}
'''


@pytest.fixture
def probe_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    program = agent_module.build_program({"ddops_agent.probe_test": PROBE})
    monkeypatch.setattr(agent_module, "agent_program", lambda: program)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_calls_of_one_session_share_one_agent_process_which_ends_with_the_session(make_testbed, probe_agent):
    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    with Connector(inv.known_hosts).connect(inv.hosts[0]) as session:
        first = session.call_agent("probe_test", {})["pid"]
        assert session.call_agent("journal", {"repo": inv.hosts[0].repo}) == {"entries": [], "corrupt": []}
        assert session.call_agent("probe_test", {})["pid"] == first
        assert session.round_trips == 3  # one per request, the agent's channel opened once
    wait_until(lambda: not alive(first), timeout=10)


def test_an_agent_error_keeps_the_agent_and_a_dead_agent_is_started_again(make_testbed, probe_agent):
    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    with Connector(inv.known_hosts).connect(inv.hosts[0]) as session:
        first = session.call_agent("probe_test", {})["pid"]
        with pytest.raises(AgentError) as refused:
            session.call_agent("snapshot", {"repo": "/nonexistent/repo", "files": ["a.py"]})
        assert refused.value.kind == "no_repo"
        assert session.call_agent("probe_test", {})["pid"] == first
        with pytest.raises(AgentError, match="exit 3"):
            session.call_agent("probe_test", {"die": True})
        second = session.call_agent("probe_test", {})["pid"]
        assert second != first and alive(second)


def test_each_session_starts_its_own_agent(make_testbed, probe_agent):
    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    connector = Connector(inv.known_hosts)
    pids = set()
    for _ in range(2):
        with connector.connect(inv.hosts[0]) as session:
            pids.add(session.call_agent("probe_test", {})["pid"])
    assert len(pids) == 2 and os.getpid() not in pids
