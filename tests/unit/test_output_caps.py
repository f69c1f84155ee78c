"""The controller holds a bounded amount of what a host sends: an agent answer past DDOPS_MAX_AGENT_ANSWER and a
command's output past DDOPS_MAX_COMMAND_OUTPUT end that host's call with one line. Here on a `connection: local`
host (the same agent and commands, no sshd); tests/integration/test_output_caps.py does it over SSH."""

from __future__ import annotations

import json

import pytest

from ddops.errors import TransportError, UsageError
from ddops.inventory import load_inventory
from ddops.transport import Connector
from ddops.transport.channel import (DEFAULT_MAX_AGENT_ANSWER, DEFAULT_MAX_COMMAND_OUTPUT, max_agent_answer,
                                     max_command_output)
from tests.conftest import MINI_DDTREE, git_seed, run_ddops_json


@pytest.fixture
def local_inventory(tmp_path):
    checkout = git_seed(MINI_DDTREE, tmp_path / "checkout")
    path = tmp_path / "inventory.yaml"
    path.write_text(f"ssh_config: /dev/null\nknown_hosts: {tmp_path / 'known_hosts'}\n"
                    f"hosts:\n  here: {{connection: local, repo: {json.dumps(str(checkout))}}}\n")
    return path


def test_a_command_printing_past_the_cap_ends_the_call_with_one_line_and_the_session_goes_on(
        local_inventory, monkeypatch):
    inv = load_inventory(local_inventory)
    monkeypatch.setenv("DDOPS_MAX_COMMAND_OUTPUT", "4096")
    with Connector(inv.known_hosts).connect(inv.hosts[0]) as session:
        assert session.run("head -c 4096 /dev/zero").stdout == "\0" * 4096  # at the cap: kept whole
        with pytest.raises(TransportError) as caught:
            session.run("head -c 4097 /dev/zero")
        assert str(caught.value) == "here: the command sent more than 4096 bytes of output: refused (cut off)"
        with pytest.raises(TransportError):  # stderr counts too
            session.run("head -c 3000 /dev/zero; head -c 3000 /dev/zero >&2")
        assert session.run("echo still here").stdout == "still here\n"


def test_an_agent_answer_past_the_cap_ends_the_call_and_the_next_call_starts_a_fresh_agent(
        local_inventory, monkeypatch):
    inv = load_inventory(local_inventory)
    host = inv.hosts[0]
    with Connector(inv.known_hosts).connect(host) as session:
        monkeypatch.setenv("DDOPS_MAX_AGENT_ANSWER", "16")
        with pytest.raises(TransportError) as caught:
            session.call_agent("journal", {"repo": host.repo})
        assert str(caught.value) == "here: the agent sent more than 16 bytes of output: refused (cut off)"
        monkeypatch.delenv("DDOPS_MAX_AGENT_ANSWER")
        assert session.call_agent("journal", {"repo": host.repo}) == {"entries": [], "corrupt": []}


def test_status_on_a_host_whose_answer_is_past_the_cap_fails_that_host_with_one_line(local_inventory):
    code, doc = run_ddops_json("status", "--all", inventory=local_inventory,
                               env={"SSH_AUTH_SOCK": "", "DDOPS_MAX_AGENT_ANSWER": "16"})
    (host,) = doc["hosts"]
    assert code == 1, doc
    assert (host["status"], host["message"]) == (
        "failed", "the agent sent more than 16 bytes of output: refused (cut off)")


def test_the_caps_default_to_256_and_64_mib_and_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.delenv("DDOPS_MAX_AGENT_ANSWER", raising=False)
    monkeypatch.delenv("DDOPS_MAX_COMMAND_OUTPUT", raising=False)
    assert (max_agent_answer(), max_command_output()) == (256 << 20, 64 << 20) == (DEFAULT_MAX_AGENT_ANSWER,
                                                                                 DEFAULT_MAX_COMMAND_OUTPUT)
    for bad in ("lots", "0", "-5", "1.5"):
        monkeypatch.setenv("DDOPS_MAX_COMMAND_OUTPUT", bad)
        with pytest.raises(UsageError, match=rf"^DDOPS_MAX_COMMAND_OUTPUT='{bad}': not a whole number"):
            max_command_output()


@pytest.fixture
def three_hosts(tmp_path):
    repos = {name: git_seed(MINI_DDTREE, tmp_path / name) for name in ("a", "b", "c")}
    path = tmp_path / "three.yaml"
    path.write_text(f"ssh_config: /dev/null\nknown_hosts: {tmp_path / 'known_hosts'}\nhosts:\n" + "".join(
        f"  {name}: {{connection: local, repo: {json.dumps(str(repo))}}}\n" for name, repo in repos.items()))
    return path


def test_exec_keeps_at_most_the_controller_wide_bound_of_output_over_all_hosts(three_hosts):
    # Each host's kept output has its own cap (1 MiB a stream); together they stay under DDOPS_MAX_HELD_OUTPUT,
    # past which output is still streamed but no longer kept.
    code, doc = run_ddops_json("exec", "--all", "--shell", "head -c 1048576 /dev/zero | tr '\\0' x",
                               inventory=three_hosts, env={"DDOPS_MAX_HELD_OUTPUT": "1500000"})
    assert code == 0, doc
    kept = [len(h["data"]["stdout"]) for h in doc["hosts"]]
    assert sum(kept) <= 1500000 and any(h["data"]["truncated"] for h in doc["hosts"]), kept


def test_agent_answers_past_the_controller_wide_bound_end_that_hosts_call_with_one_line(three_hosts):
    code, doc = run_ddops_json("status", "--all", inventory=three_hosts,
                               env={"SSH_AUTH_SOCK": "", "DDOPS_MAX_HELD_OUTPUT": "16"})
    assert code == 1, doc
    assert {(h["status"], h["message"]) for h in doc["hosts"]} == {
        ("failed", "the controller already holds 16 bytes of the hosts' output (DDOPS_MAX_HELD_OUTPUT): "
                   "refused (cut off)")}


def test_what_a_finished_call_held_is_given_back(local_inventory, monkeypatch):
    from ddops.transport.channel import HELD

    monkeypatch.setenv("DDOPS_MAX_HELD_OUTPUT", "200000")
    inv = load_inventory(local_inventory)
    with Connector(inv.known_hosts).connect(inv.hosts[0]) as session:
        for _ in range(5):  # 5 x 150 kB in turn: each call's share is given back when it ends
            assert len(session.run("head -c 150000 /dev/zero").stdout) == 150000
            assert session.call_agent("journal", {"repo": inv.hosts[0].repo})["entries"] == []
    assert HELD.held == 0
