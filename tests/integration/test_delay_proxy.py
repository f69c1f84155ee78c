"""The fleet-speed measurement's delaying proxy: order and bytes kept, at least the round trip added, clean ends."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time

import pytest

from tests.conftest import REPO_ROOT, wait_until

_spec = importlib.util.spec_from_file_location("delay_proxy", REPO_ROOT / "benchmarks" / "fleet-speed" /
                                               "delay_proxy.py")
delay_proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(delay_proxy)

RTT = 0.05


@pytest.fixture
def echo_server():
    """A loopback server that echoes every byte back, then closes its side after the client's EOF."""
    listener = socket.create_server(("127.0.0.1", 0))
    served = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while chunk := conn.recv(65536):
                    conn.sendall(chunk)
                served.append("eof seen")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname(), served
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
    listener.close()
    thread.join(5)


def _receive_all(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(65536):
        data += chunk
    return bytes(data)


def test_delay_proxy_keeps_order_and_every_byte_of_many_chunks(echo_server):
    target, served = echo_server
    chunks = [bytes([i % 251]) * (1 + (i * 7919) % 70000) for i in range(200)]
    with delay_proxy.DelayProxies([(("127.0.0.1", 0), target)], rtt=0.002) as proxies:
        with socket.create_connection(proxies.addresses[0]) as sock:
            received: list[bytes] = []
            reader = threading.Thread(target=lambda: received.append(_receive_all(sock)))
            reader.start()
            for chunk in chunks:
                sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
            reader.join(60)
        assert received == [b"".join(chunks)]
        wait_until(lambda: served == ["eof seen"])
        up, down, connections, _ = proxies.counters()
        assert (up, down, connections) == (sum(map(len, chunks)), sum(map(len, chunks)), 1)


def test_delay_proxy_adds_at_least_the_round_trip_to_a_request_and_its_answer(echo_server):
    target, _ = echo_server
    with delay_proxy.DelayProxies([(("127.0.0.1", 0), target)], rtt=RTT) as proxies:
        with socket.create_connection(proxies.addresses[0]) as sock:
            for _ in range(3):
                started = time.monotonic()
                sock.sendall(b"ping")
                assert sock.recv(16) == b"ping"
                assert time.monotonic() - started >= RTT  # a lower bound holds whatever the load
        assert proxies.counters()[3] == 5  # ping, pong, ping, pong, ping, pong: each answer waited on its request


def test_delay_proxy_passes_eof_on_and_stops_with_its_block(echo_server):
    target, served = echo_server
    proxies = delay_proxy.DelayProxies([(("127.0.0.1", 0), target)], rtt=0.01)
    with proxies:
        with socket.create_connection(proxies.addresses[0]) as sock:
            sock.sendall(b"last words")
            sock.shutdown(socket.SHUT_WR)
            assert _receive_all(sock) == b"last words"  # the server's close reached us: recv returned b""
        wait_until(lambda: served == ["eof seen"])
    assert not proxies._thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(proxies.addresses[0], timeout=2).close()


def test_delay_proxy_stops_by_itself_after_its_lifetime(echo_server):
    target, _ = echo_server
    proxies = delay_proxy.DelayProxies([(("127.0.0.1", 0), target)], rtt=0, lifetime=0.2)
    with proxies:
        wait_until(lambda: not proxies._thread.is_alive())


def test_delay_proxy_listens_on_loopback_only():
    with pytest.raises(ValueError, match="not a loopback address"):
        delay_proxy.DelayProxies([(("0.0.0.0", 0), ("127.0.0.1", 22))], rtt=0.02)
