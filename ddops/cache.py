"""Where ddops keeps its own files on the controller."""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path

from ddops import settings


def cache_root() -> Path:
    """$DDOPS_CACHE_DIR, else $XDG_CACHE_HOME/ddops, else ~/.cache/ddops."""
    explicit = settings.CACHE_DIR.value()
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "ddops"


def private_dirs(path: Path) -> Path:
    """`path` as a folder only this user can enter (0700), like every folder between the cache root and it.

    What ddops keeps here shows the hosts' files (plans hold their diffs): folders an older ddops left 0755 are
    closed too, where they are ours."""
    root = cache_root()
    for folder in reversed((path, *path.parents)):
        with suppress(FileExistsError):
            folder.mkdir(mode=0o700)  # every folder made here is private, wherever it is
            continue
        if folder == path or folder == root or root in folder.parents:
            info = folder.stat()
            if info.st_uid == os.getuid() and info.st_mode & 0o077:
                folder.chmod(0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write a file only this user can read (0600), atomically (a temp file, then rename), in a private folder."""
    import threading

    private_dirs(path.parent)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a temp file left behind keeps its mode through O_TRUNC
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp)
        raise
