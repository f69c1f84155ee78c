"""`ddops status` with no playbook: what each host's journal holds, read the way rollback reads it.

Every patch ddops applied on the host and has not rolled back, its state (`applied`, or `modified` when one of its
files changed since ddops last wrote it, `missing` when the file is gone), and those files. No playbook is
needed: the journal names the patches and the hashes ddops wrote."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddops.bench.environment import host_versions
from ddops.fleet import DRIFTED, OK, TaskOutcome
from ddops.inventory import Host
from ddops.jsonvalue import JsonValue, omitted_when_none
from ddops.patching import journal as journal_mod

APPLIED, MODIFIED, MISSING = journal_mod.JOURNAL_APPLIED, journal_mod.MODIFIED, "missing"


@dataclass(frozen=True, slots=True)
class AppliedPatch(JsonValue):
    """One patch ddops applied on a host and has not rolled back."""

    patch: str
    files: tuple[str, ...]
    changed_since: tuple[str, ...]  # its files whose content is not what ddops last wrote
    missing: tuple[str, ...]        # its files that are gone
    applied_at: str                 # when it was (last) applied

    @property
    def state(self) -> str:
        return MISSING if self.missing else MODIFIED if self.changed_since else APPLIED

    def to_json(self) -> dict[str, Any]:
        return {**JsonValue.to_json(self), "state": self.state}


@dataclass(frozen=True, slots=True)
class JournalReport(JsonValue):
    """What one host's journal holds (ddops' patches in place, each one's state now) and the repo's commit."""

    commit: str | None
    applied: tuple[AppliedPatch, ...]
    journal_corrupt: tuple[Mapping[str, Any], ...]
    versions: Mapping[str, str | None] | None = omitted_when_none()  # python, torch (and its CUDA), transformers

    @property
    def patches(self) -> dict[str, str]:
        return {p.patch: p.state for p in self.applied}

    def to_json(self) -> dict[str, Any]:
        return {**JsonValue.to_json(self), "patches": self.patches}


def applied_patches(journal: Sequence[Mapping[str, Any]],
                    current_sha_by_file: Mapping[str, str | None]) -> list[AppliedPatch]:
    """The journal's active patches in the order they were applied, each with its files' state now."""
    modified = journal_mod.modified_files(journal, current_sha_by_file)
    by_patch: dict[str, list[journal_mod.Application]] = {}
    for a in journal_mod.active_applications(journal):
        by_patch.setdefault(a.patch, []).append(a)
    out = []
    for patch, apps in by_patch.items():
        files = tuple(a.file for a in apps)
        out.append(AppliedPatch(
            patch, files,
            changed_since=tuple(f for f in files if f in modified and current_sha_by_file.get(f) is not None),
            missing=tuple(f for f in files if f in modified and current_sha_by_file.get(f) is None),
            applied_at=max(a.time for a in apps)))
    return out


def journal_and_files(host: Host, session: Any, *, facts: bool = False
                      ) -> tuple[list[dict[str, Any]], dict[str, str | None], dict[str, Any]]:
    """The host's journal, the sha256 now of every file it holds applied (None: gone), and the first snapshot's
    answer (its facts when asked)."""
    first = session.call_agent("snapshot", {"repo": host.repo, "files": [], "facts": facts})
    journal = list(first.get("journal") or [])
    files = sorted({a.file for a in journal_mod.active_applications(journal)})
    shas: dict[str, str | None] = {}
    if files:
        # A second round trip only where ddops has something applied: the journal names the files to hash.
        snap = session.call_agent("snapshot", {"repo": host.repo, "files": files})
        for path in files:
            record = snap["files"].get(path) or {}
            shas[path] = record.get("sha256") if record.get("exists") else None
    return journal, shas, first


def journal_status_host(host: Host, session: Any) -> TaskOutcome:
    """One host's journal, and whether the files it names are still as ddops left them."""
    journal, shas, first = journal_and_files(host, session, facts=True)
    applied = applied_patches(journal, shas)
    report = JournalReport((first.get("facts") or {}).get("git_commit"), tuple(applied),
                           tuple(first.get("journal_corrupt") or ()), host_versions(first.get("facts")))
    corrupt = journal_mod.describe_corrupt(report.journal_corrupt)
    said = f"; {corrupt}" if corrupt else ""
    if not applied:
        return TaskOutcome(OK, "no ddops patch applied" + said, report)
    attention = [p for p in applied if p.state != APPLIED]
    if attention:
        return TaskOutcome(DRIFTED, "; ".join(
            f"{p.patch} {p.state}: " + ", ".join(p.missing or p.changed_since) + (" gone" if p.missing else
                                                                                 " changed since ddops wrote it")
            for p in attention) + said, report)
    return TaskOutcome(OK, f"{len(applied)} applied" + said, report)


__all__ = ["AppliedPatch", "JournalReport", "applied_patches", "journal_and_files", "journal_status_host"]
