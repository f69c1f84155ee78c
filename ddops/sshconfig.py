"""~/.ssh/config as OpenSSH reads it: `ssh -G` where an ssh client exists, else a small parser.

ddops honours HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump (a chain `a,b,c` too), HostKeyAlias and
UserKnownHostsFile (its first file). With an `ssh` client, OpenSSH itself resolves each host (Include, Match, tokens,
`=` syntax: everything): one `ssh -G` per distinct name, all at once, only for names the config can affect,
remembered on disk until a file it read changes. Without one, the small parser below reads `Host` blocks with
patterns (`*`, `?`, `!negation`); as in OpenSSH the first value obtained for a key wins; `Match` blocks and `Include`
are skipped."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ddops.errors import UsageError

# What reads a config through ssh (subprocess, threads, json, hashing) is imported only when a config has content:
# `ddops hosts` and `inventory check` with no ~/.ssh/config start without it.

HONOURED = {"hostname": "hostname", "user": "user", "port": "port", "identityfile": "identity_file",
            "proxyjump": "proxy_jump", "userknownhostsfile": "known_hosts", "hostkeyalias": "host_key_alias",
            "identitiesonly": "identities_only"}


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
    """The small parser's reading of a config (the fallback when there is no ssh client)."""

    entries: tuple[SshConfigEntry, ...] = ()

    def lookup(self, name: str) -> dict[str, str]:
        """The honoured options for `name` (keys: hostname, user, port, identity_file, proxy_jump, known_hosts)."""
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

    def knows(self, name: str) -> bool:
        """Whether the config defines `name` as a host (a ProxyJump hop may name one)."""
        return name in self.aliases()

    def prefetch(self, names: Iterable[str]) -> None:
        """Nothing to do ahead: the parser's lookups cost no process."""


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
            options.append((HONOURED[key], value.split()[0] if key == "userknownhostsfile" and value else value))
    flush()
    return SshConfig(tuple(entries))


def load_ssh_config(path: str | os.PathLike[str] | None, *, ssh: str | None = "ssh") -> SshConfig | OpenSshConfig:
    """An ssh_config file as OpenSSH reads it when `ssh` is an installed client, else as the small parser does; a
    missing or empty file is an empty config (and costs no process)."""
    if path is None:
        return SshConfig()
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return SshConfig()
    parsed = parse_ssh_config(text)
    client = shutil.which(ssh) if ssh else None
    if client is None or not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        return parsed
    return OpenSshConfig(p.resolve(), client, parsed, wide_open=bool(_INCLUDE_OR_MATCH.search(text)),
                         signature=config_signature(p.resolve(), client))


# --- OpenSSH's own reading -------------------------------------------------------------------------------------

_INCLUDE_OR_MATCH = re.compile(r"^\s*(include|match)\b", re.IGNORECASE | re.MULTILINE)
# Appended after the user's config: OpenSSH keeps the first value it obtains, so these show through only where the
# config set nothing, which tells a value the config chose from one of ssh's defaults (same local user, port 22).
_UNSET_USER = "ddops/unset"
_UNSET_PORT = "1"
_UNSET_FILE = "/ddops/unset"
SSH_G_TIMEOUT = 10.0
SSH_G_PARALLEL = 8
SSH_G_CACHE = "ssh-config.json"
# What makes ssh -G's answer depend on more than the files: commands, the network, the environment.
_UNCACHEABLE = re.compile(r"^\s*match\b.*\b(exec|localnetwork)\b|\$\{", re.IGNORECASE | re.MULTILINE)
_INCLUDE = re.compile(r"^\s*include\s*=?\s*(.+)$", re.IGNORECASE | re.MULTILINE)


def config_signature(path: Path, ssh: str) -> str | None:
    """A fingerprint of what `ssh -G` reads for this config (the file, the files it includes, ssh itself); None
    when its answers may depend on something else (`Match exec`, `Match localnetwork`, `${VAR}`)."""
    import glob
    import hashlib

    try:
        st = os.stat(ssh)
    except OSError:
        return None
    parts, seen, todo = [f"{ssh} {st.st_mtime_ns} {st.st_size}"], set(), [path]
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.add(current)
        try:
            st = current.stat()
            text = current.read_text(encoding="utf-8", errors="replace")
        except OSError:
            parts.append(f"{current} unreadable")
            continue
        if _UNCACHEABLE.search(text):
            return None
        parts.append(f"{current} {st.st_mtime_ns} {st.st_size} {st.st_ino}")
        for match in _INCLUDE.finditer(text):
            for pattern in match.group(1).split():
                pattern = os.path.expanduser(pattern.strip('"'))
                if not os.path.isabs(pattern):  # as OpenSSH reads a user config's Include
                    pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
                found = sorted(glob.glob(pattern))
                parts.append(f"include {pattern} -> {found}")
                todo.extend(Path(f) for f in found)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def host_aliases(path: str | os.PathLike[str]) -> list[str]:
    """The literal names of the config's `Host` lines, in order, through its `Include`s (what `ssh NAME` can name;
    wildcard patterns and `Match` blocks name no host of their own)."""
    import glob

    names: dict[str, None] = {}
    seen: set[Path] = set()

    def read(current: Path) -> None:
        if current in seen:
            return
        seen.add(current)
        try:
            text = current.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        for raw in text.splitlines():
            words = raw.replace("=", " ", 1).split() if raw.strip() else []
            if not words or words[0].startswith("#"):
                continue
            key = words[0].lower()
            if key == "host":
                for pattern in words[1:]:
                    if not pattern.startswith("!") and not set(pattern) & set("*?"):
                        names.setdefault(pattern.strip('"'))
            elif key == "include":
                for pattern in words[1:]:
                    pattern = os.path.expanduser(pattern.strip('"'))
                    if not os.path.isabs(pattern):  # as OpenSSH reads a user config's Include
                        pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
                    for found in sorted(glob.glob(pattern)):
                        read(Path(found))

    read(Path(path).expanduser())
    return list(names)


def parse_ssh_g(text: str) -> dict[str, list[str]]:
    """`ssh -G` output (`key value` lines) as key -> values, in order (IdentityFile and a few others repeat)."""
    options: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            options.setdefault(key.lower(), []).append(value.strip())
    return options


def honoured_from_ssh_g(name: str, options: dict[str, list[str]]) -> dict[str, str]:
    """What the config set for `name`, in the lookup's keys (hostname, user, port, identity_file, proxy_jump,
    known_hosts)."""
    found: dict[str, str] = {}
    hostname = (options.get("hostname") or [""])[0]
    if hostname and hostname.lower() != name.lower():  # ssh prints the name itself, lower-cased, when none is set
        found["hostname"] = hostname
    user = (options.get("user") or [_UNSET_USER])[0]
    if user != _UNSET_USER:
        found["user"] = user
    port = (options.get("port") or [_UNSET_PORT])[0]
    if port != _UNSET_PORT:
        found["port"] = port
    identity = [f for f in options.get("identityfile", []) if f != _UNSET_FILE]
    if identity:
        found["identity_file"] = identity[0]
    known = (options.get("userknownhostsfile") or [_UNSET_FILE])[0].split()
    if known and known[0] != _UNSET_FILE:
        found["known_hosts"] = known[0]
    alias = (options.get("hostkeyalias") or [""])[0]
    if alias:  # ssh -G prints it only when set
        found["host_key_alias"] = alias
    jump = (options.get("proxyjump") or ["none"])[0]
    if jump and jump != "none":
        found["proxy_jump"] = jump
    if (options.get("identitiesonly") or ["no"])[0] == "yes":  # ssh -G says `no` when unset, as ddops' default
        found["identities_only"] = "yes"
    return found


@dataclass(slots=True)
class OpenSshConfig:
    """A config file resolved by OpenSSH itself (`ssh -G -F FILE NAME`), each name once (then from disk, see _load).

    Only names the file can affect cost a process: all of them when it has `Include` or `Match` lines (`wide_open`),
    else those with a matching `Host` block that sets an honoured option (the parser's lookup says which)."""

    path: Path
    ssh: str
    parsed: SshConfig
    wide_open: bool = False
    signature: str | None = None  # of the files ssh -G reads (config_signature); None: ask ssh every run
    cache_file: Path | None = None  # default: ssh-config.json in ddops' cache directory
    calls: int = 0  # `ssh -G` processes started (tests and measurements)
    _cache: dict[str, dict[str, str]] = field(default_factory=dict)
    _loaded: bool = False

    def lookup(self, name: str) -> dict[str, str]:
        self._load()
        if name not in self._cache:
            if self._needs_ssh(name):
                self._cache[name] = self._resolve(name)
                self._save()
            else:
                self._cache[name] = {}
        return dict(self._cache[name])

    def prefetch(self, names: Iterable[str]) -> None:
        """Resolve these names at once, in parallel: each `ssh -G` is a process start, and an inventory
        resolves every host when it loads."""
        self._load()
        todo = [n for n in dict.fromkeys(names) if n not in self._cache and self._needs_ssh(n)]
        if len(todo) < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(SSH_G_PARALLEL, len(todo))) as pool:
            for name, found in zip(todo, pool.map(self._resolve, todo)):
                self._cache[name] = found
        self._save()

    def _cache_path(self) -> Path:
        if self.cache_file is None:
            from ddops.cache import cache_root

            self.cache_file = cache_root() / SSH_G_CACHE
        return self.cache_file

    def _load(self) -> None:
        """What earlier runs learned from ssh -G for this config, while none of the files it read has changed."""
        if self._loaded or self.signature is None:
            return
        import json

        self._loaded = True
        try:
            entry = json.loads(self._cache_path().read_text()).get(str(self.path)) or {}
        except (OSError, ValueError, AttributeError):
            return
        if entry.get("signature") == self.signature and isinstance(entry.get("hosts"), dict):
            for name, found in entry["hosts"].items():
                if isinstance(found, dict) and all(isinstance(v, str) for v in found.values()):
                    self._cache.setdefault(name, found)

    def _save(self) -> None:
        if self.signature is None:
            return
        import json

        path = self._cache_path()
        with suppress(OSError):  # only a cache: the next run asks ssh again
            try:
                data = json.loads(path.read_text())
                data = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                data = {}
            data[str(self.path)] = {"signature": self.signature, "hosts": self._cache}
            from ddops.cache import write_private

            write_private(path, json.dumps(data, sort_keys=True).encode())

    def aliases(self) -> set[str]:
        return self.parsed.aliases()

    def knows(self, name: str) -> bool:
        return self.parsed.knows(name) or "hostname" in self.lookup(name)

    def _needs_ssh(self, name: str) -> bool:
        return self.wide_open or bool(self.parsed.lookup(name))

    def _resolve(self, name: str) -> dict[str, str]:
        import subprocess

        wrapper = (f'Include "{self.path}"\nHost *\n  User {_UNSET_USER}\n  Port {_UNSET_PORT}\n'
                   f"  IdentityFile {_UNSET_FILE}\n  UserKnownHostsFile {_UNSET_FILE}\n")
        self.calls += 1
        try:
            # -F: this file only, as the parser reads it (not /etc/ssh/ssh_config); the wrapper comes on stdin.
            proc = subprocess.run([self.ssh, "-G", "-F", "/dev/stdin", "--", name], input=wrapper,
                                  capture_output=True, text=True, timeout=SSH_G_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SshConfigError(f"{self.path}: ssh -G {name} failed: {exc}") from None
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line and not line.startswith("Pseudo-terminal")]
            raise SshConfigError(f"{(lines or [f'ssh -G {name} exited {proc.returncode}'])[0]}")
        return honoured_from_ssh_g(name, parse_ssh_g(proc.stdout))


class SshConfigError(UsageError):
    """OpenSSH refused the config file (its message names file and line)."""


# --- ProxyJump specs -------------------------------------------------------------------------------------------


def jump_hops(proxy_jump: str | None) -> list[str]:
    """The hops of a ProxyJump value, in the order they are connected (`a,b,c`: a first)."""
    if not proxy_jump or proxy_jump.strip() == "none":
        return []
    return [hop.strip() for hop in proxy_jump.split(",") if hop.strip()]


# A ProxyJump hop as OpenSSH reads one: [ssh://][user@]host[:port], host a name or a bracketed IPv6 address.
_HOP = re.compile(r"(?:ssh://)?(?:[^@\s/]+@)?(?:\[[0-9A-Fa-f:.%\w]+\]|[^-\s@:/\[\],][^\s@:/\[\],]*)"
                  r"(?::(?P<port>[0-9]+))?")


def jump_problem(proxy_jump: str) -> str | None:
    """What OpenSSH would refuse in a ProxyJump value (comma-separated hops, or `none`), in one phrase; None if fine."""
    if proxy_jump.strip() == "none":
        return None
    for hop in (h.strip() for h in proxy_jump.split(",")):
        match = _HOP.fullmatch(hop)
        if match is None:
            return f"'{hop}' is not a hop ([user@]host[:port] or ssh://[user@]host[:port], as OpenSSH's ProxyJump)"
        if match["port"] is not None and not 0 < int(match["port"]) < 65536:
            return f"'{hop}': port {match['port']} is out of range 1-65535"
    return None


def split_hop(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (or `[user@][v6]:port`, or ssh://) as (user, host, port); None where the spec has none."""
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):]
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":") and tail[1:].isdigit():
            port = int(tail[1:])
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        port = int(port_text) if port_text.isdigit() else None
    return user or None, host, port
