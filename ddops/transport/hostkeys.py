"""Host keys: known_hosts read once per run, unknown keys refused (or recorded with --accept-new), never auto-added."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import paramiko

from ddops.errors import HostKeyError
from ddops.inventory import Host

_append_lock = threading.Lock()


def known_hosts_name(address: str, port: int) -> str:
    """How known_hosts names a host: `address`, or `[address]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
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
        append_known_host(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


class KnownHosts:
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


def append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    with _append_lock, open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # other ddops processes may record keys at the same time
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
