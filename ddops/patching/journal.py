"""Reading the remote journal: what ddops applied and is still in place, what was edited since, how to roll back.

Pure. The journal is the agent's append-only list of entries (dicts from JSON lines):
`{"event": "apply"|"rollback"|"revert"|"save-foreign", "patch": id, "file": path, "before": sha256,
"after": sha256, "time": iso, "id": ...}`. `before`/`after` are the file's sha256 before and after the event's write,
null where there was no file (an add_module apply's `before`; its rollback's `after`); a rollback entry's `after`
is the sha it restored. `save-foreign` records a foreign edit kept before a forced rollback and writes nothing. A
rollback or revert without `patch` ends every application in its file. An apply over what the same patch's active
application wrote continues it (a newer version of a module): rolling back goes to where the first one began."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from ddops.errors import DdopsError
from ddops.patching.kinds import PatchState
from ddops.strenum import StrEnum

APPLY, ROLLBACK, REVERT, SAVE_FOREIGN = "apply", "rollback", "revert", "save-foreign"
EVENTS = (APPLY, ROLLBACK, REVERT, SAVE_FOREIGN)
WRITING_EVENTS = (APPLY, ROLLBACK, REVERT)


class JournalState(StrEnum):
    """What the journal says of a (patch, file), next to the plan's state (see kinds.PatchState)."""

    NOT_APPLIED = "not-applied"  # ddops has no active application: the plan decides pending / applied / drifted
    APPLIED = "applied"          # applied by ddops and the file is as ddops left it
    MODIFIED = "modified"        # applied by ddops, and the file changed since ddops last wrote it


NOT_APPLIED, JOURNAL_APPLIED, MODIFIED = JournalState.NOT_APPLIED, JournalState.APPLIED, JournalState.MODIFIED


@dataclass(frozen=True, slots=True)
class JournalEntry:
    event: str
    file: str
    patch: str | None = None
    before: str | None = None
    after: str | None = None
    time: str = ""
    id: str = ""
    index: int = 0  # position in the journal: the order of events

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], index: int) -> JournalEntry:
        """An entry of a known event, checked field by field: DdopsError naming the entry's number if malformed."""
        where = f"journal entry {index + 1}"
        if not isinstance(raw, Mapping):
            raise DdopsError(f"{where}: not an object")
        event, file = raw.get("event"), raw.get("file")
        if not isinstance(event, str) or not event:
            raise DdopsError(f"{where}: `event` must be a non-empty string")
        if not isinstance(file, str) or not file:
            raise DdopsError(f"{where}: a {event} entry needs `file`, a non-empty string")
        for key in ("patch", "before", "after", "time", "id"):
            if raw.get(key) is not None and not isinstance(raw.get(key), str):
                raise DdopsError(f"{where}: `{key}` must be a string or null, not {type(raw.get(key)).__name__}")
        if event == APPLY and not (raw.get("patch") and raw.get("after")):
            raise DdopsError(f"{where}: an apply needs `patch` and `after`")
        return cls(event=event, file=file, patch=raw.get("patch") or None, before=raw.get("before"),
                   after=raw.get("after"), time=raw.get("time") or "", id=raw.get("id") or "", index=index)


@dataclass(frozen=True, slots=True)
class Application:
    """An apply entry not yet rolled back or reverted."""

    patch: str
    file: str
    before: str | None  # None: the application created the file
    after: str
    time: str
    id: str
    index: int


def parse_journal(journal: Iterable[Mapping[str, Any] | JournalEntry]) -> list[JournalEntry]:
    """Entries as values, in order. Events this version does not know are skipped whatever else they hold (a newer
    ddops may add some); a malformed entry of a known event is a DdopsError naming its number."""
    out: list[JournalEntry] = []
    for i, raw in enumerate(journal):
        if isinstance(raw, JournalEntry):
            out.append(raw)
        elif isinstance(raw, Mapping) and isinstance(raw.get("event"), str) and raw["event"] not in EVENTS:
            continue
        else:
            out.append(JournalEntry.from_dict(raw, i))
    return out


def last_entry_id(journal: Sequence[Mapping[str, Any]]) -> str | None:
    """The id of the journal's last entry as the agent sent it (what a plan made from it saw), None when empty."""
    if not journal:
        return None
    last = journal[-1]
    return last.get("id") if isinstance(last, Mapping) and isinstance(last.get("id"), str) else None


def is_sha256(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64 and all(ch in "0123456789abcdef" for ch in value)


@dataclass(frozen=True, slots=True)
class TornApplication:
    """An apply whose journal line was cut before its patch id: which file, and its hashes, are still known."""

    line: int
    file: str
    before: str
    after: str


def torn_applications(corrupt: Sequence[Mapping[str, Any]]) -> list[TornApplication]:
    """The applies among the journal lines that did not parse and were not whole entries (the agent sends what
    their pairs still say); others, and values that are not a file and two sha256, are left out."""
    torn = []
    for c in corrupt:
        line, file, before, after = c.get("line"), c.get("file"), c.get("before"), c.get("after")
        if c.get("salvaged") or c.get("event") != APPLY or not isinstance(line, int) or not isinstance(file, str):
            continue
        if file and is_sha256(before) and is_sha256(after):
            torn.append(TornApplication(line, file, before, after))
    return torn


def describe_corrupt(corrupt: Sequence[Mapping[str, Any]]) -> str:
    """The journal lines that did not parse, in words ('' when none): a torn one was read as far as it goes."""
    if not corrupt:
        return ""
    torn = [str(c.get("line")) for c in corrupt if c.get("salvaged")]
    lost = [str(c.get("line")) for c in corrupt if not c.get("salvaged")]
    parts = []
    if torn:
        parts.append(f"line{'s' if len(torn) > 1 else ''} {', '.join(torn)} torn (read as far as "
                     f"{'they go' if len(torn) > 1 else 'it goes'})")
    if lost:
        parts.append(f"line{'s' if len(lost) > 1 else ''} {', '.join(lost)} unreadable (skipped)")
    return ".ddops/journal.jsonl " + "; ".join(parts)


def active_applications(journal: Iterable[Mapping[str, Any] | JournalEntry]) -> list[Application]:
    """Applications still in place per the journal, oldest first (at most one per (patch, file))."""
    active: dict[tuple[str, str], Application] = {}
    for e in parse_journal(journal):
        if e.event == APPLY:
            assert e.patch and e.after
            prior = active.get((e.patch, e.file))
            before = prior.before if prior is not None and prior.after == e.before else e.before
            active[(e.patch, e.file)] = Application(e.patch, e.file, before, e.after, e.time, e.id, e.index)
        elif e.event in (ROLLBACK, REVERT):
            for key in [k for k in active if k[1] == e.file and (e.patch is None or k[0] == e.patch)]:
                del active[key]
    return sorted(active.values(), key=lambda a: a.index)


def last_written(journal: Iterable[Mapping[str, Any] | JournalEntry], file: str) -> str | None:
    """The sha256 ddops last wrote to file (the `after` of its latest apply/rollback/revert), or None (never
    written, or removed)."""
    return last_written_by_file(journal).get(file)


def last_written_by_file(journal: Iterable[Mapping[str, Any] | JournalEntry]) -> dict[str, str | None]:
    """Every file's last written sha256 (None where that write removed it), in one pass over the journal."""
    return {e.file: e.after for e in parse_journal(journal) if e.event in WRITING_EVENTS}


def patch_state(journal: Iterable[Mapping[str, Any] | JournalEntry], patch: str, file: str,
                current_sha: str | None) -> JournalState:
    """NOT_APPLIED, JOURNAL_APPLIED, or MODIFIED (ddops applied it; the file's sha is not what ddops last wrote)."""
    entries = parse_journal(journal)
    if not any(a.patch == patch and a.file == file for a in active_applications(entries)):
        return NOT_APPLIED
    return JOURNAL_APPLIED if current_sha == last_written(entries, file) else MODIFIED


def effective_state(plan_state: PatchState, journal_state: JournalState) -> PatchState:
    """The state to report: MODIFIED from the journal wins over what the plan sees in the content."""
    return PatchState.MODIFIED if journal_state == MODIFIED else PatchState(plan_state)


def modified_files(journal: Iterable[Mapping[str, Any] | JournalEntry],
                   current_sha_by_file: Mapping[str, str | None]) -> dict[str, tuple[str, str | None]]:
    """Files with an active application whose sha is not what ddops last wrote: file -> (expected, current)."""
    entries = parse_journal(journal)
    written = last_written_by_file(entries)
    out: dict[str, tuple[str, str | None]] = {}
    for a in active_applications(entries):
        expected = written.get(a.file)
        current = current_sha_by_file.get(a.file)
        if expected is not None and current != expected:
            out[a.file] = (expected, current)
    return out


@dataclass(frozen=True, slots=True)
class FileRestore:
    """Put one file back: write the backup `restore`, expecting `current` on disk (compare-and-swap)."""

    file: str
    restore: str | None                     # sha256 of the backup to write back (None: remove the file)
    expected: str                           # sha256 ddops last wrote
    current: str | None                     # sha256 on the host now (None: the file is missing)
    applications: tuple[Application, ...]   # being rolled back, newest first

    @property
    def patches(self) -> tuple[str, ...]:
        return tuple(a.patch for a in self.applications)

    @property
    def modified(self) -> bool:
        return self.current != self.expected

    @property
    def save_foreign(self) -> bool:
        """Forced over a foreign edit: save the current bytes before restoring."""
        return self.modified and self.current is not None


@dataclass(frozen=True, slots=True)
class Refusal:
    patch: str
    file: str
    reason: str
    blocking_patch: str | None = None


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    restores: tuple[FileRestore, ...]
    refused: tuple[Refusal, ...] = ()
    not_applied: tuple[str, ...] = ()  # patches asked for that ddops has no active application of

    @property
    def ok(self) -> bool:
        return not self.refused

    @property
    def patches(self) -> tuple[str, ...]:
        """Patches being rolled back."""
        return tuple(dict.fromkeys(p for r in self.restores for p in r.patches))


def plan_rollback(journal: Iterable[Mapping[str, Any] | JournalEntry], current_sha_by_file: Mapping[str, str | None],
                  patch_ids: Sequence[str] | None = None, force: bool = False) -> RollbackPlan:
    """Which files to restore to which backup to undo patch_ids (None: every active patch).

    A patch is rolled back in all its files or in none. It is refused when, in one of its files, a later active
    patch is not also being rolled back (naming that patch), or when the file changed since ddops wrote it (unless
    force, which saves the foreign edit first). Refusing one patch can refuse the earlier patches under it."""
    entries = parse_journal(journal)
    actives = active_applications(entries)
    active_ids = {a.patch for a in actives}
    wanted = set(active_ids if patch_ids is None else patch_ids)
    not_applied = tuple(p for p in (patch_ids or ()) if p not in active_ids)
    by_file: dict[str, list[Application]] = {}
    for a in actives:
        by_file.setdefault(a.file, []).append(a)
    written = last_written_by_file(entries)
    expected = {f: written.get(f) or apps[-1].after for f, apps in by_file.items()}

    refused: dict[str, list[Refusal]] = {}
    while True:
        rolling = wanted & active_ids - refused.keys()
        new: dict[str, Refusal] = {}
        for file, apps in by_file.items():
            mine = [a for a in apps if a.patch in rolling]
            if not mine:
                continue
            current = current_sha_by_file.get(file)
            if current != expected[file] and not force:
                state = "is missing" if current is None else "changed since ddops wrote it"
                for a in mine:
                    new.setdefault(a.patch, Refusal(a.patch, file, f"{file} {state} (expected sha256 "
                                                    f"{expected[file][:12]}, found {(current or 'none')[:12]}): "
                                                    "use --force to save that edit and restore"))
            for a in mine:
                later = [b for b in apps if b.index > a.index and b.patch not in rolling]
                if later:
                    new.setdefault(a.patch, Refusal(
                        a.patch, file, f"{file}: {later[-1].patch} was applied after {a.patch} and is not being "
                                       f"rolled back: roll back {later[-1].patch} too (or first)", later[-1].patch))
        new = {p: r for p, r in new.items() if p not in refused}
        if not new:
            break
        for p, r in new.items():
            refused.setdefault(p, []).append(r)

    rolling = wanted & active_ids - refused.keys()
    restores = []
    for file, apps in by_file.items():
        mine = [a for a in apps if a.patch in rolling]
        if mine:
            restores.append(FileRestore(file, restore=mine[0].before, expected=expected[file],
                                        current=current_sha_by_file.get(file), applications=tuple(reversed(mine))))
    return RollbackPlan(tuple(restores), tuple(r for rs in refused.values() for r in rs), not_applied)
