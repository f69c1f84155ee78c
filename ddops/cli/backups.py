"""`ddops backups list|show|restore`: the foreign edits `rollback --force` saved before restoring files."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddops import settings
from ddops.cli.onhosts import OnHosts
from ddops.cli.options import YesOpt, command, one_host
from ddops.cli.render import recap, show_table
from ddops.safe_text import printable

if TYPE_CHECKING:
    from ddops.inventory import Selection

backups_app = typer.Typer(help="Foreign edits that rollback --force saved: list, show, restore.", no_args_is_help=True)
HostArg = Annotated[str, typer.Argument(help="The host (name or address).", show_default=False)]
WhichArg = Annotated[str, typer.Argument(help="A saved edit: its sha256 (a prefix will do) or its file (the newest "
                                              "saved edit of it).", show_default=False)]


def register(app: typer.Typer) -> None:
    app.add_typer(backups_app, name="backups")


@command(backups_app, "list")
def list_(ctx: typer.Context, selection: Selection) -> None:
    """Every saved foreign edit of the selected hosts (all when none is selected): file, when, who, where."""
    from ddops.tasks.backups import list_backups_host

    run = OnHosts(ctx, selection, everywhere_when_empty=True)
    run.finish(run.run(list_backups_host, title="backups list"), render=_saved_table)


def _saved_table(results: Sequence[Any]) -> None:
    show_table(["host", "file", "saved at", "by", "sha256", "on the host"],
               [[r.host, s.file, s.time, s.actor, s.sha256[:12], s.backup]
                for r in results for s in (r.report.saved if r.report else ())], title="saved foreign edits")
    failed = [r for r in results if r.failed]
    if failed:
        recap(failed, title="hosts not read")


@command(backups_app, "show")
def show(ctx: typer.Context, host: HostArg, which: WhichArg,
         diff: Annotated[bool, typer.Option("--diff", help="Show how the file differs from the saved edit "
                                                          "instead.")] = False) -> None:
    """Print a saved edit's bytes on stdout (or, with --diff, the file as it is against the saved edit)."""
    import base64

    from ddops.tasks.backups import show_saved_task

    run = OnHosts(ctx, one_host(host))
    results = run.run(show_saved_task(which, with_current=diff), progress=False)  # nothing around the bytes
    if run.json or results[0].failed:
        run.finish(results)
        return
    shown = results[0].report
    content = base64.b64decode(shown.content_b64)
    if diff:
        from ddops.patching.plan import unified_diff

        sys.stdout.write(printable(unified_diff(shown.saved.file, content, base64.b64decode(shown.current_b64 or ""))
                                   or f"{shown.saved.file} holds the saved edit\n"))
    else:
        sys.stdout.buffer.write(content)
    sys.stdout.flush()


@command(backups_app, "restore")
def restore(ctx: typer.Context, host: HostArg, which: WhichArg, yes: YesOpt = False,
            lock_timeout: Annotated[float, typer.Option("--lock-timeout", envvar=settings.LOCK_TIMEOUT.name, min=0,
                                                        help="Seconds to wait for another ddops run's lock.")] = 10.0
            ) -> None:
    """Put a saved edit back in its file: only over what ddops last wrote there (no patch of ddops in place)."""
    from ddops.tasks.backups import restore_backup_host

    run = OnHosts(ctx, one_host(host))
    if not yes and sys.stdin.isatty() and not run.json:
        if not typer.confirm(f"Put the saved edit {which} back on {run.hosts[0].name}?"):
            raise typer.Exit(1)
    results = run.run(lambda h, s: restore_backup_host(h, s, which, lock_timeout=lock_timeout), title="backups restore")
    run.finish(results, title="ddops backups restore")
