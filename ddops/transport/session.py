"""One SSH connection per host, reused for every command of a ddops run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import paramiko

from ddops.errors import Cancelled, CommandTimeout, ConnectionLost, DdopsError, TransportError
from ddops.inventory import Host
from ddops.transport.agent import agent_request
from ddops.transport.agent_client import (AgentChannel, agent_result, decode_agent_reply, note_resident, open_agent,
                                          parse_agent_reply)
from ddops.transport.channel import ChannelReader, CommandResult, max_command_output, output_too_large, send_all
from ddops.transport.resident import ResidentBook

__all__ = ["CommandResult", "Session"]


def connection_lost(host: Host, exc: BaseException) -> ConnectionLost:
    return ConnectionLost(f"connection lost: {exc or type(exc).__name__}", host=host.name)


class Session:
    """An open SSH connection to one host: run commands, move bytes, call the remote agent."""

    def __init__(self, host: Host, client: paramiko.SSHClient, connect_time: float,
                 residents: ResidentBook | None = None) -> None:
        self.host = host
        self.connect_time = connect_time
        self.round_trips = 0  # request/answer exchanges after connecting: each `run` and each agent call
        self.agent_mode: str | None = None  # "resident" or "started" once the agent was called
        self._client = client
        self._residents = residents
        self._sftp: paramiko.SFTPClient | None = None
        self._agent: AgentChannel | None = None

    @property
    def transport(self) -> paramiko.Transport:
        """The SSH transport under this session (jump hosts open channels on it)."""
        transport = self._client.get_transport()
        if transport is None:
            raise TransportError("the connection is closed", host=self.host.name)
        return transport

    # -- commands ---------------------------------------------------------------------------------------------
    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Run a command through the login shell; stdin bytes are sent then closed. Raises CommandTimeout."""
        started = time.monotonic()
        code, reader = self._exec(command, stdin=stdin, timeout=timeout)
        return CommandResult(code, reader.out.decode("utf-8", "replace"), reader.err.decode("utf-8", "replace"),
                             time.monotonic() - started)

    def stream(self, command: str, on_output: Callable[[str, bytes], None], *, timeout: float | None = None,
               cancel: threading.Event | None = None, cancel_input: bytes = b"") -> int:
        """Run a command like `run`, handing each chunk of output to on_output("stdout" | "stderr", bytes) as it
        arrives (nothing is kept here); the exit status (-1: none was sent). Used by `ddops exec`.

        Once `cancel` is set, `cancel_input` goes to the command's stdin (kept open until then), the channel closes
        and Cancelled is raised: the command line decides what its stdin means (tasks/adhoc.py ends the command)."""
        code, _ = self._exec(command, timeout=timeout, on_output=on_output, cancel=cancel, cancel_input=cancel_input)
        return code

    def _exec(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None,
              on_output: Callable[[str, bytes], None] | None = None, cancel: threading.Event | None = None,
              cancel_input: bytes = b"") -> tuple[int, ChannelReader]:
        timeout = self.host.command_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.round_trips += 1
        channel = reader = None
        try:
            channel = self.transport.open_session(timeout=timeout)
            channel.exec_command(command)
            if stdin:
                send_all(channel, stdin, deadline, self.host.name)
            if cancel is None:
                channel.shutdown_write()
            limit = None if on_output else max_command_output()  # streamed output is handed on, not kept
            reader = ChannelReader(channel, self.host.name, on_output=on_output, max_out=limit,
                                   too_much=lambda: output_too_large(self.host.name, "command", limit or 0))
            reader.drain(deadline, lambda: CommandTimeout(
                f"command timed out after {timeout:g}s and was cut off", host=self.host.name), cancel)
            code = channel.recv_exit_status()
            if code == -1 and not channel.eof_received:
                # Closed with neither EOF nor exit status: the connection died under the command, which may or
                # may not have finished on the host.
                raise EOFError("the connection closed while the command ran")
        except Cancelled:
            if cancel_input and channel is not None:
                with suppress(Exception):  # a dead channel ended the command already
                    send_all(channel, cancel_input, time.monotonic() + 5, self.host.name)
            raise Cancelled("interrupted: the command was ended on the host", host=self.host.name) from None
        except CommandTimeout:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise connection_lost(self.host, exc) from None
        finally:
            if reader is not None:
                reader.release()  # the caller reads its buffers at once; they no longer count as in flight
            if channel is not None:
                channel.close()
        return code, reader

    # -- files ------------------------------------------------------------------------------------------------
    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self.round_trips += 1
            self._sftp = self._client.open_sftp()
        return self._sftp

    def put_file(self, local_path: str | os.PathLike[str], remote_path: str,
                 callback: Callable[[int, int], None] | None = None) -> None:
        """Stream a local file to the host (never held in memory whole)."""
        sftp = self._sftp_client()
        self.round_trips += 1
        try:
            sftp.put(str(local_path), remote_path, callback=callback)
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"cannot upload to {remote_path}: {exc}", host=self.host.name) from None

    def get_file(self, remote_path: str, local_path: str | os.PathLike[str], *, max_bytes: int | None = None) -> None:
        """Download one file; DdopsError as soon as it holds more than max_bytes (a file that grows on the host)."""
        sftp = self._sftp_client()
        self.round_trips += 1
        try:
            if max_bytes is None:
                sftp.get(remote_path, str(local_path))
                return
            with sftp.open(remote_path, "rb") as src, open(local_path, "wb") as dst:
                size = src.stat().st_size or 0
                src.prefetch(min(size, max_bytes))
                copy_limited(src, dst, max_bytes, f"{self.host.name}: {remote_path}")
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"cannot download {remote_path}: {exc}", host=self.host.name) from None

    # -- agent ------------------------------------------------------------------------------------------------
    def call_agent(self, verb: str, payload: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Run one agent verb on the host and return its result.

        The first call starts the agent (source shipped on stdin, `--serve`); later calls of the session send their
        request on the same channel, so a snapshot and the commit that follows cost one Python start on the host,
        not two."""
        timeout = self.host.command_timeout if timeout is None else timeout
        started = time.monotonic()
        deadline = started + timeout
        request = agent_request(verb, payload, timeout)
        self.round_trips += 1
        agent = self._agent
        try:
            if agent is None:
                agent = self._agent = open_agent(self.transport, self.host, self._residents, timeout)
                self.agent_mode = "resident" if agent.resident else "started"
            line = agent.request(request, deadline, timeout)
        except TransportError:  # timed out, or an answer past max_agent_answer(): this agent is done
            self._drop_agent()
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if (agent is not None and not agent.never_served() and agent.channel.exit_status_ready()
                    and agent.channel.exit_status != -1):
                # The agent's process ended with a status before it took the request (a python that does not
                # start, say): the write failed because of that, not because the connection did (that ends the
                # channel with no status, -1). Say why, as below.
                result = agent.ended(deadline, time.monotonic() - started)
                self._drop_agent()
                return parse_agent_reply(self.host.name, verb, result)
            self._drop_agent()
            if agent is not None and agent.never_served():
                return self._without_resident(agent, verb, payload, deadline)
            raise connection_lost(self.host, exc) from None
        if line is None and agent.never_served():
            self._drop_agent()
            return self._without_resident(agent, verb, payload, deadline)
        if line is None:  # the agent exited without answering: say why, as a one-shot run would
            result = agent.ended(deadline, time.monotonic() - started)
            self._drop_agent()
            if result.exit_code == -1 and not agent.channel.eof_received:
                raise connection_lost(self.host, EOFError("the connection closed while the agent ran"))
            return parse_agent_reply(self.host.name, verb, result)
        reply = decode_agent_reply(self.host.name, verb, CommandResult(0, line, "", time.monotonic() - started))
        if agent.resident_key is not None and self._residents is not None:
            note_resident(self._residents, agent.resident_key, reply)
            agent.resident_key = None
        return agent_result(self.host.name, verb, reply)

    def _without_resident(self, agent: AgentChannel, verb: str, payload: dict[str, Any],
                          deadline: float) -> dict[str, Any]:
        """The call again through an agent started for it: the resident went away before it took the request (it
        closes without its greeting only then, e.g. killed as we connected), so nothing of the request ran."""
        if agent.book_key is not None and self._residents is not None:
            self._residents.forget(agent.book_key)
        return self.call_agent(verb, payload, timeout=max(1.0, deadline - time.monotonic()))

    def _drop_agent(self) -> None:
        agent, self._agent = self._agent, None
        if agent is not None:
            agent.close()

    def close(self) -> None:
        try:
            if self._agent is not None:
                with suppress(Exception):
                    self._agent.finish()
                self._drop_agent()
            if self._sftp is not None:
                self._sftp.close()
        finally:
            self._client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_limited(src: Any, dst: Any, max_bytes: int, what: str) -> int:
    """Copy src to dst in blocks; DdopsError once more than max_bytes arrive (nothing past the limit is kept)."""
    copied = 0
    while True:
        block = src.read(1 << 15)
        if not block:
            return copied
        copied += len(block)
        if copied > max_bytes:
            raise DdopsError(f"{what}: refused: more than {max_bytes} bytes arrived (it grew on the host "
                             "after it was listed)")
        dst.write(block)
