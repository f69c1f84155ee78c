"""One SSH connection per host, reused for every command of a ddops run."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ddops.errors import AgentError, CommandTimeout, HostKeyError, TransportError
from ddops.inventory import Host
from ddops.transport.resident import ResidentBook, resident_key


def _import_paramiko() -> Any:
    """paramiko, without the `invoke` package that its ssh_config parser imports for `Match exec`.

    ddops reads ssh_config itself (ddops.sshconfig), and importing invoke costs ~50 ms of every command's startup.
    """
    blocked = "invoke" not in sys.modules
    if blocked:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` now raises ImportError
    try:
        import paramiko as module
    finally:
        if blocked and "invoke" in sys.modules and sys.modules["invoke"] is None:
            del sys.modules["invoke"]
    return module


paramiko = _import_paramiko()
# paramiko logs what it also raises (a refused channel is an ERROR record); with no handler configured, Python would
# print those on stderr. ddops reports failures itself, in one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

READ_CHUNK = 1 << 16
MAX_AGENT_STDERR = 1 << 16
AGENT_EXIT_WAIT = 2.0  # seconds close() waits for the agent to exit after EOF
_known_hosts_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a remote command did."""

    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or with --accept-new record them; never a silent auto-add."""

    def __init__(self, host: Host, known_hosts: Path, accept_new: bool) -> None:
        self.host, self.known_hosts, self.accept_new = host, known_hosts, accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fingerprint = key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()[:16]
        if not self.accept_new:
            raise HostKeyError(
                f"{self.host.name}: unknown host key {key.get_name()} {fingerprint} for {hostname} "
                f"(not in {self.known_hosts}); check it, then re-run with --accept-new to record it"
            )
        _append_known_host(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


class _KnownHosts:
    """A known_hosts file, read once per Connector; a host's entries are parsed only when that host connects.

    paramiko's load_host_keys parses every line into a key object, on every connection: with 32 hosts that was
    the biggest CPU cost of a whole `ddops patch`. Matching is paramiko's (exact names, comma lists, hashed names).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._lines: list[str] | None = None
        self._error: str | None = None

    def keys_for(self, host: Host, name: str) -> list[tuple[str, paramiko.PKey]]:
        """(key type, key) of every entry for `name` ("address" or "[address]:port")."""
        with self._lock:
            if self._lines is None and self._error is None:
                try:
                    self._lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
                except FileNotFoundError:
                    self._lines = []
                except OSError as exc:
                    self._error = str(exc)
        if self._error is not None:
            raise HostKeyError(f"{host.name}: cannot read known_hosts {self.path}: {self._error}")
        found = []
        for line in self._lines or ():
            fields = line.split()
            if len(fields) < 3 or fields[0].startswith("#") or not self._names_match(fields[0], name):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
            except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError) as exc:
                raise HostKeyError(f"{host.name}: known_hosts {self.path} has a bad entry for {name}: "
                                   f"{exc or type(exc).__name__}") from None
            if entry is not None and entry.key is not None:
                found.append((entry.key.get_name(), entry.key))
        return found

    @staticmethod
    def _names_match(patterns: str, name: str) -> bool:
        for pattern in patterns.split(","):
            if pattern == name:
                return True
            if pattern.startswith("|1|"):
                try:
                    if paramiko.HostKeys.hash_host(name, pattern) == pattern:
                        return True
                except (ValueError, TypeError, IndexError, AssertionError):  # a damaged salt: an entry for no one
                    continue
        return False


def _append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    with _known_hosts_lock, open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # other ddops processes may record keys at the same time
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it reads at once (Linux: TCP_QUICKACK re-armed after every read).

    sshd leaves Nagle's algorithm on for sessions without a tty, and right after authentication it sends a
    hostkeys-00@openssh.com notice that a client never answers: the kernel holds back its ACK (delayed ACK, 40 ms),
    and sshd holds back its next small packet, the confirmation of our first channel, until that ACK arrives. So the
    first command on every connection cost ~45 ms more than the later ones; with this it costs the same.
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        try:
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass
        return data


def _quick_ack(sock: socket.socket) -> socket.socket:
    if not hasattr(socket, "TCP_QUICKACK") or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return sock
    timeout = sock.gettimeout()
    quick = _QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    quick.settimeout(timeout)
    return quick


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
        self._agent: _AgentChannel | None = None

    # -- commands ---------------------------------------------------------------------------------------------
    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Run a command through the login shell; stdin bytes are sent then closed. Raises CommandTimeout."""
        timeout = self.host.command_timeout if timeout is None else timeout
        started = time.monotonic()
        deadline = started + timeout
        self.round_trips += 1
        channel = None
        try:
            channel = self._client.get_transport().open_session(timeout=timeout)
            channel.exec_command(command)
            if stdin:
                self._send_all(channel, stdin, deadline)
            channel.shutdown_write()
            out, err = self._drain(channel, deadline, timeout)
            code = channel.recv_exit_status()
            if code == -1 and not channel.eof_received:
                # Closed with neither EOF nor exit status: the connection died under the command, which may or
                # may not have finished on the host.
                raise EOFError("the connection closed while the command ran")
        except CommandTimeout:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.host.name}: connection lost: {exc or type(exc).__name__}") from None
        finally:
            if channel is not None:
                channel.close()
        return CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                             time.monotonic() - started)

    def _send_all(self, channel: paramiko.Channel, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            if time.monotonic() > deadline:
                raise CommandTimeout(f"{self.host.name}: timed out sending input")
            if channel.send_ready():
                sent = channel.send(view[:READ_CHUNK])
                view = view[sent:]
            else:
                select.select([], [], [], 0.01)

    def _drain(self, channel: paramiko.Channel, deadline: float, timeout: float) -> tuple[bytes, bytes]:
        out, err = bytearray(), bytearray()
        while True:
            progressed = False
            while channel.recv_ready():
                out += channel.recv(READ_CHUNK)
                progressed = True
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(READ_CHUNK)
                progressed = True
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                # exit status can arrive before the last data frames are read: drain until EOF
                if channel.eof_received:
                    break
            if channel.closed and not progressed:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"{self.host.name}: command timed out after {timeout:g}s and was cut off")
            if not progressed:
                select.select([channel], [], [], min(remaining, 0.2))
        return bytes(out), bytes(err)

    # -- streamed command (ddops exec) -----------------------------------------------------------------------
    def stream(self, command: str, on_output: Callable[[str, bytes], None], *, timeout: float | None = None) -> int:
        """Run a command through the login shell on an exec channel of this connection, handing each chunk of
        output to on_output("stdout" | "stderr", bytes) as it arrives (nothing is kept here); the exit status
        (-1: none was sent). stdin is closed at once. Raises CommandTimeout, TransportError."""
        timeout = self.host.command_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.round_trips += 1
        channel = None
        try:
            channel = self._client.get_transport().open_session(timeout=timeout)
            channel.exec_command(command)
            channel.shutdown_write()
            while True:
                progressed = False
                while channel.recv_ready():
                    chunk = channel.recv(READ_CHUNK)
                    if chunk:
                        on_output("stdout", chunk)
                    progressed = True
                while channel.recv_stderr_ready():
                    on_output("stderr", channel.recv_stderr(READ_CHUNK))
                    progressed = True
                if channel.eof_received and not channel.recv_ready() and not channel.recv_stderr_ready():
                    break
                if channel.closed and not progressed:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(f"{self.host.name}: command timed out after {timeout:g}s and was cut off")
                if not progressed:
                    select.select([channel], [], [], min(remaining, 0.2))
            channel.status_event.wait(max(0.0, min(deadline - time.monotonic(), 5.0)))
            code = channel.exit_status if channel.exit_status_ready() else -1
            if code == -1 and not channel.eof_received:
                raise EOFError("the connection closed while the command ran")
        except CommandTimeout:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.host.name}: connection lost: {exc or type(exc).__name__}") from None
        finally:
            if channel is not None:
                channel.close()
        return code
    # -- end of streamed command -----------------------------------------------------------------------------

    # -- files ------------------------------------------------------------------------------------------------
    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self.round_trips += 1
            self._sftp = self._client.open_sftp()
        return self._sftp

    def put_bytes(self, data: bytes, remote_path: str, mode: int | None = None) -> None:
        """Write a remote file atomically (temp name, then rename)."""
        sftp = self._sftp_client()
        temp = f"{remote_path}.ddops-tmp-{os.getpid()}-{threading.get_ident()}"
        self.round_trips += 1
        try:
            with sftp.open(temp, "wb") as fh:
                fh.set_pipelined(True)
                fh.write(data)
            if mode is not None:
                sftp.chmod(temp, mode)
            sftp.posix_rename(temp, remote_path)
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"{self.host.name}: cannot write {remote_path}: {exc}") from None

    def put_file(self, local_path: str | os.PathLike[str], remote_path: str,
                 callback: Callable[[int, int], None] | None = None) -> None:
        """Stream a local file to the host (never held in memory whole)."""
        sftp = self._sftp_client()
        self.round_trips += 1
        try:
            sftp.put(str(local_path), remote_path, callback=callback)
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"{self.host.name}: cannot upload to {remote_path}: {exc}") from None

    def get_bytes(self, remote_path: str) -> bytes:
        sftp = self._sftp_client()
        self.round_trips += 1
        try:
            with sftp.open(remote_path, "rb") as fh:
                fh.prefetch()
                return fh.read()
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"{self.host.name}: cannot read {remote_path}: {exc}") from None

    def get_file(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        sftp = self._sftp_client()
        self.round_trips += 1
        try:
            sftp.get(remote_path, str(local_path))
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"{self.host.name}: cannot download {remote_path}: {exc}") from None

    # -- agent ------------------------------------------------------------------------------------------------
    def call_agent(self, verb: str, payload: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Run one agent verb on the host and return its result.

        The first call starts the agent (source shipped on stdin, `--serve`); later calls of the session send their
        request on the same channel, so a snapshot and the commit that follows cost one Python start on the host,
        not two. Each request still gets a freshly loaded agent there.
        """
        timeout = self.host.command_timeout if timeout is None else timeout
        started = time.monotonic()
        deadline = started + timeout
        request = json.dumps({"verb": verb, "payload": payload}).encode() + b"\n"
        self.round_trips += 1
        agent = self._agent
        try:
            if agent is None:
                agent = self._agent = self._start_agent(timeout)
                data = agent.pending_source + request
            else:
                data = request
            self._send_all(agent.channel, data, deadline)
            line = agent.read_line(deadline, timeout)
        except CommandTimeout:
            self._drop_agent()
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._drop_agent()
            if agent is not None and agent.never_served():
                return self._without_resident(agent, verb, payload, deadline)
            raise TransportError(f"{self.host.name}: connection lost: {exc or type(exc).__name__}") from None
        if line is None and agent.never_served():
            self._drop_agent()
            return self._without_resident(agent, verb, payload, deadline)
        if line is None:  # the agent exited without answering: say why, as a one-shot run would
            result = agent.ended(deadline, time.monotonic() - started)
            self._drop_agent()
            if result.exit_code == -1 and not agent.channel.eof_received:
                raise TransportError(f"{self.host.name}: connection lost: the connection closed while the agent ran")
            return parse_agent_reply(self.host.name, verb, result)
        reply = decode_agent_reply(self.host.name, verb, CommandResult(0, line, "", time.monotonic() - started))
        if agent.resident_key is not None:
            self._note_resident(agent.resident_key, reply)
            agent.resident_key = None
        return agent_result(self.host.name, reply)

    def _without_resident(self, agent: "_AgentChannel", verb: str, payload: dict[str, Any],
                          deadline: float) -> dict[str, Any]:
        """The call again through an agent started for it: the resident went away before it took the request (it
        closes without its greeting only then, e.g. killed as we connected), so nothing of the request ran."""
        if agent.book_key is not None:
            self._residents.forget(agent.book_key)
        return self.call_agent(verb, payload, timeout=max(1.0, deadline - time.monotonic()))

    def _note_resident(self, key: str, reply: dict[str, Any]) -> None:
        """Remember what the first answer of an agent started to linger says about the host's resident."""
        if reply.get("resident_alive"):
            # sshd would not connect us to a resident that is there: it forbids unix-socket channels.
            self._residents.forget(key, prohibited=True)
        elif isinstance(reply.get("resident"), str):
            self._residents.record(key, reply["resident"])

    def _start_agent(self, timeout: float) -> "_AgentChannel":
        """The agent for this session: the host's resident when it has one, else a new one started by exec."""
        from ddops.transport.agent import agent_digest, agent_source, bootstrap_command

        transport = self._client.get_transport()
        host, linger, refused = self.host, 0.0, False
        key = resident_key(host.user, host.address, host.port, host.python, agent_digest())
        if self._residents is not None and host.agent_linger > 0:
            socket_path = self._residents.socket_for(key)
            if socket_path is not None:
                try:
                    channel = open_unix_socket_channel(transport, socket_path, timeout)
                except paramiko.ChannelException as exc:
                    # Gone (it idled out, the host rebooted), or refused by sshd's configuration: OpenSSH says
                    # "connect failed" for both, so the agent started now checks whether the resident is there.
                    refused = True
                    self._residents.forget(key, prohibited=exc.code == OPEN_ADMINISTRATIVELY_PROHIBITED)
                else:
                    self.agent_mode = "resident"
                    return _AgentChannel(channel, b"", host.name, resident=True, book_key=key)
            if self._residents.may_linger(key):
                linger = host.agent_linger
        source = agent_source()
        channel = transport.open_session(timeout=timeout)
        channel.exec_command(bootstrap_command(host.python, len(source), digest=agent_digest(), serve=True,
                                               linger=linger, probe_resident=refused))
        self.agent_mode = "started"
        return _AgentChannel(channel, source, host.name, resident_key=key if linger else None)

    def _drop_agent(self) -> None:
        agent, self._agent = self._agent, None
        if agent is not None:
            try:
                agent.channel.close()
            except Exception:  # noqa: BLE001 - the channel may already be gone with its connection
                pass

    def close(self) -> None:
        try:
            if self._agent is not None:
                try:
                    # EOF: the agent, idle between requests, exits. Wait (briefly) for that, so that it has ended,
                    # reaped by sshd, when the connection goes, rather than being left to finish as an orphan.
                    # A resident's session process ends the same way, but a socket channel has no exit status.
                    self._agent.channel.shutdown_write()
                    if not self._agent.resident:
                        self._agent.channel.status_event.wait(AGENT_EXIT_WAIT)
                except Exception:  # noqa: BLE001
                    pass
                self._drop_agent()
            if self._sftp is not None:
                self._sftp.close()
        finally:
            self._client.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AgentChannel:
    """The agent running in `--serve` mode on one exec channel: a JSON request per line in, a JSON answer per line out."""

    def __init__(self, channel: paramiko.Channel, source: bytes, host_name: str, *, resident: bool = False,
                 resident_key: str | None = None, book_key: str | None = None) -> None:
        self.channel = channel
        self.host_name = host_name
        self.pending_source = source  # sent once, ahead of the first request
        self.resident = resident  # a channel to the host's resident agent rather than an exec'd one
        self.resident_key = resident_key  # until the first answer says where the agent will stay on
        self.book_key = book_key  # the resident's entry in the ResidentBook
        # A resident's session process greets with an empty line once it has been forked for us.
        self.greeted = not resident
        self.answered = False
        self.out = bytearray()
        self.err = bytearray()

    def never_served(self) -> bool:
        """A resident channel that ended before the resident took anything from it."""
        return self.resident and not self.greeted and not self.answered

    def read_line(self, deadline: float, timeout: float) -> str | None:
        """The next answer line, decoded; None when the agent's output ended first."""
        channel = self.channel
        self.pending_source = b""
        scanned = 0  # answers can be megabytes (a snapshot of many files): look for the newline in new bytes only
        while True:
            end = self.out.find(b"\n", scanned)
            if end == 0 and not self.greeted:
                self.greeted = True
                del self.out[:1]
                continue
            if end >= 0:
                with memoryview(self.out) as view:
                    line = str(view[:end + 1], "utf-8", "replace")
                del self.out[:end + 1]
                self.answered = True
                return line
            scanned = len(self.out)
            progressed = False
            while channel.recv_ready():
                chunk = channel.recv(READ_CHUNK)
                if not chunk:
                    break
                self.out += chunk
                progressed = True
            while channel.recv_stderr_ready():
                self.err += channel.recv_stderr(READ_CHUNK)
                del self.err[:-MAX_AGENT_STDERR]
                progressed = True
            if progressed:
                continue
            if channel.eof_received or channel.closed:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"{self.host_name}: agent request timed out after {timeout:g}s and was cut off")
            select.select([channel], [], [], min(remaining, 0.2))

    def ended(self, deadline: float, duration: float) -> CommandResult:
        """What the agent left behind when it stopped without an answer: exit status, output, stderr."""
        channel = self.channel
        channel.status_event.wait(max(0.0, min(deadline - time.monotonic(), 5.0)))
        while channel.recv_stderr_ready():
            self.err += channel.recv_stderr(READ_CHUNK)
        code = channel.exit_status if channel.exit_status_ready() else -1
        return CommandResult(code, self.out.decode("utf-8", "replace"), self.err.decode("utf-8", "replace"),
                             duration)


def parse_agent_reply(host: str, verb: str, result: CommandResult) -> dict[str, Any]:
    """The agent's `result`, or an AgentError saying what went wrong on which host."""
    return agent_result(host, decode_agent_reply(host, verb, result))


def decode_agent_reply(host: str, verb: str, result: CommandResult) -> dict[str, Any]:
    """The agent's whole reply document, or an AgentError when its output is not one."""
    try:
        reply = json.loads(result.stdout)
    except ValueError:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        if result.exit_code == 127 or "not found" in tail[0]:
            raise AgentError(f"{host}: agent could not start (is the host's python installed?): {tail[0]}") from None
        raise AgentError(f"{host}: agent {verb} failed (exit {result.exit_code}): {tail[0]}") from None
    if not isinstance(reply, dict) or "ok" not in reply:
        raise AgentError(f"{host}: agent {verb} answered something that is not its protocol")
    return reply


def agent_result(host: str, reply: dict[str, Any]) -> dict[str, Any]:
    """The `result` of a decoded reply, or the AgentError it reports."""
    if not reply["ok"]:
        error = reply.get("error") or {}
        raise AgentError(f"{host}: {error.get('message', 'agent error')}", kind=error.get("kind", "error"))
    return reply.get("result") or {}


class Connector:
    """Opens Sessions: verifies host keys, honours ProxyJump through inventory hosts, sets TCP_NODELAY."""

    def __init__(self, known_hosts: str | os.PathLike[str], *, accept_new: bool = False,
                 jump_hosts: Iterable[Host] = (), connect_timeout: float | None = None,
                 residents: ResidentBook | None = None) -> None:
        self.known_hosts = Path(os.path.expanduser(str(known_hosts)))
        self.accept_new = accept_new
        self.connect_timeout = connect_timeout
        self.residents = residents if residents is not None else ResidentBook()
        self._known = _KnownHosts(self.known_hosts)
        self._keys: dict[str, paramiko.PKey | None] = {}
        self._keys_lock = threading.Lock()
        self._jump_hosts = {h.name: h for h in jump_hosts}
        self._jumps: dict[str, Session] = {}
        self._jump_lock = threading.Lock()

    def connect(self, host: Host) -> Session:
        started = time.monotonic()
        timeout = self.connect_timeout or host.connect_timeout
        sock = self._open_socket(host, timeout)
        client = paramiko.SSHClient()
        name = _known_hosts_name(host.address, host.port)
        try:
            for key_type, key in self._known.keys_for(host, name):
                client.get_host_keys().add(name, key_type, key)
        except HostKeyError:
            sock.close()
            raise
        client.set_missing_host_key_policy(_HostKeyPolicy(host, self.known_hosts, self.accept_new))
        key_file = os.path.expanduser(host.identity_file) if host.identity_file else None
        if key_file and not os.path.exists(key_file):
            sock.close()
            raise TransportError(f"{host.name}: identity_file {host.identity_file} does not exist")
        key = self._private_key(key_file) if key_file else None
        try:
            client.connect(
                host.address, port=host.port, username=host.user, pkey=key,
                key_filename=key_file if key is None else None,
                look_for_keys=key_file is None, allow_agent=True, sock=sock, timeout=timeout,
                banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
            )
        except paramiko.BadHostKeyException as exc:
            sock.close()
            raise HostKeyError(
                f"{host.name}: host key CHANGED for {exc.hostname} (got {exc.key.get_name()}); refusing to connect. "
                f"If the host was reinstalled, remove the old key with: ssh-keygen -f {self.known_hosts} "
                f"-R '{_known_hosts_name(host.address, host.port)}'"
            ) from None
        except HostKeyError:
            sock.close()
            raise
        except paramiko.AuthenticationException as exc:
            sock.close()
            raise TransportError(f"{host.name}: authentication failed for {host.user}@{host.address}: {exc}") from None
        except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
            sock.close()
            raise TransportError(_handshake_failure(host, key_file, timeout, exc)) from None
        transport = client.get_transport()
        transport.set_keepalive(15)
        return Session(host, client, time.monotonic() - started, self.residents)

    def _private_key(self, path: str) -> paramiko.PKey | None:
        """The identity file's key, read once per run (paramiko reads it per connection, trying each key type);
        None when it cannot be read without help (a passphrase), which paramiko then handles as before."""
        with self._keys_lock:
            if path not in self._keys:
                try:
                    self._keys[path] = paramiko.PKey.from_path(path)
                except (paramiko.SSHException, OSError, ValueError):
                    self._keys[path] = None
            return self._keys[path]

    def _open_socket(self, host: Host, timeout: float) -> Any:
        if host.proxy_jump:
            return self._jump_channel(host, timeout)
        try:
            sock = socket.create_connection((host.address, host.port), timeout=timeout)
        except socket.timeout:
            raise TransportError(f"{host.name}: connect to {host.address}:{host.port} timed out after {timeout:g}s") from None
        except OSError as exc:
            raise TransportError(f"{host.name}: cannot connect to {host.address}:{host.port}: "
                                 f"{exc.strerror or exc}") from None
        # paramiko's small writes otherwise wait on Nagle's algorithm: ~50 ms per command round trip.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _quick_ack(sock)

    def _jump_channel(self, host: Host, timeout: float) -> paramiko.Channel:
        hops = [h.strip() for h in host.proxy_jump.split(",") if h.strip()]
        if len(hops) != 1:
            raise TransportError(f"{host.name}: only one ProxyJump hop is supported, got {host.proxy_jump!r}")
        jump = self._jump_session(hops[0], host)
        try:
            return jump._client.get_transport().open_channel(
                "direct-tcpip", (host.address, host.port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.SSHException, OSError) as exc:
            raise TransportError(f"{host.name}: jump host {jump.host.name} cannot reach "
                                 f"{host.address}:{host.port}: {exc}") from None

    def _jump_session(self, spec: str, for_host: Host) -> Session:
        with self._jump_lock:
            if spec in self._jumps:
                return self._jumps[spec]
            jump_host = self._jump_hosts.get(spec) or _host_from_spec(spec, for_host)
            session = self.connect(jump_host)
            self._jumps[spec] = session
            return session

    def close(self) -> None:
        with self._jump_lock:
            for session in self._jumps.values():
                session.close()
            self._jumps.clear()
        self.residents.save()


# SSH_MSG_CHANNEL_OPEN_FAILURE reason (RFC 4254 5.1): sshd's configuration forbids the channel.
OPEN_ADMINISTRATIVELY_PROHIBITED = 1
UNIX_SOCKET_CHANNEL = "direct-streamlocal@openssh.com"


def open_unix_socket_channel(transport: paramiko.Transport, socket_path: str, timeout: float) -> paramiko.Channel:
    """A channel to a unix socket on the host, which sshd connects for us (OpenSSH's direct-streamlocal).

    paramiko's open_channel builds the open message only for the channel kinds it knows, so this does what it
    does for those (same message, window and bookkeeping) with the streamlocal fields: path, reserved string,
    reserved uint32. Raises paramiko.ChannelException when sshd refuses (no such socket, or forbidden).
    """
    from paramiko.channel import Channel
    from paramiko.common import cMSG_CHANNEL_OPEN
    from paramiko.message import Message

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


def _handshake_failure(host: Host, key_file: str | None, timeout: float, exc: BaseException) -> str:
    """One line saying what went wrong while opening the SSH session, in the user's terms."""
    text = str(exc) or type(exc).__name__
    where = f"{host.address}:{host.port}"
    # A listener that never sends the SSH banner makes paramiko give up with one of these.
    if "banner" in text.lower() or text == "No existing session" or isinstance(exc, (EOFError, socket.timeout)):
        return f"{host.name}: {where} accepted the connection but did not speak SSH within {timeout:g}s"
    if key_file and ("key" in text.lower() or isinstance(exc, ValueError)):
        return f"{host.name}: identity_file {host.identity_file} is not a usable private key: {text}"
    return f"{host.name}: SSH handshake with {where} failed: {text}"


def _host_from_spec(spec: str, template: Host) -> Host:
    """A jump host given as [user@]host[:port] rather than an inventory name."""
    user, _, rest = spec.rpartition("@")
    address, port = rest, 22
    if rest.count(":") == 1:
        address, port_text = rest.split(":")
        port = int(port_text)
    return Host(name=spec, address=address, port=port, user=user or template.user,
                identity_file=template.identity_file, connect_timeout=template.connect_timeout)
