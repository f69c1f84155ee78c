"""Which hosts have a resident agent, and on which socket: remembered between ddops commands on this machine.

A host's agent, started with a linger, stays on after the session and says where it listens, with the resident's
secret (remote/README.md, "The resident agent"). The next command reaches it through sshd without starting Python,
and believes only a resident that proves it knows that secret. The book is only a hint: a socket that is gone (or a
resident that cannot prove itself) costs one channel and the agent is started the usual way. It holds secrets, so it
is written mode 0600 in a 0700 folder, and read only when it is a file of ours that nobody else may read."""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ddops.cache import cache_root, private_dirs

# A host whose sshd refuses unix-socket channels (AllowStreamLocalForwarding no, DisableForwarding yes) gets no
# resident, and is asked again after this long in case its configuration changed.
PROHIBITED_RETRY_SECONDS = 24 * 3600
MAX_ENTRIES = 4096
SECRET_HEX = re.compile(r"(?:[0-9a-f]{2}){16,64}")  # a resident's secret as the agent announces it


@dataclass(frozen=True, slots=True)
class Resident:
    """Where a host's resident listens, and the secret it proves (hex, as the agent announced it)."""

    socket: str
    secret: bytes


def resident_key(user: str, address: str, port: int, python: str, digest: str, via: str | None = None) -> str:
    """One agent version, run by one Python, for one user on one host (an address:port as the jump `via` sees it)."""
    return f"{user}@{address}:{port}{f' via {via}' if via else ''} {python} {digest[:16]}"


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
                data = json.loads(_read_private(self.path))
                self._entries = {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def resident_for(self, key: str) -> Resident | None:
        """The resident for `key` as last announced: its socket and secret (None without both)."""
        with self._lock:
            entry = self._load().get(key, {})
        path, secret = entry.get("socket"), entry.get("secret")
        if not isinstance(path, str) or not isinstance(secret, str) or not SECRET_HEX.fullmatch(secret):
            return None
        return Resident(path, bytes.fromhex(secret))

    def may_linger(self, key: str) -> bool:
        """False while the host is known to refuse unix-socket channels."""
        with self._lock:
            refused = self._load().get(key, {}).get("prohibited_at")
        return not isinstance(refused, (int, float)) or time.time() - refused > PROHIBITED_RETRY_SECONDS

    def record(self, key: str, socket_path: str, secret: str) -> None:
        """Remember the resident an agent announced: its socket and its secret (hex)."""
        self._set(key, {"socket": socket_path, "secret": secret, "seen_at": time.time()})

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
            with suppress(OSError):  # only a hint: the next command starts agents the usual way
                private_dirs(self.path.parent)
                temp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                os.fchmod(fd, 0o600)  # a temp file left behind keeps its mode through O_TRUNC
                with os.fdopen(fd, "w") as handle:
                    json.dump(entries, handle, indent=0, sort_keys=True)
                os.replace(temp, self.path)


def _read_private(path: Path) -> str:
    """The text of `path` when it is a regular file of ours that nobody else may read or write; OSError otherwise
    (a book that others could have written would let them name the socket and the secret we trust)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "r", encoding="utf-8") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path}: not a private file of this user's: ignored")
        return handle.read()


def _stamp(entry: dict) -> float:
    """When an entry was written (the oldest are dropped first once the book is full)."""
    stamp = entry.get("seen_at") or entry.get("prohibited_at") or 0
    return stamp if isinstance(stamp, (int, float)) else 0
