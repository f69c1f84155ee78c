"""What every task needs: the AgentSession seam it talks to a host through, and who is acting."""

from __future__ import annotations

import getpass
import os
import re
import shlex
import socket
from typing import Any, Protocol


class CommandOutput(Protocol):
    """The result of a shell command on a host (ddops.transport.CommandResult is one)."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool: ...


class AgentSession(Protocol):
    """A connection to one host's agent: the SSH Session, or ddops.transport.local.LocalSession in tests."""

    def call_agent(self, verb: str, payload: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """The agent's `result` for one request; an agent-side error raises AgentError(kind, message)."""
        ...

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> CommandOutput:
        """A shell command on the host (check commands)."""
        ...

    def put_file(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a local file to the host (sync's bundles)."""
        ...

    def get_file(self, remote_path: str, local_path: str | os.PathLike[str], *, max_bytes: int | None = None) -> None:
        """Copy a file of the host here (collected bench results); DdopsError past max_bytes."""
        ...

    def close(self) -> None: ...


def default_actor() -> str:
    """Who is running ddops (`user@machine`), as recorded in the remote journal, lock and bench runs."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry and no $USER in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


_LOGIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


def shell_path(path: str) -> str:
    """`path` as one shell word, its leading `~` or `~user` left for the host's shell to expand.

    shlex.quote alone hands `cd` a literal '~/repo', a directory that does not exist: the inventory's `repo:`
    may start with `~`, and only the host knows whose home that is."""
    head, slash, rest = path.partition("/")
    if head.startswith("~") and (head == "~" or _LOGIN_NAME.match(head[1:])):
        return head + (slash + shlex.quote(rest) if rest else slash)
    return shlex.quote(path)
