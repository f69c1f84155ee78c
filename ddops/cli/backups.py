"""`ddops backups list|show|restore`: the foreign edits `rollback --force` saved before restoring files."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from ddops import settings
from ddops.cli.common import (AllOpt, GroupOpt, HostOpt, JsonOpt, LimitOpt, YesOpt, console, emit_json, escape,
                              finish, fleet_run, recap, selected_hosts, state)

backups_app = typer.Typer(help="Foreign edits that rollback --force saved: list, show, restore.", no_args_is_help=True)
HostArg = Annotated[str, typer.Argument(help="The host (name or address).", show_default=False)]
WhichArg = Annotated[str, typer.Argument(help="A saved edit: its sha256 (a prefix will do) or its file (the newest "
                                              "saved edit of it).", show_default=False)]


def register(app: typer.Typer) -> None:
    app.add_typer(backups_app, name="backups")


@backups_app.command("list")
def list_(ctx: typer.Context, host: HostOpt = None, group: GroupOpt = None, all_: AllOpt = False,
          limit: LimitOpt = None, json_out: JsonOpt = False) -> None:
    """Every saved foreign edit of the selected hosts (all when none is selected): file, when, who, where."""
    from ddops.tasks.backups import list_backups_host

    st = state(ctx)
    st.json = st.json or json_out
    everywhere = not (host or group or all_ or limit)
    inventory, chosen = selected_hosts(st, host, group, True if everywhere else all_, limit)
    results = fleet_run(st, inventory, chosen, list_backups_host, title="backups list")
    if st.json:
        emit_json("backups list", results)
    else:
        from rich.table import Table

        table = Table(title="saved foreign edits", header_style="bold")
        for column in ("host", "file", "saved at", "by", "sha256", "on the host"):
            table.add_column(column, overflow="fold")
        for r in results:
            for s in (r.data or {}).get("saved", []):
                table.add_row(escape(r.host), escape(s["file"]), escape(s["time"]), escape(s["actor"]),
                              s["sha256"][:12], escape(s["backup"]))
        console.print(table)
        failed = [r for r in results if r.failed]
        if failed:
            recap(failed, title="hosts not read")
    finish(results)


@backups_app.command("show")
def show(ctx: typer.Context, host: HostArg, which: WhichArg,
         diff: Annotated[bool, typer.Option("--diff", help="Show how the file differs from the saved edit "
                                                          "instead.")] = False) -> None:
    """Print a saved edit's bytes on stdout (or, with --diff, the file as it is against the saved edit)."""
    from ddops.tasks.backups import read_saved

    st = state(ctx)
    got: dict[str, Any] = {}

    def task(h: Any, session: Any) -> Any:
        from ddops.fleet import OK, TaskOutcome

        edit, content = read_saved(h, session, which)
        got["edit"], got["content"] = edit, content
        if diff:
            got["current"] = session.call_agent("snapshot", {"repo": h.repo, "files": [edit["file"]]})["files"][
                edit["file"]]
        return TaskOutcome(OK, edit["backup"], {"saved": edit})

    inventory, chosen = selected_hosts(st, [host], None, False, None)
    st.json = True  # no progress lines around the bytes
    results = fleet_run(st, inventory, chosen, task, title="backups show")
    if results[0].failed:
        st.json = False
        recap(results)
        finish(results)
    if diff:
        import base64

        from ddops.patching.plan import unified_diff

        current = got["current"]
        now = base64.b64decode(current["content_b64"]) if current.get("content_b64") else b""
        sys.stdout.write(unified_diff(got["edit"]["file"], got["content"], now) or
                         f"{got['edit']['file']} holds the saved edit\n")
    else:
        sys.stdout.buffer.write(got["content"])
    sys.stdout.flush()


@backups_app.command("restore")
def restore(ctx: typer.Context, host: HostArg, which: WhichArg, yes: YesOpt = False, json_out: JsonOpt = False,
            lock_timeout: Annotated[float, typer.Option("--lock-timeout", envvar=settings.LOCK_TIMEOUT.name, min=0,
                                                        help="Seconds to wait for another ddops run's lock.")] = 10.0
            ) -> None:
    """Put a saved edit back in its file: only over what ddops last wrote there (no patch of ddops in place)."""
    from ddops.tasks.backups import restore_backup_host

    st = state(ctx)
    st.json = st.json or json_out
    inventory, chosen = selected_hosts(st, [host], None, False, None)
    if not yes and sys.stdin.isatty() and not st.json:
        if not typer.confirm(f"Put the saved edit {which} back on {chosen[0].name}?"):
            raise typer.Exit(1)
    results = fleet_run(st, inventory, chosen, lambda h, s: restore_backup_host(h, s, which,
                                                                                lock_timeout=lock_timeout),
                        title="backups restore")
    if st.json:
        emit_json("backups restore", results)
    else:
        recap(results, title="ddops backups restore")
    finish(results)
