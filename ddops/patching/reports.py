"""What patch, verify, status and rollback found and did on one host, as values; their --json is their fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddops.jsonvalue import JsonValue, omitted_when_none
from ddops.patching.backups import SavedEdit
from ddops.patching.checks import CheckResult
from ddops.patching.kinds import ERROR
from ddops.patching.plan import HostPlan
from ddops.patching.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class PatchInFile(JsonValue):
    """One patch's result in one file: its state and why, whether it was matched as plain text, its lines."""

    id: str
    state: str
    message: str
    plain_text: bool
    lines: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FileReport(JsonValue):
    """One file of a host's plan: its state, hashes before and after, a read error, and each patch's result."""

    path: str
    state: str
    changed: bool
    before_sha256: str | None
    after_sha256: str | None
    error: str | None
    patches: tuple[PatchInFile, ...]


def file_reports(plan: HostPlan, snap: Snapshot) -> tuple[FileReport, ...]:
    """Per file of the plan: its report (a file the host could not read is in state `error`)."""
    return tuple(FileReport(f.path, ERROR if f.path in snap.errors else f.state, f.changed, f.before_sha, f.after_sha,
                            snap.errors.get(f.path),
                            tuple(PatchInFile(r.patch_id, r.state, r.message, r.outcome.plain_text,
                                              r.outcome.pending_lines or r.outcome.applied_lines) for r in f.results))
                 for f in plan.files)


@dataclass(frozen=True, slots=True)
class PatchReport(JsonValue):
    """What patch found on one host (each patch's state, each file's plan, the diff) and what it wrote and checked."""

    patches: Mapping[str, str]
    files: tuple[FileReport, ...]
    diff: str
    written: tuple[str, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    reverted: bool = False  # a check failed after writing: the originals were put back
    check_mode: bool = False
    # patch --check with hybrid playbooks: the host's transformers against their support matrix (its words)
    transformers_support: str | None = omitted_when_none()
    transformers_tested: bool | None = omitted_when_none()

    @property
    def plain_text_files(self) -> set[str]:
        """The files a plain-text transform (not AST-checked) changes."""
        return {f.path for f in self.files if any(p.plain_text for p in f.patches)}


@dataclass(frozen=True, slots=True)
class VerifyCheck(CheckResult):
    """One check verify ran, with the patch it belongs to (and a command's exit code)."""

    patch: str = ""
    exit_code: int | None = omitted_when_none()

    def to_json(self) -> dict[str, Any]:
        return {**JsonValue.to_json(self), "grep": self.grep_lines()}


@dataclass(frozen=True, slots=True)
class VerifyReport(JsonValue):
    """Every check of the playbooks, run against one host's files as they are."""

    checks: tuple[VerifyCheck, ...]


@dataclass(frozen=True, slots=True)
class StatusReport(JsonValue):
    """Each patch's state on one host, its files' plans, the repo's commit, and the journal lines that did not parse."""

    patches: Mapping[str, str]
    commit: str | None
    files: tuple[FileReport, ...]
    journal_corrupt: tuple[Mapping[str, Any], ...]
    versions: Mapping[str, str | None] | None = omitted_when_none()  # python, torch (and its CUDA), transformers


@dataclass(frozen=True, slots=True)
class Refusal(JsonValue):
    """A file that was left as it is, and why (with the patch, where the plan refused it)."""

    file: str
    reason: str
    patch: str | None = omitted_when_none()


@dataclass(frozen=True, slots=True)
class SavedEdits(JsonValue):
    """The foreign edits rollback --force saved on one host, oldest first (`backups list`)."""

    saved: tuple[SavedEdit, ...]


@dataclass(frozen=True, slots=True)
class ShownEdit(JsonValue):
    """One saved edit's bytes, and the file's bytes now when asked for (`backups show`), base64 as the agent sent."""

    saved: SavedEdit
    content_b64: str
    current_b64: str | None = omitted_when_none()


@dataclass(frozen=True, slots=True)
class RestoreReport(JsonValue):
    """A saved edit put back in its file on one host, or why not (`backups restore`)."""

    saved: SavedEdit
    restored: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = ()


@dataclass(frozen=True, slots=True)
class SavedCopy(JsonValue):
    """A foreign edit rollback --force saved before restoring its file: where its bytes lie on the host."""

    path: str
    sha256: str
    backup: str


@dataclass(frozen=True, slots=True)
class RollbackReport(JsonValue):
    """What rollback restored and refused on one host, the patches it meant, and the foreign edits it saved."""

    restored: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = ()
    not_applied: tuple[str, ...] | None = omitted_when_none()  # asked for, but not applied there
    patches: tuple[str, ...] | None = omitted_when_none()
    saved: tuple[SavedCopy, ...] | None = omitted_when_none()  # only once the agent was asked to restore
    check_mode: bool = False  # rollback --check: `restored` and `refused` are what a rollback would do

    def summary(self, host: str) -> str:
        """Every file restored and refused, and where each saved foreign edit is (with the command that shows it)."""
        parts = []
        would = "would be " if self.check_mode else ""
        if self.restored:
            parts.append(f"{'would restore' if self.check_mode else 'restored'} {', '.join(sorted(self.restored))}"
                         + (f" ({', '.join(self.patches)})" if self.check_mode and self.patches else ""))
        if self.refused:
            parts.append(f"{would}refused {'; '.join(r.reason for r in self.refused)}")
        for saved in self.saved or ():
            parts.append(f"saved the foreign edit of {saved.path} at {saved.backup} "
                         f"(ddops backups show {host} {saved.sha256[:12]})")
        return "; ".join(parts) or "nothing to roll back"
