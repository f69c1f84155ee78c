"""Host keys: known_hosts (the user's, then the system's) read once per run; unknown keys refused (or recorded with
--accept-new), revoked keys always refused, never auto-added."""

from __future__ import annotations

import fcntl
import functools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from ddops import settings
from ddops.errors import HostKeyError
from ddops.inventory import Host

_append_lock = threading.Lock()


def known_hosts_name(address: str, port: int) -> str:
    """How known_hosts names a host: `address`, or `[address]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def host_key_name(host: Host) -> str:
    """The host's name in known_hosts: its host_key_alias (as OpenSSH's HostKeyAlias, no port), else [address]:port."""
    return host.host_key_alias or known_hosts_name(host.address, host.port)


SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


def system_known_hosts() -> Path:
    """The system-wide known_hosts OpenSSH reads after the user's (`DDOPS_SYSTEM_KNOWN_HOSTS` names another)."""
    return Path(settings.SYSTEM_KNOWN_HOSTS.value() or SYSTEM_KNOWN_HOSTS)


@dataclass(frozen=True)
class HostKeyEntries:
    """What the known_hosts files say about one host name: keys to trust, keys revoked, CAs vouching for it."""

    trusted: tuple[tuple[str, paramiko.PKey], ...] = ()
    revoked: tuple[tuple[bytes, str], ...] = ()  # (key blob, "file:line")
    authorities: tuple[str, ...] = ()  # "file:line" of each @cert-authority line for the host

    def __add__(self, other: HostKeyEntries) -> HostKeyEntries:
        return HostKeyEntries(self.trusted + other.trusted, self.revoked + other.revoked,
                              self.authorities + other.authorities)

    def revocation(self, key: paramiko.PKey) -> str | None:
        """Where `key` is revoked ("file:line"), or None."""
        blob = key.asbytes()
        return next((where for revoked, where in self.revoked if revoked == blob), None)

    def usable(self) -> list[tuple[str, paramiko.PKey]]:
        """The trusted keys but those revoked: a revoked key is never accepted, even where a plain line lists it."""
        return [(kind, key) for kind, key in self.trusted if self.revocation(key) is None]


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or with --accept-new record them; never a silent auto-add, never a revoked key."""

    def __init__(self, host: Host, known_hosts: Path, accept_new: bool,
                 entries: HostKeyEntries = HostKeyEntries()) -> None:
        self.host, self.known_hosts, self.accept_new, self.entries = host, known_hosts, accept_new, entries

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client_name, hostname = hostname, host_key_name(self.host)  # a host_key_alias names it in known_hosts
        fingerprint = key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()[:16]
        revoked = self.entries.revocation(key)
        if revoked is not None:
            raise HostKeyError(revoked_message(hostname, key, revoked), host=self.host.name)
        if self.entries.authorities:
            # paramiko negotiates no host certificates, so the host showed a plain key the CA cannot vouch for;
            # recording it on first use would replace the CA's word with a guess.
            raise HostKeyError(
                f"{self.entries.authorities[0]} trusts a certificate authority for {hostname}, "
                f"but ddops cannot check host certificates, and the plain key it offered ({key.get_name()} "
                f"{fingerprint}) is not listed; after checking it, add that key itself to {self.known_hosts} "
                f"(ssh-keyscan -p {self.host.port} {self.host.address})", host=self.host.name)
        if not self.accept_new:
            raise HostKeyError(
                f"unknown host key {key.get_name()} {fingerprint} for {hostname} "
                f"(not in {self.known_hosts}); check it, then re-run with --accept-new to record it",
                host=self.host.name)
        append_known_host(self.known_hosts, hostname, key)
        client.get_host_keys().add(client_name, key.get_name(), key)


def revoked_message(hostname: str, key: paramiko.PKey, where: str) -> str:
    fingerprint = key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()[:16]
    return f"host key {key.get_name()} {fingerprint} for {hostname} is REVOKED ({where}); refusing to connect"


class KnownHosts:
    """A known_hosts file, read once per Connector; a host's entries are parsed only when that host connects.

    paramiko's load_host_keys parses every line into a key object, on every connection: with 32 hosts that was
    the biggest CPU cost of a whole `ddops patch`. Names match as in OpenSSH: exact names, comma lists, hashed
    names, `*`/`?` wildcards and `!` negations; `@revoked` and `@cert-authority` lines are honoured (paramiko
    skips both). `optional`: a file that cannot be read counts as empty (the system-wide one, as OpenSSH does)."""

    def __init__(self, path: Path, *, optional: bool = False) -> None:
        self.path = path
        self.optional = optional
        self._lock = threading.Lock()
        self._index: _LineIndex | None = None
        self._error: str | None = None

    def entries_for(self, host: Host, name: str) -> HostKeyEntries:
        """Every entry for `name`: plain keys, revoked keys and certificate authorities."""
        with self._lock:
            if self._index is None and self._error is None:
                try:
                    self._index = _LineIndex(self.path.read_text(encoding="utf-8", errors="replace").splitlines())
                except FileNotFoundError:
                    self._index = _LineIndex([])
                except OSError as exc:
                    if self.optional:
                        self._index = _LineIndex([])
                    else:
                        self._error = str(exc)
        if self._error is not None or self._index is None:
            raise HostKeyError(f"cannot read known_hosts {self.path}: {self._error}", host=host.name)
        trusted, revoked, authorities = [], [], []
        for number, marker, fields in self._index.candidates(name):
            if not names_match(fields[0], name):
                continue
            where = f"{self.path}:{number}"
            if marker == "@cert-authority":
                authorities.append(where)
                continue
            if marker not in (None, "@revoked"):
                raise HostKeyError(f"known_hosts {where}: unknown marker {marker}", host=host.name)
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(fields[:3]))
            except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError) as exc:
                raise HostKeyError(f"known_hosts {self.path} has a bad entry for {name}: "
                                   f"{exc or type(exc).__name__}", host=host.name) from None
            if entry is None or entry.key is None:
                continue
            if marker == "@revoked":
                revoked.append((entry.key.asbytes(), where))
            else:
                trusted.append((entry.key.get_name(), entry.key))
        return HostKeyEntries(tuple(trusted), tuple(revoked), tuple(authorities))


class _LineIndex:
    """A known_hosts file's entry lines, split once and indexed by plain host name: a fleet's connections each look
    up their own name instead of matching every line (a user's known_hosts may hold thousands). Lines whose names
    need a match per host (hashed, wildcard or negated patterns) are kept apart and tried for every name."""

    def __init__(self, lines: list[str]) -> None:
        self.lines: list[tuple[int, str | None, list[str]]] = []
        self.by_name: dict[str, list[int]] = {}
        self.always: list[int] = []
        for number, line in enumerate(lines, 1):
            fields = line.split()
            marker = fields[0] if fields and fields[0].startswith("@") else None
            if marker is not None:
                fields = fields[1:]
            if len(fields) < 3 or fields[0].startswith("#"):
                continue
            at = len(self.lines)
            self.lines.append((number, marker, fields))
            patterns = fields[0].split(",")
            if any(p.startswith(("!", "|")) or "*" in p or "?" in p for p in patterns):
                self.always.append(at)
            else:
                for pattern in dict.fromkeys(p.lower() for p in patterns):
                    self.by_name.setdefault(pattern, []).append(at)

    def candidates(self, name: str) -> list[tuple[int, str | None, list[str]]]:
        """The lines that may name `name`, in file order."""
        found = self.by_name.get(name.lower(), [])
        return [self.lines[at] for at in (sorted(found + self.always) if self.always else found)]


def names_match(patterns: str, name: str) -> bool:
    """Whether a known_hosts name field covers `name`, as OpenSSH's match_hostname decides (a `!` match vetoes)."""
    matched = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        if negated:
            pattern = pattern[1:]
        if pattern.startswith("|1|"):
            try:
                hit = paramiko.HostKeys.hash_host(name, pattern) == pattern
            except (ValueError, TypeError, IndexError, AssertionError):  # a damaged salt: an entry for no one
                hit = False
        elif "*" in pattern or "?" in pattern:
            hit = _wildcard(pattern.lower()).fullmatch(name.lower()) is not None
        else:
            hit = pattern.lower() == name.lower()
        if hit and negated:
            return False
        matched = matched or hit
    return matched


@functools.lru_cache(maxsize=256)
def _wildcard(pattern: str) -> re.Pattern[str]:
    """OpenSSH's patterns: `*` any run of characters, `?` one; everything else literal (`[` included)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


def append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
    with _append_lock, open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # other ddops processes may record keys at the same time
        size = fh.seek(0, os.SEEK_END)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":  # a file edited by hand may end without one: keep its last line whole
                line = b"\n" + line
        fh.write(line)  # "a": at the end, whatever the seeks above did
        fh.flush()
        os.fsync(fh.fileno())
