"""A host's files as the agent's `snapshot` verb returned them, and what a plan over them means per patch.

Pure: the tasks layer (ddops/tasks/patch.py) takes the snapshot and commits; everything it decides with lives here."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddops.patching import journal as journal_mod
from ddops.patching.kinds import ADD_MODULE, AMBIGUOUS, BLOCKED, DRIFTED, ERROR, MODIFIED, PatchState
from ddops.patching.plan import HostPlan, Planner
from ddops.patching.plan_store import default_store
from ddops.patching.playbook import Patch, PatchPlaybook

HARD_FAILURES = (ERROR, AMBIGUOUS, BLOCKED)


def make_planner() -> Planner:
    """One planner per ddops run: hosts with the same file contents share one transform, and reruns reuse the
    plans cached on disk by content hash."""
    return Planner(store=default_store())


def all_patches(playbooks: Sequence[PatchPlaybook]) -> tuple[Patch, ...]:
    return tuple(p for book in playbooks for p in book.patches)


def all_files(patches: Iterable[Patch]) -> list[str]:
    return list(dict.fromkeys(f for p in patches for f in p.files))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A host's target files (None when missing), their hashes, the journal and any per-file read error."""

    files: dict[str, bytes | None]
    shas: dict[str, str | None]
    errors: dict[str, str]
    journal: list[dict[str, Any]]
    facts: dict[str, Any] | None
    journal_corrupt: tuple[dict[str, Any], ...] = ()  # {line, error, salvaged} per journal line that did not parse
    versions: dict[str, str | None] | None = None  # the packages' versions a snapshot asked for (`versions`)

    @classmethod
    def from_reply(cls, files: Sequence[str], reply: Mapping[str, Any]) -> Snapshot:
        """The agent's `snapshot` answer for `files`, decoded."""
        contents: dict[str, bytes | None] = {}
        shas: dict[str, str | None] = {}
        errors: dict[str, str] = {}
        for path in files:
            record = reply["files"].get(path) or {}
            if record.get("error"):
                errors[path] = record["error"].get("message") or record["error"].get("kind", "unreadable")
                contents[path], shas[path] = None, None
            elif not record.get("exists"):
                contents[path], shas[path] = None, None
            else:
                contents[path] = base64.b64decode(record["content_b64"])
                shas[path] = record["sha256"]
        return cls(contents, shas, errors, list(reply.get("journal") or []), reply.get("facts"),
                   tuple(reply.get("journal_corrupt") or ()), reply.get("versions"))

    def ours(self, patches: Sequence[Patch]) -> dict[str, str]:
        """path -> the sha256 ddops last wrote there, for each add_module patch the journal holds applied there: the
        planner's `ours`, which tells ddops' own older module (replaced) from anyone else's file (refused)."""
        modules = [(p.id, f) for p in patches if p.transform.kind == ADD_MODULE for f in p.files]
        if not modules:
            return {}
        entries = journal_mod.parse_journal(self.journal)
        active = {(a.patch, a.file) for a in journal_mod.active_applications(entries)}
        written = journal_mod.last_written_by_file(entries)
        return {f: sha for pid, f in modules if (pid, f) in active and (sha := written.get(f))}


def with_host_python(python: str, command: str) -> str:
    """A check command that finds the host's own python (and its torchrun, pytest, ...) first on PATH."""
    if "/" not in python:
        return command
    bindir = python.rsplit("/", 1)[0] or "/"
    return f"PATH={shlex.quote(bindir)}:\"$PATH\"; export PATH; {command}"


def patch_states(plan: HostPlan, patches: Sequence[Patch], snap: Snapshot) -> dict[str, str]:
    """Per patch: the plan's state, except `modified` where ddops applied it and the file was edited since."""
    # The journal is read once per host, not once per (patch, file): a 1000-file playbook made that quadratic.
    entries = journal_mod.parse_journal(snap.journal)
    active = {(a.patch, a.file) for a in journal_mod.active_applications(entries)}
    modified = journal_mod.modified_files(entries, snap.shas)
    states: dict[str, str] = {}
    for patch in patches:
        state = plan.patch_state(patch.id)
        for path in patch.files:
            if path in snap.errors:
                state = ERROR
            elif (patch.id, path) in active and path in modified:
                state = journal_mod.effective_state(PatchState(state), journal_mod.MODIFIED)
        states[patch.id] = state
    return states


def plan_problems(plan: HostPlan, snap: Snapshot) -> tuple[list[str], list[str]]:
    """(hard failures, drifts) as `file: patch: message` lines."""
    hard, drift = [], []
    for path, message in snap.errors.items():
        hard.append(f"{path}: {message}")
    for f in plan.files:
        if f.path in snap.errors:
            continue
        for r in f.results:
            line = f"{f.path}: {r.patch_id} {r.state}: {r.message}"
            if r.state in HARD_FAILURES:
                hard.append(line)
            elif r.state in (DRIFTED, MODIFIED):  # MODIFIED: an add_module edited since ddops wrote it
                drift.append(line)
    return hard, drift
