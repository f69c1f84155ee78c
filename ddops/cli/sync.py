"""`ddops sync` and `ddops deploy`: the research repo at its pinned commit (then patched and verified)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from ddops.cli.common import (AllOpt, CheckOpt, ForksOpt, GroupOpt, HostOpt, JsonOpt, LimitOpt, emit_json, finish,
                              fleet_run, recap, selected_hosts, state)

CommitOpt = Annotated[Optional[str], typer.Option("--commit", "-c", help="Commit, branch or tag for every selected "
                                                  "host (overrides the inventory's `commit:`).", show_default=False)]
ForceOpt = Annotated[bool, typer.Option("--force", help="Move even over local edits, saving them in a git stash "
                                        "first.")]
ReapplyOpt = Annotated[Optional[bool], typer.Option("--reapply/--no-reapply", help="Re-apply ddops patches after "
                                                    "moving (default: when the inventory lists `patches:`).",
                                                    show_default=False)]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", help="remote: hosts fetch themselves; push: send a git "
                                                "bundle (default: each host's `sync:`, auto).", show_default=False)]
FromOpt = Annotated[Optional[str], typer.Option("--from", help="Local clone to resolve pins and make bundles from.",
                                                show_default=False)]


def register(app: typer.Typer) -> None:
    app.command("sync")(sync)
    app.command("deploy")(deploy)


def _run(ctx: typer.Context, command: str, host: Any, group: Any, all_: bool, limit: Any, json_out: bool,
         forks: Any, **options: Any) -> None:
    from ddops.tasks.sync import SyncOptions, prepare_sync

    st = state(ctx)
    st.json = st.json or json_out
    inventory, chosen = selected_hosts(st, host, group, all_, limit)
    with prepare_sync(inventory, chosen, SyncOptions(**options)) as run:
        task = run.sync_task if command == "sync" else run.deploy_task
        results = fleet_run(st, inventory, chosen, task, title=command, forks=forks)
    if st.json:
        emit_json(command, results)
    else:
        recap(results, columns=_COLUMNS[command])
    finish(results)


def sync(ctx: typer.Context, host: HostOpt = None, group: GroupOpt = None, all_: AllOpt = False,
         limit: LimitOpt = None, commit: CommitOpt = None, check: CheckOpt = False, force: ForceOpt = False,
         reapply: ReapplyOpt = None, mode: ModeOpt = None, from_: FromOpt = None, json_out: JsonOpt = False,
         forks: ForksOpt = None) -> None:
    """Put the repo at its pinned commit on the selected hosts, never over local edits."""
    _run(ctx, "sync", host, group, all_, limit, json_out, forks, rev=commit, check=check, force=force,
         reapply=reapply, mode=mode, from_clone=from_)


def deploy(ctx: typer.Context, host: HostOpt = None, group: GroupOpt = None, all_: AllOpt = False,
           limit: LimitOpt = None, commit: CommitOpt = None, check: CheckOpt = False, force: ForceOpt = False,
           mode: ModeOpt = None, from_: FromOpt = None, json_out: JsonOpt = False, forks: ForksOpt = None) -> None:
    """Sync to the pin, apply the inventory's `patches:`, verify: bring up a new GPU host in one command."""
    _run(ctx, "deploy", host, group, all_, limit, json_out, forks, rev=commit, check=check, force=force, mode=mode,
         from_clone=from_)


def _sync_data(r: Any) -> dict:
    return r.data.get("sync", r.data) if r.data else {}


def _commit(key: str):
    return lambda r: (_sync_data(r).get(key) or "")[:12]


def _moved(r: Any) -> str:
    from ddops.tasks.sync import human_size

    data = _sync_data(r)
    return human_size(data["bytes_moved"]) if "bytes_moved" in data else ""


def _step(key: str):
    return lambda r: (r.data.get(key) or {}).get("status", "") if r.data else ""


def _pin(r: Any) -> str:
    """`main@73068c9 (remote)`: the pin as the controller resolved it, and where."""
    data = _sync_data(r)
    where = data.get("resolved_in") or ""
    where = "clone" if where.startswith("the clone") else "remote" if where.startswith("the remote") else ""
    return f"{data.get('pin_shown', '')}{f' ({where})' if where else ''}"


_COLUMNS = {
    "sync": [("pin", _pin), ("before", _commit("before")), ("after", _commit("after")), ("moved", _moved)],
    "deploy": [("pin", _pin), ("before", _commit("before")), ("after", _commit("after")), ("moved", _moved),
               ("patch", _step("patch")), ("verify", _step("verify"))],
}
