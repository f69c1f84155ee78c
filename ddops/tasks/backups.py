"""`ddops backups`: the foreign edits rollback --force saved on each host, shown and put back through the agent."""

from __future__ import annotations

from dataclasses import replace

from ddops import __version__
from ddops.fleet import CHANGED, FAILED, OK, TaskOutcome
from ddops.inventory import Host
from ddops.patching.backups import find_saved, restore_refusal, saved_edits
from ddops.patching.reports import Refusal, RestoreReport, SavedEdits, ShownEdit
from ddops.tasks.base import AgentSession, default_actor


def list_backups_host(host: Host, session: AgentSession) -> TaskOutcome:
    """The host's saved foreign edits, oldest first, each with its path on the host."""
    edits = saved_edits(session.call_agent("journal", {"repo": host.repo}).get("entries", []))
    return TaskOutcome(OK, f"{len(edits)} saved edit{'s' if len(edits) != 1 else ''}",
                       SavedEdits(tuple(e.at(host.repo) for e in edits)))


def show_saved_task(wanted: str, *, with_current: bool = False):
    """Task: one saved edit (a sha256 prefix or a file's newest) and its bytes (with_current: and the file's now)."""

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        journal = session.call_agent("journal", {"repo": host.repo}).get("entries", [])
        edit = find_saved(saved_edits(journal), wanted).at(host.repo)
        reply = session.call_agent("read_backup", {"repo": host.repo, "sha256": edit.sha256})
        shown = ShownEdit(edit, reply["content_b64"])
        if with_current:
            files = session.call_agent("snapshot", {"repo": host.repo, "files": [edit.file]})["files"]
            shown = replace(shown, current_b64=files[edit.file].get("content_b64") or "")
        return TaskOutcome(OK, edit.backup, shown)

    return task


def restore_backup_host(host: Host, session: AgentSession, wanted: str, *, actor: str | None = None,
                        lock_timeout: float = 10.0) -> TaskOutcome:
    """Put a saved edit back in its file, compare-and-swap: only over what ddops last wrote there, journalled."""
    journal = session.call_agent("journal", {"repo": host.repo}).get("entries", [])
    edit = find_saved(saved_edits(journal), wanted).at(host.repo)
    snapshot = session.call_agent("snapshot", {"repo": host.repo, "files": [edit.file]})
    current = (snapshot["files"].get(edit.file) or {}).get("sha256")
    report = RestoreReport(edit)
    if current == edit.sha256:
        return TaskOutcome(OK, f"{edit.file} already holds the saved edit {edit.sha256[:12]}", report)
    refusal = restore_refusal(snapshot.get("journal", journal), edit, current)
    if refusal:
        return TaskOutcome(FAILED, f"refused {refusal}", replace(report, refused=(Refusal(edit.file, refusal),)))
    reply = session.call_agent("rollback", {
        "repo": host.repo, "actor": actor or default_actor(), "ddops_version": __version__,
        "lock_timeout": lock_timeout,
        "restores": [{"path": edit.file, "patch_ids": [], "expected_sha256": current,
                      "restore_sha256": edit.sha256, "force": False}]})
    report = replace(report, restored=tuple(reply.get("restored", [])))
    problems = [f"{r['path']}: {r.get('reason') or r.get('message')}" for r in (*reply.get("refused", []),
                                                                              *reply.get("failed", []))]
    if problems or not report.restored:
        return TaskOutcome(FAILED, f"refused {'; '.join(problems) or edit.file}",
                           replace(report, refused=tuple(Refusal(edit.file, p) for p in problems)))
    return TaskOutcome(CHANGED, f"restored the saved edit {edit.sha256[:12]} to {edit.file} (from {edit.backup})",
                       report)
