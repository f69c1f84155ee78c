"""A small, pure reader for the parts of ~/.ssh/config that ddops honours.

Supported: `Host` blocks with patterns (`*`, `?`, `!negation`), and HostName, User, Port, IdentityFile, ProxyJump.
As in OpenSSH, the first value obtained for a key wins. `Match` blocks are skipped (not evaluated).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

HONOURED = {"hostname": "hostname", "user": "user", "port": "port", "identityfile": "identity_file",
            "proxyjump": "proxy_jump"}


@dataclass(frozen=True, slots=True)
class SshConfigEntry:
    """One Host block: its patterns and the honoured options in it."""

    patterns: tuple[str, ...]
    options: tuple[tuple[str, str], ...]

    def matches(self, name: str) -> bool:
        positive = False
        for pattern in self.patterns:
            if pattern.startswith("!"):
                if fnmatch.fnmatchcase(name, pattern[1:]):
                    return False
            elif fnmatch.fnmatchcase(name, pattern):
                positive = True
        return positive


@dataclass(frozen=True, slots=True)
class SshConfig:
    entries: tuple[SshConfigEntry, ...] = ()

    def lookup(self, name: str) -> dict[str, str]:
        """The honoured options for `name` (keys: hostname, user, port, identity_file, proxy_jump)."""
        found: dict[str, str] = {}
        for entry in self.entries:
            if entry.matches(name):
                for key, value in entry.options:
                    found.setdefault(key, value)
        if "hostname" in found:
            found["hostname"] = found["hostname"].replace("%h", name)
        return found

    def aliases(self) -> set[str]:
        """Literal (non-wildcard) host names defined by Host lines."""
        return {p for e in self.entries for p in e.patterns if not p.startswith("!") and not set(p) & set("*?")}


def parse_ssh_config(text: str) -> SshConfig:
    entries: list[SshConfigEntry] = []
    patterns: tuple[str, ...] | None = ("*",)  # options before the first Host line apply to all hosts
    options: list[tuple[str, str]] = []

    def flush() -> None:
        if patterns is not None and options:
            entries.append(SshConfigEntry(patterns, tuple(options)))

    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.replace("=", " ", 1).partition(" ") if "=" in line.split()[0] else line.partition(" ")
        key, value = key.strip().lower(), value.strip().strip('"')
        if key == "host":
            flush()
            patterns, options = tuple(value.split()), []
        elif key == "match":
            flush()
            patterns, options = None, []
        elif key in HONOURED and patterns is not None:
            options.append((HONOURED[key], value))
    flush()
    return SshConfig(tuple(entries))


def load_ssh_config(path: str | os.PathLike[str] | None) -> SshConfig:
    """Read an ssh_config file; a missing file is an empty config."""
    if path is None:
        return SshConfig()
    p = Path(path).expanduser()
    try:
        return parse_ssh_config(p.read_text(encoding="utf-8", errors="replace"))
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return SshConfig()
