"""The controller's side of the agent protocol: one JSON request per line in, one JSON answer per line out.

The agent is either the host's resident (a unix-socket channel, no Python start) or one started for the session
(an exec channel with the agent source on stdin); see docs/internals.md, "The remote agent protocol"."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shlex
import time
from contextlib import suppress
from typing import Any

import paramiko

from ddops.errors import AgentError, AgentNoAnswer, CommandTimeout
from ddops.inventory import Host
from ddops.transport.answers import check_answer
from ddops.transport.channel import (READ_CHUNK, ChannelReader, CommandResult, max_agent_answer, output_too_large,
                                     send_all)
from ddops.transport.resident import Resident, ResidentBook, resident_key
from ddops.transport.streamlocal import OPEN_ADMINISTRATIVELY_PROHIBITED, open_unix_socket_channel

MAX_AGENT_STDERR = 1 << 16
AGENT_EXIT_WAIT = 2.0  # seconds close() waits for the agent to exit after EOF


def resident_proof(secret: bytes, role: str, nonce: str) -> str:
    """HMAC-SHA256 of the nonce under a resident's secret, for `role` "controller" or "resident" (the agent's
    resident.proof computes the same; remote/README.md, "The resident agent")."""
    return hmac.new(secret, f"ddops-{role}:{nonce}".encode("ascii"), hashlib.sha256).hexdigest()


class AgentChannel:
    """The agent running in `--serve` mode on one channel: a JSON request per line in, a JSON answer per line out."""

    def __init__(self, channel: paramiko.Channel, source: bytes, host_name: str, *,
                 resident: Resident | None = None, resident_key: str | None = None,
                 book_key: str | None = None) -> None:
        self.channel = channel
        self.host_name = host_name
        self.pending_source = source  # sent once, ahead of the first request
        self.resident = resident is not None  # a channel to the host's resident agent rather than an exec'd one
        self.resident_key = resident_key  # until the first answer says where the agent will stay on
        self.book_key = book_key  # the resident's entry in the ResidentBook
        self.greeted = resident is None
        self._expected_greeting: str | None = None
        if resident is not None:
            # The hello goes out with the first request (no round trip of its own): the resident serves nothing to a
            # controller that cannot prove its secret, and its greeting must prove it in turn before any answer of
            # its is believed; an answer that came through a resident not our own is dropped unread.
            nonce = os.urandom(16).hex()
            hello = {"hello": {"nonce": nonce, "proof": resident_proof(resident.secret, "controller", nonce)}}
            self.pending_source = json.dumps(hello).encode("ascii") + b"\n"
            self._expected_greeting = resident_proof(resident.secret, "resident", nonce)
        self.answered = False
        limit = max_agent_answer()
        self.reader = ChannelReader(channel, host_name, max_err=MAX_AGENT_STDERR, max_out=limit,
                                    too_much=lambda: output_too_large(host_name, "agent", limit))

    def _proves_greeting(self, line: str) -> bool:
        """Whether a resident's first line is the greeting our hello asked for."""
        try:
            claimed = json.loads(line).get("resident")
        except (ValueError, AttributeError):
            return False
        return isinstance(claimed, str) and self._expected_greeting is not None \
            and hmac.compare_digest(claimed.encode("utf-8"), self._expected_greeting.encode("ascii"))

    def never_served(self) -> bool:
        """A resident channel that ended before the resident took anything from it."""
        return self.resident and not self.greeted and not self.answered

    def request(self, request: bytes, deadline: float, timeout: float) -> str | None:
        """Send one request line; its answer line, or None when the agent's output ended first."""
        data, self.pending_source = self.pending_source + request, b""
        send_all(self.channel, data, deadline, self.host_name)

        def timed_out() -> Exception:
            return CommandTimeout(f"agent request timed out after {timeout:g}s and was cut off", host=self.host_name)

        while True:
            line = self.reader.next_line(deadline, timed_out)
            if line is not None and not self.greeted:
                if not self._proves_greeting(line):
                    self.close()  # not the resident we were told of: never served, as far as we believe
                    return None
                self.greeted = True
                continue
            if line is not None:
                self.answered = True
            return line

    def ended(self, deadline: float, duration: float) -> CommandResult:
        """What the agent left behind when it stopped without an answer: exit status, output, stderr."""
        channel, reader = self.channel, self.reader
        channel.status_event.wait(max(0.0, min(deadline - time.monotonic(), 5.0)))
        while channel.recv_stderr_ready():
            reader.err += channel.recv_stderr(READ_CHUNK)
        code = channel.exit_status if channel.exit_status_ready() else -1
        return CommandResult(code, reader.out.decode("utf-8", "replace"), reader.err.decode("utf-8", "replace"),
                             duration)

    def finish(self) -> None:
        """EOF: the agent, idle between requests, exits. Wait (briefly) for that, so that it has ended, reaped by
        sshd, when the connection goes, rather than being left to finish as an orphan. A resident's session process
        ends the same way, but a socket channel has no exit status."""
        self.channel.shutdown_write()
        if not self.resident:
            self.channel.status_event.wait(AGENT_EXIT_WAIT)

    def close(self) -> None:
        self.reader.release()
        with suppress(Exception):  # the channel may already be gone with its connection
            self.channel.close()


def open_agent(transport: paramiko.Transport, host: Host, residents: ResidentBook | None,
               timeout: float) -> AgentChannel:
    """The agent for a session: the host's resident when it has one, else a new one started by exec."""
    from ddops.transport.agent import agent_digest, agent_program

    linger, refused = 0.0, False
    key = resident_key(host.user, host.address, host.port, host.python, agent_digest(), via=host.proxy_jump)
    if residents is not None and host.agent_linger > 0:
        resident = residents.resident_for(key)
        if resident is not None:
            try:
                channel = open_unix_socket_channel(transport, resident.socket, timeout)
            except paramiko.ChannelException as exc:
                # Gone (it idled out, the host rebooted), or refused by sshd's configuration: OpenSSH says
                # "connect failed" for both, so the agent started now checks whether the resident is there.
                refused = True
                residents.forget(key, prohibited=exc.code == OPEN_ADMINISTRATIVELY_PROHIBITED)
            else:
                return AgentChannel(channel, b"", host.name, resident=resident, book_key=key)
        if residents.may_linger(key):
            linger = host.agent_linger
    program = agent_program()
    channel = transport.open_session(timeout=timeout)
    channel.exec_command(shlex.join(program.argv(host.python, serve=True, linger=linger, probe_resident=refused)))
    return AgentChannel(channel, program.bundle, host.name, resident_key=key if linger else None)


def note_resident(residents: ResidentBook, key: str, reply: dict[str, Any]) -> None:
    """Remember what the first answer of an agent started to linger says about the host's resident."""
    if reply.get("resident_alive"):
        # sshd would not connect us to a resident that is there: it forbids unix-socket channels.
        residents.forget(key, prohibited=True)
    elif isinstance(reply.get("resident"), str) and isinstance(reply.get("resident_secret"), str):
        residents.record(key, reply["resident"], reply["resident_secret"])


def parse_agent_reply(host: str, verb: str, result: CommandResult) -> dict[str, Any]:
    """The agent's `result`, or an AgentError saying what went wrong on which host."""
    return agent_result(host, verb, decode_agent_reply(host, verb, result))


def decode_agent_reply(host: str, verb: str, result: CommandResult) -> dict[str, Any]:
    """The agent's whole reply document, or an AgentError when its output is not one."""
    try:
        reply = json.loads(result.stdout)
    except ValueError:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        if result.exit_code == 127 or "not found" in tail[0]:
            raise AgentError(f"agent could not start (is the host's python installed?): {tail[0]}", host=host) from None
        # No answer at all: the agent died under the request (killed, out of memory), which may have done part of it.
        error = AgentNoAnswer if not result.stdout.strip() else AgentError
        raise error(f"agent {verb} failed (exit {result.exit_code}): {tail[0]}", host=host) from None
    if not isinstance(reply, dict) or "ok" not in reply:
        raise AgentError(f"agent {verb} answered something that is not its protocol", host=host)
    return reply


def agent_result(host: str, verb: str, reply: dict[str, Any]) -> dict[str, Any]:
    """The `result` of a decoded reply, checked to hold what is read of `verb` (answers.check_answer), or the
    AgentError it reports."""
    if not reply["ok"]:
        error = reply.get("error")
        message, kind = (error.get("message"), error.get("kind")) if isinstance(error, dict) else (None, None)
        raise AgentError(message if isinstance(message, str) and message else f"agent {verb} failed: {error!r:.200}",
                         kind=kind if isinstance(kind, str) and kind else "error", host=host)
    result = reply.get("result")
    return check_answer(host, verb, {} if result is None else result)
