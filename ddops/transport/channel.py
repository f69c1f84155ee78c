"""Moving bytes on one SSH channel: send with a deadline, and the one reader of a channel's stdout and stderr."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from ddops import settings
from ddops.errors import Cancelled, CommandTimeout, TransportError, UsageError

READ_CHUNK = 1 << 16
# What the controller holds of one answer: an agent's answer line (a snapshot of many files is megabytes) and a
# command's kept output. More is refused, never gathered: a host cannot make the controller run out of memory.
DEFAULT_MAX_AGENT_ANSWER = 256 << 20
DEFAULT_MAX_COMMAND_OUTPUT = 64 << 20
# And of everything every host sent that is held at once: the caps above are per call, and calls run in parallel.
DEFAULT_MAX_HELD_OUTPUT = 512 << 20


def _byte_limit(setting: settings.Setting, default: int) -> int:
    raw = setting.value()
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise UsageError(f"{setting.name}={raw!r}: not a whole number of bytes above 0")
    return limit


def max_agent_answer() -> int:
    """Bytes of one agent answer the controller takes (DDOPS_MAX_AGENT_ANSWER)."""
    return _byte_limit(settings.MAX_AGENT_ANSWER, DEFAULT_MAX_AGENT_ANSWER)


def max_command_output() -> int:
    """Bytes of a command's stdout and stderr together the controller keeps (DDOPS_MAX_COMMAND_OUTPUT)."""
    return _byte_limit(settings.MAX_COMMAND_OUTPUT, DEFAULT_MAX_COMMAND_OUTPUT)


def max_held_output() -> int:
    """Bytes of all hosts' output the controller holds at once (DDOPS_MAX_HELD_OUTPUT)."""
    return _byte_limit(settings.MAX_HELD_OUTPUT, DEFAULT_MAX_HELD_OUTPUT)


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"


def output_too_large(host_name: str, what: str, limit: int) -> TransportError:
    return TransportError(f"the {what} sent more than {_size(limit)} of output: refused (cut off)", host=host_name)


class HeldOutput:
    """What the controller holds of the hosts' output, all hosts together, against max_held_output()."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0

    def take(self, size: int) -> bool:
        """Count `size` more bytes as held; False (nothing counted) when that would pass the bound."""
        limit = max_held_output()
        with self._lock:
            if self.held + size > limit:
                return False
            self.held += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.held -= size


HELD = HeldOutput()


class Share:
    """One call's part of HELD: what it keeps is counted as it arrives, and given back as it is used or dropped."""

    def __init__(self, host_name: str) -> None:
        self.host_name = host_name
        self.size = 0

    def grow(self, size: int) -> None:
        """Count `size` more bytes; TransportError for this host when all hosts together would hold too much."""
        if not HELD.take(size):
            raise TransportError(f"the controller already holds {_size(max_held_output())} of the hosts' output "
                                 f"({settings.MAX_HELD_OUTPUT.name}): refused (cut off)", host=self.host_name)
        self.size += size

    def shrink(self, size: int) -> None:
        HELD.give(size)
        self.size -= size

    def release(self) -> None:
        self.shrink(self.size)


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


def send_all(channel: paramiko.Channel, data: bytes, deadline: float, host_name: str) -> None:
    """Write all of `data`, waiting for window space; CommandTimeout past the deadline."""
    view = memoryview(data)
    while view:
        if time.monotonic() > deadline:
            raise CommandTimeout("timed out sending input", host=host_name)
        if channel.send_ready():
            sent = channel.send(view[:READ_CHUNK])  # type: ignore[arg-type]  # paramiko takes any buffer
            view = view[sent:]
        else:
            select.select([], [], [], 0.01)


class _Arrivals:
    """What a channel's two input buffers signal when bytes or their end arrive, in place of paramiko's select pipe.

    `select.select([channel])` makes paramiko open an OS pipe per channel that its transport thread writes to as
    data arrives, and `channel.close()` closes that pipe from our thread while the transport thread may still be
    writing to it: a channel closed while the host was still sending (a command cut off at the output cap) could
    make the transport thread's write hit a closed descriptor (EBADF), which kills the whole connection, or one that
    was reused since. An Event has no descriptor to race on. The buffers call `clear()` when they run empty; the
    reader clears `arrived` itself before it looks, so that no-op loses nothing."""

    def __init__(self) -> None:
        self.arrived = threading.Event()

    def set(self) -> None:
        self.arrived.set()

    def clear(self) -> None:
        pass


class ChannelReader:
    """A channel's stdout and stderr, gathered into `out` and `err` until the caller has what it waits for.

    Used both for a command (read until it ends) and for the agent (read until an answer line), so that the two
    cannot drift apart in how they wait, time out or notice a dead channel."""

    def __init__(self, channel: paramiko.Channel, host_name: str, *, max_err: int | None = None,
                 on_output: Callable[[str, bytes], None] | None = None,
                 max_out: int | None = None, too_much: Callable[[], Exception] | None = None) -> None:
        self.channel = channel
        self.share = Share(host_name)  # what out and err hold (release() gives it back)
        self._arrivals = _Arrivals()
        # BufferedPipe only calls set() and clear() on its event (the stubs ask for a threading.Event).
        channel.in_buffer.set_event(self._arrivals)  # type: ignore[arg-type]
        channel.in_stderr_buffer.set_event(self._arrivals)  # type: ignore[arg-type]
        self._max_out = max_out  # stdout (and stderr, unless max_err keeps its end) beyond this: too_much()
        self._too_much = too_much
        self._on_output = on_output  # streamed: each chunk goes there as it arrives and is not kept
        self.out = bytearray()
        self.err = bytearray()
        self._max_err = max_err  # keep only the end of stderr (a long-lived agent's)

    def _pump(self) -> bool:
        """Take whatever has arrived; True when something had."""
        channel, progressed = self.channel, False
        while channel.recv_ready():
            chunk = channel.recv(READ_CHUNK)
            if not chunk:
                break
            if self._on_output is not None:
                self._on_output("stdout", chunk)
            else:
                self.out += chunk
                self._check_size(len(chunk))
            progressed = True
        while channel.recv_stderr_ready():
            chunk = channel.recv_stderr(READ_CHUNK)
            progressed = True
            if self._on_output is not None:
                self._on_output("stderr", chunk)
                continue
            self.err += chunk
            if self._max_err is not None:
                del self.err[:-self._max_err]
            else:
                self._check_size(len(chunk))
        return progressed

    def _check_size(self, added: int) -> None:
        if self._max_out is not None and len(self.out) + len(self.err) > self._max_out:
            raise self._too_much() if self._too_much else TransportError(f"more than {self._max_out} bytes")
        self.share.grow(added)

    def release(self) -> None:
        """Give back what this reader's buffers were counted for (call once it is done with them)."""
        self.share.release()

    def read_until(self, done: Callable[[], bool], deadline: float, timed_out: Callable[[], Exception],
                   cancel: threading.Event | None = None) -> bool:
        """Read until `done()` (checked once nothing more is ready): True; or until the channel closed: False.

        Past the deadline raises `timed_out()`; once `cancel` is set, Cancelled (within one wait of 0.2 s)."""
        channel, arrived = self.channel, self._arrivals.arrived
        while True:
            arrived.clear()  # before looking: what arrives from here on wakes the wait below
            if self._pump():
                continue
            if done():
                return True
            if channel.closed:
                return False
            if cancel is not None and cancel.is_set():
                raise Cancelled("interrupted")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timed_out()
            # After EOF no byte comes; what may still come is the exit status (or the close), which sets status_event.
            (channel.status_event if channel.eof_received else arrived).wait(min(remaining, 0.2))

    def drain(self, deadline: float, timed_out: Callable[[], Exception], cancel: threading.Event | None = None) -> None:
        """Read a command's output to its end: EOF and exit status both in, or the channel closed."""
        channel = self.channel
        self.read_until(lambda: bool(channel.eof_received) and channel.exit_status_ready(), deadline, timed_out, cancel)

    def next_line(self, deadline: float, timed_out: Callable[[], Exception]) -> str | None:
        """The next line of stdout with its newline, decoded; None when stdout ended (EOF or closed) first."""
        end = self.out.find(b"\n")
        if end < 0:
            scanned = len(self.out)  # answers can be megabytes (a snapshot of many files): search new bytes only

            def line_or_eof() -> bool:
                nonlocal scanned, end
                end = self.out.find(b"\n", scanned)
                scanned = len(self.out)
                return end >= 0 or bool(self.channel.eof_received)

            self.read_until(line_or_eof, deadline, timed_out)  # either way, `end` is from a last look at `out`
        if end < 0:
            return None
        with memoryview(self.out) as view:
            line = str(view[:end + 1], "utf-8", "replace")
        del self.out[:end + 1]
        self.share.shrink(min(end + 1, self.share.size))
        return line
