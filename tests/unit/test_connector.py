"""The Connector's ProxyJump bookkeeping that needs no network: loops are refused before anything is dialled."""

from __future__ import annotations

import pytest

from ddops.errors import TransportError
from ddops.inventory import Host
from ddops.transport import Connector


def test_a_proxy_jump_loop_is_refused_before_any_connection(tmp_path):
    a = Host(name="a", address="127.0.0.1", port=1, proxy_jump="b")
    b = Host(name="b", address="127.0.0.1", port=2, proxy_jump="c,a")
    c = Host(name="c", address="127.0.0.1", port=3, proxy_jump="a")
    connector = Connector(tmp_path / "known_hosts", jump_hosts=[a, b, c], residents=None)
    # b is reached through the chain c,a: its last hop is a, which waits on b.
    with pytest.raises(TransportError, match=r"a: ProxyJump loop: a -> b -> a"):
        connector.connect(a)
    assert connector._jumps == {}


def test_a_lost_connection_is_a_transport_error_with_the_host_failed_exit_code():
    from ddops.errors import EXIT_HOST_FAILED, ConnectionLost

    assert issubclass(ConnectionLost, TransportError)
    assert ConnectionLost("gpu1: connection lost: EOF").exit_code == EXIT_HOST_FAILED


def test_the_fleet_counts_a_host_unreachable_by_the_error_s_type_not_its_words():
    from ddops.errors import ConnectionLost
    from ddops.fleet import run_fleet

    class Idle:
        def close(self) -> None:
            pass

    def task(host, session):
        if host.name == "lost":
            raise ConnectionLost("lost: connection lost: EOF")
        raise TransportError(f"{host.name}: cannot write x: connection lost, says the message")

    hosts = [Host(name="lost", address="127.0.0.1"), Host(name="wordy", address="127.0.0.2")]
    results = {r.host: r.status for r in run_fleet(hosts, task, lambda host: Idle())}
    assert results == {"lost": "unreachable", "wordy": "failed"}


def test_a_host_error_carries_its_host_and_kind_and_shows_the_host_once():
    import socket

    from ddops.transport.sockets import tcp_connect

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransportError) as caught:
        tcp_connect(Host(name="gpu7", address="127.0.0.1", port=port), timeout=5)
    error = caught.value
    assert (error.host, error.kind) == ("gpu7", "transport")
    assert error.message.startswith(f"cannot connect to 127.0.0.1:{port}: ")
    assert str(error) == f"gpu7: {error.message}"


def test_an_agent_error_keeps_the_agent_s_kind_and_its_host_apart_from_the_message():
    from ddops.errors import AgentError
    from ddops.transport.agent_client import agent_result

    with pytest.raises(AgentError) as caught:
        agent_result("gpu7", "commit", {"ok": False, "error": {"kind": "conflict", "message": "ddtree.py changed"}})
    assert (caught.value.host, caught.value.kind, caught.value.message) == ("gpu7", "conflict", "ddtree.py changed")
    assert str(caught.value) == "gpu7: ddtree.py changed"
