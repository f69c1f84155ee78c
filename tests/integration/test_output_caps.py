"""Over SSH, an agent answer past DDOPS_MAX_AGENT_ANSWER and a command's output past DDOPS_MAX_COMMAND_OUTPUT end
that host's call with one line, never gathered whole; the other hosts and later calls are unharmed."""

from __future__ import annotations

import pytest

from ddops.errors import TransportError
from ddops.inventory import load_inventory
from ddops.transport import Connector
from tests.conftest import requires_sshd, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]


def test_a_command_printing_past_the_cap_is_cut_off_and_the_connection_goes_on(make_testbed, monkeypatch):
    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    host = inv.hosts[0]
    monkeypatch.setenv("DDOPS_MAX_COMMAND_OUTPUT", "100000")
    with Connector(inv.known_hosts).connect(host) as session:
        assert len(session.run("head -c 100000 /dev/zero").stdout) == 100000  # at the cap: kept whole
        # Cut off while the host is still sending, again and again: closing that channel must never take the
        # connection down with it (paramiko's per-channel select pipe once raced the transport thread there).
        for _ in range(10):
            with pytest.raises(TransportError) as caught:
                session.run("head -c 5000000 /dev/zero")
            assert str(caught.value) == (
                f"{host.name}: the command sent more than 100000 bytes of output: refused (cut off)")
            assert session.run("echo still here").stdout == "still here\n"


def test_an_agent_answer_past_the_cap_is_cut_off_and_the_next_call_gets_a_fresh_agent(make_testbed, monkeypatch):
    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    host = inv.hosts[0]
    with Connector(inv.known_hosts).connect(host) as session:
        monkeypatch.setenv("DDOPS_MAX_AGENT_ANSWER", "16")
        with pytest.raises(TransportError) as caught:
            session.call_agent("journal", {"repo": host.repo})
        assert str(caught.value) == f"{host.name}: the agent sent more than 16 bytes of output: refused (cut off)"
        monkeypatch.delenv("DDOPS_MAX_AGENT_ANSWER")
        assert session.call_agent("journal", {"repo": host.repo}) == {"entries": [], "corrupt": []}


def test_status_fails_each_host_whose_answer_is_past_the_cap_with_one_line(make_testbed):
    bed = make_testbed(2)
    code, doc = run_ddops_json("status", "--all", inventory=bed.inventory_path, env={"DDOPS_MAX_AGENT_ANSWER": "16"})
    assert code == 1, doc
    hosts = doc["hosts"]
    assert {(h["host"], h["status"], h["message"]) for h in hosts} == {
        (name, "failed", "the agent sent more than 16 bytes of output: refused (cut off)")
        for name in ("host1", "host2")}
