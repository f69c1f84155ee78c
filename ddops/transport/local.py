"""A session with this machine: the same agent (remote/) and line protocol as over SSH, run as a local subprocess.

No sshd, no root, no network. It is what the Connector opens for a `connection: local` host (a checkout on the
controller itself: patch, verify, rollback, status, sync and bench work there as on a remote host, through the same
agent and journal), and what task unit tests use. It is an AgentSession (ddops/tasks/base.py), as the SSH Session is."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from ddops.errors import AgentError, AgentNoAnswer, Cancelled, CommandTimeout, TransportError
from ddops.inventory import Host
from ddops.transport.agent import agent_request
from ddops.transport.agent_client import agent_result
from ddops.transport.channel import CommandResult, Share, max_agent_answer, max_command_output, output_too_large
from ddops.transport.session import copy_limited


def agent_argv(python: str) -> tuple[list[str], bytes]:
    """(argv, stdin prefix) that start the agent in serve mode, as the ssh session starts it on a host."""
    from ddops.transport.agent import agent_program

    program = agent_program()
    return program.argv(python, serve=True), program.bundle


# Seconds a cancelled command's group gets after TERM before it is KILLed (the exec guard's own TERM-to-KILL grace
# is 5 s).
CANCEL_GRACE = 10.0


class LocalSession:
    """Host `host` is this machine: agent calls go to a local agent process, commands to /bin/sh, files are copied."""

    def __init__(self, host: Host, *, python: str | None = None, env: dict[str, str] | None = None) -> None:
        self.host = host
        self.python = python or (host.python if host.python != "python3" else sys.executable)
        self.env = env
        self.connect_time = 0.0
        self.round_trips = 0
        self.agent_mode: str | None = None
        self._agent: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None  # a file, not a pipe: an agent that writes much there never blocks on it
        self._out = bytearray()
        self._out_share = Share(host.name)  # what _out holds, counted against the controller-wide bound

    # -- commands ---------------------------------------------------------------------------------------------
    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """A shell command in the login shell's stead (/bin/sh); its output kept up to max_command_output()."""
        started = time.monotonic()
        kept = {"stdout": bytearray(), "stderr": bytearray()}
        limit = max_command_output()
        share = Share(self.host.name)

        def keep(stream: str, chunk: bytes) -> None:
            kept[stream] += chunk
            if len(kept["stdout"]) + len(kept["stderr"]) > limit:
                raise output_too_large(self.host.name, "command", limit)
            share.grow(len(chunk))

        try:
            code = self._exec(command, keep, stdin=stdin, timeout=timeout)
        finally:
            share.release()
        return CommandResult(code, kept["stdout"].decode("utf-8", "replace"),
                             kept["stderr"].decode("utf-8", "replace"), time.monotonic() - started)

    def stream(self, command: str, on_output: Callable[[str, bytes], None], *, timeout: float | None = None,
               cancel: threading.Event | None = None, cancel_input: bytes = b"") -> int:
        """Run a command like `run`, handing each chunk of output to on_output("stdout" | "stderr", bytes); once
        `cancel` is set its process group is ended and Cancelled raised (cancel_input is for remote watchdogs)."""
        return self._exec(command, on_output, timeout=timeout, cancel=cancel)

    def _exec(self, command: str, on_output: Callable[[str, bytes], None], *, stdin: bytes | None = None,
              timeout: float | None = None, cancel: threading.Event | None = None) -> int:
        timeout = self.host.command_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.round_trips += 1
        # Its own process group: a timeout ends what the command started too, as sshd's session end does; and in
        # the home directory, where sshd starts a command.
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.env, start_new_session=True,
                                cwd=os.path.expanduser("~"))
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            with suppress(OSError):  # it did not read its input: its exit status says the rest
                proc.stdin.write(stdin or b"")
                proc.stdin.close()
            names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
            with selectors.DefaultSelector() as selector:
                for fd in names:
                    selector.register(fd, selectors.EVENT_READ)
                while names:
                    if cancel is not None and cancel.is_set():  # the group is ended below
                        raise Cancelled("interrupted: the command was ended on the host", host=self.host.name)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise CommandTimeout(f"command timed out after {timeout:g}s and was cut off",
                                             host=self.host.name)
                    for key, _ in selector.select(min(remaining, 0.5)):
                        chunk = os.read(key.fd, 1 << 16)
                        if not chunk:
                            selector.unregister(key.fd)
                            del names[key.fd]
                        else:
                            on_output(names[key.fd], chunk)
            return proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"command timed out after {timeout:g}s and was cut off", host=self.host.name) from None
        except Cancelled:
            # TERM first: a command under ddops' exec guard runs in a session of its own, which only the guard (on
            # this TERM) ends; a KILL here would end the guard and leave the command running.
            with suppress(OSError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=CANCEL_GRACE)
            raise
        finally:
            if proc.poll() is None:
                with suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()

    # -- files ------------------------------------------------------------------------------------------------
    def put_file(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        self.round_trips += 1
        try:
            shutil.copyfile(local_path, remote_path)
        except OSError as exc:
            raise TransportError(f"cannot upload to {remote_path}: {exc}", host=self.host.name) from None

    def get_file(self, remote_path: str, local_path: str | os.PathLike[str], *, max_bytes: int | None = None) -> None:
        self.round_trips += 1
        try:
            if max_bytes is None:
                shutil.copyfile(remote_path, local_path)
                return
            with open(remote_path, "rb") as src, open(local_path, "wb") as dst:
                copy_limited(src, dst, max_bytes, f"{self.host.name}: {remote_path}")
        except OSError as exc:
            raise TransportError(f"cannot download {remote_path}: {exc}", host=self.host.name) from None

    # -- agent ------------------------------------------------------------------------------------------------
    def call_agent(self, verb: str, payload: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """The agent's `result` for one request; its error as AgentError(kind), as the SSH session raises it."""
        timeout = self.host.command_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.round_trips += 1
        request = agent_request(verb, payload, timeout)
        if self._agent is None:
            argv, source = agent_argv(self.python)
            self._stderr = tempfile.TemporaryFile()
            self._agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=self._stderr, env=self.env)
            self.agent_mode = "started"
            request = source + request
        agent = self._agent
        with suppress(OSError):  # the agent is gone: its stderr says why, below
            assert agent.stdin is not None
            agent.stdin.write(request)
            agent.stdin.flush()
        line = self._read_line(agent, deadline, timeout)
        if line is None:
            code = agent.wait()
            self._stderr.seek(0)
            err = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
            self.close()
            raise AgentNoAnswer(f"agent {verb} ended without answering (exit {code}): "
                                f"{(err or ['no output'])[-1]}", host=self.host.name)
        try:
            reply = json.loads(line)
        except ValueError:
            raise AgentError(f"agent {verb} answered something that is not its protocol", host=self.host.name) from None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise AgentError(f"agent {verb} answered something that is not its protocol", host=self.host.name)
        return agent_result(self.host.name, verb, reply)

    def _read_line(self, agent: subprocess.Popen[bytes], deadline: float, timeout: float) -> bytes | None:
        assert agent.stdout is not None
        fd = agent.stdout.fileno()
        limit = max_agent_answer()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._out:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.close()
                    raise CommandTimeout(f"agent timed out after {timeout:g}s and was cut off", host=self.host.name)
                if not selector.select(remaining):
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self._out += chunk
                if len(self._out) > limit:
                    self.close()
                    raise output_too_large(self.host.name, "agent", limit)
                try:
                    self._out_share.grow(len(chunk))
                except TransportError:
                    self.close()
                    raise
        end = self._out.index(b"\n")
        line = bytes(self._out[:end])
        del self._out[:end + 1]
        self._out_share.shrink(min(end + 1, self._out_share.size))
        return line

    def close(self) -> None:
        agent, self._agent = self._agent, None
        self._out.clear()
        self._out_share.release()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if agent is None:
            return
        try:
            if agent.stdin is not None:
                agent.stdin.close()  # EOF: the serving agent exits
            agent.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            agent.kill()
            agent.wait()
        finally:
            if agent.stdout is not None:
                agent.stdout.close()

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

