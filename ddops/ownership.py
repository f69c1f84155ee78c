"""Who may change a file ddops trusts: only this user and root, as OpenSSH asks of a config file or an authorized key
(another user who could write a playbook, or a testbed's key, chooses what ddops runs)."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

PLAYBOOK_SUFFIXES = (".yaml", ".yml", ".py")  # what ddops reads from a playbook folder
UNTRUSTED_PLAYBOOKS = ("ddops takes playbooks and plans only from folders and files no other user can change (as "
                       "OpenSSH refuses a config others may write): `chmod go-w` them")


def user_name(uid: int) -> str:
    """`name (uid N)`, or `uid N` for a uid with no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def others_may_change(info: os.stat_result, *, sticky_ok: bool = False) -> str | None:
    """Why a user other than this one and root could change what `info` describes (None: none could): its owner, or
    write permission for its group or everyone (a sticky folder, where others cannot rename what is ours, only with
    `sticky_ok`)."""
    if info.st_uid not in (0, os.geteuid()):
        return f"belongs to {user_name(info.st_uid)}"
    if info.st_mode & 0o022 and not (sticky_ok and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def untrusted_in(folder: Path, suffixes: Iterable[str] = PLAYBOOK_SUFFIXES) -> str | None:
    """The folder, or the first file in it with one of the suffixes, that another user could change, and why
    (`/srv/pb/x.yaml is writable by others (mode 0666)`); None when no other user can change any of them."""
    suffixes = tuple(suffixes)
    for path in (folder, *sorted(p for p in folder.iterdir() if p.suffix in suffixes)):
        try:
            problem = others_may_change(path.stat())  # through links: what is read is what counts
        except OSError:
            continue
        if problem:
            return f"{path} {problem}"
    return None
