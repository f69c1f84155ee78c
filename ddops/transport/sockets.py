"""The TCP socket under each SSH connection, tuned for many small request/answer exchanges."""

from __future__ import annotations

import socket
from contextlib import suppress

from ddops.errors import TransportError
from ddops.inventory import Host


def tcp_connect(host: Host, timeout: float) -> socket.socket:
    """A connected socket to the host's sshd, with Nagle off and quick ACKs; TransportError when unreachable."""
    try:
        sock = socket.create_connection((host.address, host.port), timeout=timeout)
    except TimeoutError:
        raise TransportError(f"connect to {host.address}:{host.port} timed out after {timeout:g}s",
                             host=host.name) from None
    except OSError as exc:
        raise TransportError(f"cannot connect to {host.address}:{host.port}: "
                             f"{exc.strerror or exc}", host=host.name) from None
    # paramiko's small writes otherwise wait on Nagle's algorithm and the peer's delayed ACK, every round trip.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return quick_ack(sock)


class QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it reads at once (Linux: TCP_QUICKACK re-armed after every read).

    sshd leaves Nagle's algorithm on for sessions without a tty, and right after authentication it sends a
    hostkeys-00@openssh.com notice that a client never answers: the kernel holds back its ACK (delayed ACK, 40 ms),
    and sshd holds back its next small packet, the confirmation of our first channel, until that ACK arrives. So the
    first command on every connection cost a delayed ACK more than the later ones; with this it costs the same."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        with suppress(OSError):
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data


def quick_ack(sock: socket.socket) -> socket.socket:
    if not hasattr(socket, "TCP_QUICKACK") or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return sock
    timeout = sock.gettimeout()
    quick = QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    quick.settimeout(timeout)
    return quick
