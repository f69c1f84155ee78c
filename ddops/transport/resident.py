"""Which hosts have a resident agent, and on which socket: remembered between ddops commands on this machine.

A host's agent, started with a linger, stays on after the session and says where it listens (remote/README.md, "The
resident agent"). The next command reaches it through sshd without starting Python. This book is only a hint: a socket
that is gone costs one refused channel and the agent is started the usual way.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from ddops.cache import cache_root

# A host whose sshd refuses unix-socket channels (AllowStreamLocalForwarding no, DisableForwarding yes) gets no
# resident, and is asked again after this long in case its configuration changed.
PROHIBITED_RETRY_SECONDS = 24 * 3600
MAX_ENTRIES = 4096


def resident_key(user: str, address: str, port: int, python: str, digest: str) -> str:
    """One agent version, run by one Python, for one user on one host."""
    return f"{user}@{address}:{port} {python} {digest[:16]}"


class ResidentBook:
    """The `residents.json` of the cache directory: key -> socket path, or a note that the host refuses them."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else cache_root() / "residents.json"
        self._lock = threading.Lock()
        self._entries: dict[str, dict] | None = None
        self._changes: dict[str, dict | None] = {}

    def _load(self) -> dict[str, dict]:
        if self._entries is None:
            try:
                data = json.loads(self.path.read_text())
                self._entries = {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def socket_for(self, key: str) -> str | None:
        """The socket a resident for `key` was last said to listen on."""
        with self._lock:
            path = self._load().get(key, {}).get("socket")
        return path if isinstance(path, str) else None

    def may_linger(self, key: str) -> bool:
        """False while the host is known to refuse unix-socket channels."""
        with self._lock:
            refused = self._load().get(key, {}).get("prohibited_at")
        return not isinstance(refused, (int, float)) or time.time() - refused > PROHIBITED_RETRY_SECONDS

    def record(self, key: str, socket_path: str) -> None:
        self._set(key, {"socket": socket_path, "seen_at": time.time()})

    def forget(self, key: str, *, prohibited: bool = False) -> None:
        self._set(key, {"prohibited_at": time.time()} if prohibited else None)

    def _set(self, key: str, entry: dict | None) -> None:
        with self._lock:
            entries = self._load()
            if entry is None and key not in entries:
                return
            if entry is None:
                entries.pop(key, None)
            else:
                entries[key] = entry
            self._changes[key] = entry

    def save(self) -> None:
        """Write this command's changes over what is on disk now (other ddops commands may have written too)."""
        with self._lock:
            if not self._changes:
                return
            self._entries = None
            entries = self._load()
            for key, entry in self._changes.items():
                if entry is None:
                    entries.pop(key, None)
                else:
                    entries[key] = entry
            self._changes = {}
            newest = sorted(entries.items(), key=lambda item: _stamp(item[1]))
            entries = self._entries = dict(newest[-MAX_ENTRIES:])
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                temp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    json.dump(entries, handle, indent=0, sort_keys=True)
                os.replace(temp, self.path)
            except OSError:
                pass  # only a hint: the next command starts agents the usual way


def _stamp(entry: dict) -> float:
    """When an entry was written (the oldest are dropped first once the book is full)."""
    stamp = entry.get("seen_at") or entry.get("prohibited_at") or 0
    return stamp if isinstance(stamp, (int, float)) else 0
