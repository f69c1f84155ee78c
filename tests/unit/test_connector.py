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
