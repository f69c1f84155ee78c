"""The few errors ddops raises on purpose; each knows its exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_HOST_FAILED = 1
EXIT_USAGE = 2
EXIT_WOULD_CHANGE = 3  # --exit-code: no host failed, and at least one changed (or, with --check, would)
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it


class DdopsError(Exception):
    """A fault ddops reports as one line and an exit code, never as a traceback; `kind` names it for machines (a
    host's `reason` in --json)."""

    exit_code = EXIT_HOST_FAILED
    kind = "error"


class UsageError(DdopsError):
    """Bad command line, bad selection, or anything the user must fix before we start."""

    exit_code = EXIT_USAGE
    kind = "usage"


class InventoryError(UsageError):
    """The inventory file is malformed; the message starts with `file:line:`."""


class PlaybookError(UsageError):
    """A playbook or bench plan is malformed; the message starts with `file:line:`."""


class TestbedError(DdopsError):
    """The local testbed could not be brought up or down."""

    __test__ = False  # not a pytest test class despite the name


class HostError(DdopsError):
    """A fault on one host. `host` names it and `kind` says what went wrong; no message spells the host itself: a
    host's result keeps `message` (every view shows the host beside it, message_for), and str() puts it in front
    where the error is shown alone (`host1: connection lost: ...`)."""

    def __init__(self, message: str, kind: str | None = None, *, host: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.host = host
        if kind is not None:
            self.kind = kind

    def __str__(self) -> str:
        return f"{self.host}: {self.message}" if self.host else self.message


def message_for(host: str, exc: BaseException) -> str:
    """exc's text in a result of `host`, which shows the host beside it: an error about another host (the bastion a
    jump goes through) keeps that host's name."""
    return exc.message if isinstance(exc, HostError) and exc.host == host else str(exc)


class TransportError(HostError):
    """A host could not be reached or stopped answering."""

    kind = "transport"


class HostKeyError(TransportError):
    """A host presented an unknown or changed host key."""

    kind = "host_key"


class ConnectionLost(TransportError):
    """The connection to a host died while something ran on it; the host counts as unreachable."""

    kind = "connection_lost"


class Cancelled(TransportError):
    """The user interrupted (Ctrl-C) a command that was only running: it was ended on the host."""

    exit_code = EXIT_INTERRUPTED
    kind = "cancelled"


class CommandTimeout(TransportError):
    """A remote command ran past its timeout and was cut off."""

    kind = "timeout"


class AgentError(HostError):
    """The remote agent failed or answered something that is not its protocol; `kind` is the agent's error kind
    (remote/ddops_agent/protocol.py, ERROR_KINDS) or one of the controller's own (no_agent_source, error,
    bad_answer)."""


class AgentNoAnswer(AgentError):
    """The agent ended without answering (killed, out of memory): what it was asked may be done in part."""

    kind = "no_answer"
