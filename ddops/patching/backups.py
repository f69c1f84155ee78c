"""Foreign edits that `rollback --force` saved before restoring a file: finding them in the journal, and whether one
may be put back. Pure: ddops/tasks/backups.py reads the journal and writes through the host agent."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ddops.errors import UsageError
from ddops.jsonvalue import JsonValue
from ddops.patching.journal import SAVE_FOREIGN, active_applications, last_written_by_file

SHA_PREFIX_MIN = 4


def backup_path(repo: str, sha256: str) -> str:
    """Where the backup of content `sha256` lies on the host."""
    return f"{repo.rstrip('/')}/.ddops/backups/{sha256}"


@dataclass(frozen=True, slots=True)
class SavedEdit(JsonValue):
    """One saved foreign edit: the file it was, its content's sha256 (the backup's name), when and by whom, and
    (once `at` a repo) where its bytes lie on the host."""

    file: str
    sha256: str
    time: str = ""
    actor: str = ""
    backup: str = ""

    def at(self, repo: str) -> SavedEdit:
        return replace(self, backup=backup_path(repo, self.sha256))


def saved_edits(journal: Iterable[Mapping[str, Any]]) -> list[SavedEdit]:
    """Every saved foreign edit in the journal, oldest first (the agent records `sha256`, older entries `after`)."""
    out = []
    for raw in journal:
        if not isinstance(raw, Mapping) or raw.get("event") != SAVE_FOREIGN:
            continue
        sha = raw.get("sha256") or raw.get("after")
        if isinstance(sha, str) and isinstance(raw.get("file"), str):
            out.append(SavedEdit(raw["file"], sha, str(raw.get("time") or ""), str(raw.get("actor") or "")))
    return out


def find_saved(edits: Iterable[SavedEdit], wanted: str) -> SavedEdit:
    """The saved edit `wanted` names: a sha256 prefix, or a file (its newest saved edit)."""
    edits = list(edits)
    by_file = [e for e in edits if e.file == wanted]
    if by_file:
        return by_file[-1]
    if len(wanted) >= SHA_PREFIX_MIN:
        by_sha = {e.sha256: e for e in edits if e.sha256.startswith(wanted.lower())}
        if len(by_sha) == 1:
            return next(iter(by_sha.values()))
        if len(by_sha) > 1:
            raise UsageError(f"{wanted} names {len(by_sha)} saved edits: give more of the sha256")
    known = ", ".join(f"{e.file} ({e.sha256[:12]})" for e in edits) or "none"
    raise UsageError(f"no saved edit '{wanted}' (saved edits: {known})")


def restore_refusal(journal: Iterable[Mapping[str, Any]], edit: SavedEdit, current_sha: str | None) -> str | None:
    """Why the saved edit may not replace the file now, or None: the file must be what ddops last wrote there, with
    no ddops patch in place (put back over a patched file, the edit would hide the patch from the journal)."""
    entries = list(journal)
    patched = [a.patch for a in active_applications(entries) if a.file == edit.file]
    if patched:
        return f"{edit.file} has {', '.join(patched)} applied: roll {'them' if len(patched) > 1 else 'it'} back first"
    written = last_written_by_file(entries).get(edit.file)
    if current_sha != written:
        found = (current_sha or "no file")[:12]
        return (f"{edit.file} changed since ddops last wrote it (expected {(written or 'none')[:12]}, found {found}): "
                "left untouched")
    return None
