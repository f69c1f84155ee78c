"""`ddops backups`: the foreign edits rollback --force saved on each host, shown and put back through the agent."""

from __future__ import annotations

import base64
from typing import Any

from ddops import __version__
from ddops.fleet import CHANGED, FAILED, OK, TaskOutcome
from ddops.inventory import Host
from ddops.patching.backups import find_saved, restore_refusal, saved_edits
from ddops.tasks.base import AgentSession, default_actor


def list_backups_host(host: Host, session: AgentSession) -> TaskOutcome:
    """The host's saved foreign edits, oldest first, each with its path on the host."""
    edits = saved_edits(session.call_agent("journal", {"repo": host.repo}).get("entries", []))
    data = {"saved": [e.to_dict(host.repo) for e in edits]}
    return TaskOutcome(OK, f"{len(edits)} saved edit{'s' if len(edits) != 1 else ''}", data)


def read_saved(host: Host, session: AgentSession, wanted: str) -> tuple[dict[str, str], bytes]:
    """One saved edit (a sha256 prefix or a file's newest) and its bytes."""
    edit = find_saved(saved_edits(session.call_agent("journal", {"repo": host.repo}).get("entries", [])), wanted,
                      host.name)
    reply = session.call_agent("read_backup", {"repo": host.repo, "sha256": edit.sha256})
    return edit.to_dict(host.repo), base64.b64decode(reply["content_b64"])


def show_saved_task(wanted: str, *, with_current: bool = False):
    """Task: one saved edit (data: "saved", its bytes as "content_b64", and with_current the file as it is now)."""

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        edit, content = read_saved(host, session, wanted)
        data: dict[str, Any] = {"saved": edit, "content_b64": base64.b64encode(content).decode("ascii")}
        if with_current:
            current = session.call_agent("snapshot", {"repo": host.repo, "files": [edit["file"]]})["files"][
                edit["file"]]
            data["current_b64"] = current.get("content_b64") or ""
        return TaskOutcome(OK, edit["backup"], data)

    return task


def restore_backup_host(host: Host, session: AgentSession, wanted: str, *, actor: str | None = None,
                        lock_timeout: float = 10.0) -> TaskOutcome:
    """Put a saved edit back in its file, compare-and-swap: only over what ddops last wrote there, journalled."""
    journal = session.call_agent("journal", {"repo": host.repo}).get("entries", [])
    edit = find_saved(saved_edits(journal), wanted, host.name)
    snapshot = session.call_agent("snapshot", {"repo": host.repo, "files": [edit.file]})
    current = (snapshot["files"].get(edit.file) or {}).get("sha256")
    data: dict[str, Any] = {"saved": edit.to_dict(host.repo), "restored": [], "refused": []}
    if current == edit.sha256:
        return TaskOutcome(OK, f"{edit.file} already holds the saved edit {edit.sha256[:12]}", data)
    refusal = restore_refusal(snapshot.get("journal", journal), edit, current)
    if refusal:
        data["refused"].append({"file": edit.file, "reason": refusal})
        return TaskOutcome(FAILED, f"refused {refusal}", data)
    reply = session.call_agent("rollback", {
        "repo": host.repo, "actor": actor or default_actor(), "ddops_version": __version__,
        "lock_timeout": lock_timeout,
        "restores": [{"path": edit.file, "patch_ids": [], "expected_sha256": current,
                      "restore_sha256": edit.sha256, "force": False}]})
    data["restored"] = reply.get("restored", [])
    problems = [f"{r['path']}: {r.get('reason') or r.get('message')}" for r in (*reply.get("refused", []),
                                                                              *reply.get("failed", []))]
    if problems or not data["restored"]:
        data["refused"] = [{"file": edit.file, "reason": p} for p in problems]
        return TaskOutcome(FAILED, f"refused {'; '.join(problems) or edit.file}", data)
    return TaskOutcome(CHANGED, f"restored the saved edit {edit.sha256[:12]} to {edit.file} (from "
                                f"{edit.path_on_host(host.repo)})", data)
