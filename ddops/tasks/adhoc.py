"""Ad-hoc commands across the fleet (`ddops exec`): the remote command line, per-host results, grouped output.

The pure parts (how the command line is built and quoted, how results are read and grouped) need no host; the
per-host task needs a session with `stream(command, on_output, timeout=)`."""

from __future__ import annotations

import ast
import codecs
import functools
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddops.errors import UsageError
from ddops.fleet import FAILED, OK, HostStatus, TaskOutcome
from ddops.inventory import Host
from ddops.jsonvalue import JsonValue
from ddops.resources import remote_dir
from ddops.tasks.base import shell_path
from ddops.transport.channel import HeldOutput

# Seconds between the guard's TERM and its KILL, for commands that ignore TERM (remote/exec_guard.py).
KILL_AFTER = 5.0
# The controller gives up on a host this long after the guard should have ended the command.
CONTROLLER_GRACE = 10.0
# Output kept per host and stream for --json and --group (and, all hosts together, at most the controller-wide
# max_held_output()); streamed output is never cut.
MAX_KEPT_BYTES = 1 << 20
# Characters of a streamed line held before it is handed on in pieces: output without newlines stays bounded.
MAX_LINE_CHARS = 1 << 16
# The guard exits 124 when it sent TERM, and 128+9 when it had to KILL.
TIMEOUT_EXITS = (124, 137)


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """What to run on every host: a program and its arguments (each word quoted), or an explicit shell line."""

    argv: tuple[str, ...] = ()
    shell: str | None = None
    in_repo: bool = False
    sudo: bool = False
    timeout: float | None = None  # None: each host's command_timeout

    def __post_init__(self) -> None:
        if bool(self.argv) == (self.shell is not None):
            raise UsageError("give a command after `--` or one --shell 'CMD | CMD', not both and not neither")
        if self.shell is not None and not self.shell.strip():
            raise UsageError("--shell needs a command")
        if self.timeout is not None and self.timeout <= 0:
            raise UsageError("--timeout must be more than 0 seconds")

    def timeout_for(self, host: Host) -> float:
        return self.timeout if self.timeout is not None else host.command_timeout


def remote_command(spec: ExecSpec, host: Host) -> str:
    """The one line sshd hands to the host's login shell; every word from the user goes in quoted.

    argv words are quoted one by one, so `'; touch /tmp/x'` stays one argument; a --shell line is quoted whole and
    run by the user's own shell (`$SHELL -c`, as sshd would). The guard (remote/exec_guard.py, run with the host's
    python) runs it in a process group of its own and ends that whole group when --timeout passes (TERM, then
    KILL), inside sudo when there is one, so that it has the command's privileges."""
    if spec.shell is not None:
        # $SHELL is expanded by the login shell running this line: the same shell sshd would have run it with.
        words = ['"${SHELL:-/bin/sh}"', "-c", shlex.quote(spec.shell)]
    else:
        words = [shlex.quote(word) for word in spec.argv]
    cd_first = spec.in_repo
    if spec.sudo and host.user != "root":
        if spec.in_repo:
            # The directory change under sudo too: a repo that root owns may be closed to the login user.
            words = ["sh", "-c", shlex.quote('cd "$1" && shift && exec "$@"'), "ddops-exec",
                     shell_path(host.repo)] + words
            cd_first = False
    words = guard_words(host, spec.timeout_for(host)) + words
    if spec.sudo and host.user != "root":
        # -n: never prompt. A fleet run has no one to type a password; sudo then fails, and sudo_refusal says so.
        words = ["sudo", "-n", "--"] + words
    line = "exec " + " ".join(words)
    if cd_first:
        line = f"cd {shell_path(host.repo)} && {line}"
    return line


# Ctrl-C ends the command on the host: sshd refuses the SSH "signal" request for root logins, so a watchdog started
# before the command reads the channel's stdin and, on STOP_LINE, TERMs the login shell's process group (sshd made
# the login shell a session leader: its pid is the group's id), which the guard (or sudo, which passes it on to the
# guard) is in: the guard then ends the command's own group, TERM first, KILL after KILL_AFTER seconds. A KILL from
# here could only end the guard, not the command, which runs in a session of its own. Any other end of stdin (the
# command finished, a session that gives no stdin) leaves everything alone.
STOP_LINE = b"stop\n"


def with_watchdog(line: str) -> str:
    """`line` preceded by the stdin watchdog; the command itself reads /dev/null, as it did before."""
    watchdog = ("{ trap '' TERM; read -r w <&3; [ \"$w\" = stop ] && kill -0 $$ && kill -TERM -$$; "
                "} </dev/null >/dev/null 2>&1 &")
    return f"exec 3<&0; {watchdog} exec 3<&- </dev/null; {line}"


def guard_words(host: Host, timeout: float) -> list[str]:
    """The guard's command line, before the command's words: `PYTHON -S -c SOURCE TIMEOUT GRACE`, quoted."""
    python = host.python
    # A bare name is looked up in the login user's PATH here, before sudo (whose secure_path may lack it) runs it.
    quoted = shlex.quote(python)
    word = shell_path(python) if "/" in python else f'"$(command -v {quoted} || echo {quoted})"'
    return [word, "-S", "-c", shlex.quote(guard_source()), f"{timeout:g}", f"{KILL_AFTER:g}"]


@functools.cache
def guard_source() -> str:
    """remote/exec_guard.py without its docstrings and comments (it goes on every command line)."""
    tree = ast.parse((remote_dir() / "exec_guard.py").read_text())
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # only these hold docstrings
        body = node.body
        if body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def sudo_refusal(spec: ExecSpec, host: Host, exit_code: int, stderr: str) -> str | None:
    """Why sudo (not the command) refused, in one line; None when sudo ran the command or was not asked for."""
    if not spec.sudo or host.user == "root":
        return None
    first = next((line.strip() for line in stderr.splitlines() if line.strip()), "")
    if exit_code == 127 and "sudo" in first and ("No such file" in first or "not found" in first):
        return f"--sudo: sudo is not installed on the host (user {host.user})"
    if exit_code == 1 and first.startswith("sudo:"):
        if "password is required" in first or "terminal is required" in first:
            return (f"--sudo: sudo wants a password for {host.user}, and ddops never prompts in a fleet "
                    f"run (sudo -n): allow the command without a password (NOPASSWD in sudoers), or connect as root")
        return f"--sudo: {first}"
    if exit_code == 1 and "may not run sudo" in first:
        return f"--sudo: {first}"
    return None


def timed_out(exit_code: int, duration: float, timeout: float) -> bool:
    """Whether the host's `timeout` ended the command (its exit codes alone could be the command's own)."""
    return exit_code in TIMEOUT_EXITS and duration >= timeout * 0.98


@dataclass(frozen=True, slots=True)
class ExecOutput(JsonValue):
    """What the command did on one host, and the command line that ran there."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # output past MAX_KEPT_BYTES per stream was shown while streaming, but not kept
    command: str = ""


@dataclass(frozen=True, slots=True)
class OutputGroup:
    """Hosts whose command ended alike: the same exit code, stdout and stderr."""

    hosts: tuple[str, ...]
    output: ExecOutput


def group_outputs(outputs: Mapping[str, ExecOutput]) -> list[OutputGroup]:
    """Hosts grouped by identical output and exit code: biggest group first, then in host order."""
    groups: dict[tuple[int, str, str, bool], list[str]] = {}
    first: dict[tuple[int, str, str, bool], ExecOutput] = {}
    for host, out in outputs.items():
        key = (out.exit_code, out.stdout, out.stderr, out.timed_out)
        groups.setdefault(key, []).append(host)
        first.setdefault(key, out)
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))  # stable: ties keep host order
    return [OutputGroup(tuple(hosts), first[key]) for key, hosts in ordered]


class LineSplitter:
    """Bytes in as they arrive, whole decoded lines out (a UTF-8 character split across chunks stays whole)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        text = self._partial + self._decoder.decode(data)
        *lines, partial = text.split("\n")
        while len(partial) > MAX_LINE_CHARS:
            lines.append(partial[:MAX_LINE_CHARS])
            partial = partial[MAX_LINE_CHARS:]
        self._partial = partial
        return lines

    def flush(self) -> list[str]:
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [rest] if rest else []


@dataclass(slots=True)
class _Kept:
    """One stream's output, kept up to MAX_KEPT_BYTES and as far as the run's `held` bound allows."""

    held: HeldOutput
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> None:
        keep = chunk[:max(MAX_KEPT_BYTES - len(self.data), 0)]
        if keep and not self.held.take(len(keep)):
            keep = b""
        self.truncated = self.truncated or len(keep) < len(chunk)
        self.data += keep

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


LineSink = Callable[[str, str, str], None]  # (host name, "stdout" | "stderr", line without its newline)


def exec_host(host: Host, session: Any, spec: ExecSpec, on_line: LineSink | None = None,
              cancel: threading.Event | None = None, held: HeldOutput | None = None) -> TaskOutcome:
    """Run the command on one host; each output line goes to on_line as it arrives; the outcome's report is its
    ExecOutput. Once `cancel` is set the command is ended on the host and Cancelled raised. `held`: the bound on
    what all hosts of a run keep (one HeldOutput for the whole run; by default this host's own)."""
    command = remote_command(spec, host)
    timeout = spec.timeout_for(host)
    held = held if held is not None else HeldOutput()
    kept = {"stdout": _Kept(held), "stderr": _Kept(held)}
    splitters = {"stdout": LineSplitter(), "stderr": LineSplitter()}

    def on_output(stream: str, chunk: bytes) -> None:
        kept[stream].add(chunk)
        if on_line is not None:
            for line in splitters[stream].feed(chunk):
                on_line(host.name, stream, line)

    started = time.monotonic()
    try:
        exit_code = session.stream(with_watchdog(command), on_output, timeout=timeout + KILL_AFTER + CONTROLLER_GRACE,
                                   cancel=cancel, cancel_input=STOP_LINE)
    finally:
        if on_line is not None:
            for stream, splitter in splitters.items():
                for line in splitter.flush():
                    on_line(host.name, stream, line)
    duration = time.monotonic() - started
    output = ExecOutput(exit_code, kept["stdout"].text(), kept["stderr"].text(),
                        timed_out=timed_out(exit_code, duration, timeout),
                        truncated=kept["stdout"].truncated or kept["stderr"].truncated, command=command)
    return TaskOutcome(*outcome_of(spec, host, output), output)


def outcome_of(spec: ExecSpec, host: Host, output: ExecOutput) -> tuple[HostStatus, str]:
    """(status, message) of one host's run: ok on exit 0, failed otherwise, saying why in one line."""
    if output.exit_code == 0:
        return OK, "exit 0"
    refusal = sudo_refusal(spec, host, output.exit_code, output.stderr)
    if refusal:
        return FAILED, refusal
    if output.timed_out:
        return FAILED, f"timed out after {spec.timeout_for(host):g}s (ended on the host)"
    if output.exit_code == -1:
        return FAILED, "the command ended without an exit status (killed by a signal?)"
    last = next((line.strip() for line in reversed(output.stderr.splitlines()) if line.strip()), "")
    # A program that is not there is reported by the guard: say it in the user's terms.
    missing = re.fullmatch(r"ddops: failed to run command '(.*)': (.*)", last)
    if missing:
        last = f"{missing[1]}: {'command not found' if output.exit_code == 127 else missing[2]}"
    return FAILED, f"exit {output.exit_code}" + (f": {last}" if last else "")


def outputs_of(results: Iterable[Any]) -> dict[str, ExecOutput]:
    """Each host's ExecOutput from fleet results (hosts that never ran the command have none)."""
    return {r.host: r.report for r in results if isinstance(r.report, ExecOutput)}


__all__ = ["STOP_LINE", "ExecOutput", "ExecSpec", "LineSplitter", "OutputGroup", "exec_host", "group_outputs",
           "outcome_of", "outputs_of", "remote_command", "sudo_refusal", "timed_out", "with_watchdog"]
