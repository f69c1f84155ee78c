"""`ddops sync` and `ddops deploy`: the research repo at its pinned commit (then patched and verified)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddops.cli.onhosts import OnHosts
from ddops.cli.options import CheckOpt, ExitCodeOpt, command

if TYPE_CHECKING:
    from ddops.fleet import HostResult
    from ddops.inventory import Selection
    from ddops.tasks.sync import SyncReport

CommitOpt = Annotated[str | None, typer.Option("--commit", "-c", help="Commit, branch or tag for every selected "
                                                  "host (overrides the inventory's `commit:`).", show_default=False)]
ForceOpt = Annotated[bool, typer.Option("--force", help="Move even over local edits, saving them in a git stash "
                                        "first.")]
ReapplyOpt = Annotated[bool | None, typer.Option("--reapply/--no-reapply", help="Re-apply ddops patches after "
                                                    "moving (default: when the inventory lists `patches:`).",
                                                    show_default=False)]
ModeOpt = Annotated[str | None, typer.Option("--mode", help="remote: hosts fetch themselves; push: send a git "
                                                "bundle (default: each host's `sync:`, auto).", show_default=False)]
FromOpt = Annotated[str | None, typer.Option("--from", help="Local clone to resolve pins and make bundles from.",
                                                show_default=False)]


def register(app: typer.Typer) -> None:
    command(app, "sync")(sync)
    command(app, "deploy")(deploy)


def _run(ctx: typer.Context, name: str, selection: Selection, exit_code: bool, **options: Any) -> None:
    from ddops.tasks.sync import SyncOptions, prepare_sync

    run = OnHosts(ctx, selection)
    with prepare_sync(run.inventory, run.hosts, SyncOptions(**options)) as prepared:
        results = run.run(prepared.sync_task if name == "sync" else prepared.deploy_task)
    run.finish(results, columns=_COLUMNS[name], exit_code_on_change=exit_code)


def sync(ctx: typer.Context, selection: Selection, commit: CommitOpt = None, check: CheckOpt = False,
         force: ForceOpt = False, reapply: ReapplyOpt = None, mode: ModeOpt = None, from_: FromOpt = None,
         exit_code: ExitCodeOpt = False) -> None:
    """Put the repo at its pinned commit on the selected hosts, never over local edits."""
    _run(ctx, "sync", selection, exit_code, rev=commit, check=check, force=force, reapply=reapply, mode=mode,
         from_clone=from_)


def deploy(ctx: typer.Context, selection: Selection, commit: CommitOpt = None, check: CheckOpt = False,
           force: ForceOpt = False, mode: ModeOpt = None, from_: FromOpt = None,
           exit_code: ExitCodeOpt = False) -> None:
    """Sync to the pin, apply the inventory's `patches:`, verify: bring up a new GPU host in one command."""
    _run(ctx, "deploy", selection, exit_code, rev=commit, check=check, force=force, mode=mode, from_clone=from_)


def _synced(r: HostResult) -> SyncReport | None:
    from ddops.tasks.sync import DeployReport, SyncReport

    if isinstance(r.report, DeployReport):
        return r.report.sync
    return r.report if isinstance(r.report, SyncReport) else None


def _commit(key: str) -> Callable[[HostResult], str]:
    return lambda r: (getattr(_synced(r), key, None) or "")[:12]


def _moved(r: HostResult) -> str:
    from ddops.tasks.sync import human_size

    synced = _synced(r)
    return human_size(synced.bytes_moved) if synced else ""


def _step(key: str) -> Callable[[HostResult], str]:
    return lambda r: getattr(getattr(r.report, key, None), "status", "")


def _pin(r: HostResult) -> str:
    """`main@73068c9 (remote)`: the pin as the controller resolved it, and where."""
    synced = _synced(r)
    if synced is None:
        return ""
    where = synced.resolved_in or ""
    where = "clone" if where.startswith("the clone") else "remote" if where.startswith("the remote") else ""
    return f"{synced.pin_shown}{f' ({where})' if where else ''}"


_COLUMNS = {
    "sync": [("pin", _pin), ("before", _commit("before")), ("after", _commit("after")), ("moved", _moved)],
    "deploy": [("pin", _pin), ("before", _commit("before")), ("after", _commit("after")), ("moved", _moved),
               ("patch", _step("patch")), ("verify", _step("verify"))],
}
