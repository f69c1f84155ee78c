"""OpenSSH's direct-streamlocal channel (a unix socket on the host, connected by sshd).

The one place that uses paramiko's private API: paramiko's open_channel builds the open message only for the channel
kinds it knows. pyproject pins paramiko below its next major for this module's sake, and
tests/integration/test_resident_agent.py fails when these internals change."""

from __future__ import annotations

import threading

import paramiko
from paramiko.channel import Channel
from paramiko.common import cMSG_CHANNEL_OPEN
from paramiko.message import Message

# SSH_MSG_CHANNEL_OPEN_FAILURE reason (RFC 4254 5.1): sshd's configuration forbids the channel.
OPEN_ADMINISTRATIVELY_PROHIBITED = 1
UNIX_SOCKET_CHANNEL = "direct-streamlocal@openssh.com"


def open_unix_socket_channel(transport: paramiko.Transport, socket_path: str, timeout: float) -> paramiko.Channel:
    """A channel to a unix socket on the host, which sshd connects for us (OpenSSH's direct-streamlocal).

    Does what Transport.open_channel does for the kinds it knows (same message, window and bookkeeping) with the
    streamlocal fields: path, reserved string, reserved uint32. Raises paramiko.ChannelException when sshd refuses
    (no such socket, or forbidden)."""
    if not transport.active:
        raise paramiko.SSHException("SSH session not active")
    with transport.lock:
        window_size = transport._sanitize_window_size(None)
        max_packet_size = transport._sanitize_packet_size(None)
        channel_id = transport._next_channel()
        message = Message()
        message.add_byte(cMSG_CHANNEL_OPEN)
        message.add_string(UNIX_SOCKET_CHANNEL)
        message.add_int(channel_id)
        message.add_int(window_size)
        message.add_int(max_packet_size)
        message.add_string(socket_path)
        message.add_string("")
        message.add_int(0)
        channel = Channel(channel_id)
        transport._channels.put(channel_id, channel)
        transport.channel_events[channel_id] = opened = threading.Event()
        transport.channels_seen[channel_id] = True
        channel._set_transport(transport)
        channel._set_window(window_size, max_packet_size)
    transport._send_user_message(message)
    if not opened.wait(timeout):
        raise paramiko.SSHException(f"timed out opening a channel to {socket_path}")
    channel = transport._channels.get(channel_id)
    if channel is not None:
        return channel
    failure = transport.get_exception()
    if isinstance(failure, paramiko.ChannelException):
        raise failure
    raise paramiko.SSHException(f"cannot open a channel to {socket_path}: {failure or 'refused'}")
