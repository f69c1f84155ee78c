"""Where a testbed lives: a folder no other user can change, since root's sshd trusts the key in it and `testbed
down` signals the processes its files name.

A root is accepted only when it is a folder of this user's (not a symlink), closed to others, and every folder above
it is this user's or root's and lets no one else rename what it holds (not writable by others, or sticky as /tmp
is). An absent root is made so; an existing one is never taken over (another user made /tmp/ddops-testbed first:
refused, as OpenSSH's StrictModes refuses a key in a folder others may write). The default root is a fresh
private folder (mkdtemp), remembered in ddops' private cache for `down` and `status`."""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import suppress
from pathlib import Path

from ddops.errors import TestbedError
from ddops.ownership import others_may_change, user_name

PRIVATE = 0o077  # a testbed root: others may not even look in (it holds the client's private key)
NOT_WRITABLE = 0o022  # a Slurm root: munged (its own user) must enter it, no one else write it
_REMEMBERED = "testbed-root"  # in the cache: the default root `testbed up` made last


def claim(path: str | os.PathLike[str], *, closed: int = PRIVATE, what: str = "testbed root") -> Path:
    """`path` as a folder only this user (and root) can change, made (mode 0700) where absent: an existing one is
    refused unless it is this user's folder, not a symlink, with none of the `closed` mode bits, in folders that
    no other user can change."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    _check_folders_above(path, what)
    for folder in (*reversed(path.parents), path):
        with suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    _check_folders_above(path, what)  # again: one another user made meanwhile is refused now
    return trusted(path, closed=closed, what=what)


def trusted(path: str | os.PathLike[str], *, closed: int = PRIVATE, what: str = "testbed root") -> Path:
    """An existing folder `claim` would accept, as an absolute path; a TestbedError (nothing in it read) otherwise."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    _check_folders_above(path, what)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise TestbedError(f"no {what} at {path}") from None
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symlink"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to {user_name(info.st_uid)}"
    elif info.st_mode & closed:
        problem = f"is open to others (mode {stat.S_IMODE(info.st_mode):04o})"
    if problem:
        raise TestbedError(f"{what} {path} {problem}: it must be a folder of {user_name(os.geteuid())}'s, mode "
                           f"{0o777 & ~closed:04o} or closer, not a symlink (another user could change what ddops "
                           "runs as root from it); choose another one, or remove it")
    return Path(os.path.realpath(path))


def _check_folders_above(path: Path, what: str) -> None:
    """Every folder above `path`, as written and as its links lead: this user's or root's, and none that lets
    another user rename what it holds (writable by others without the sticky bit)."""
    for chain in (path, Path(os.path.realpath(path))):
        for folder in reversed(chain.parents):
            try:
                info = os.lstat(folder)
            except FileNotFoundError:
                break  # claim makes the rest
            problem = others_may_change(info, sticky_ok=True)
            if stat.S_ISLNK(info.st_mode) and info.st_uid in (0, os.geteuid()):
                problem = None  # a link's mode means nothing, and where it leads is the resolved chain's to check
            if problem:
                raise TestbedError(f"{what} {path}: the folder above it {folder} {problem}: another user could "
                                   "swap what ddops runs as root from it; choose a folder only you and root can "
                                   "change")


def fresh_default() -> Path:
    """A new private folder for a testbed started without a root, remembered as the default one."""
    from ddops.cache import write_private

    path = claim(tempfile.mkdtemp(prefix="ddops-testbed-"))
    write_private(_remembered_file(), str(path).encode())
    return path


def remembered_default() -> Path | None:
    """The root the last `testbed up` without one made, while it is the default (None: there is none)."""
    try:
        text = _remembered_file().read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return Path(text) if text else None


def forget_default(root: Path) -> None:
    """`root` is gone: no longer the default testbed."""
    if remembered_default() == root:
        _remembered_file().unlink(missing_ok=True)


def _remembered_file() -> Path:
    from ddops.cache import cache_root

    return cache_root() / _REMEMBERED
