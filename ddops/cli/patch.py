"""`ddops patch`, `verify`, `rollback`, `status`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional, Sequence

import typer

from ddops import settings
from ddops.cli.common import AppState, CheckOpt, ExitCodeOpt, OnHosts, YesOpt, command, console, escape, recap
from ddops.errors import UsageError

if TYPE_CHECKING:
    from ddops.inventory import Selection

PlaybooksArg = Annotated[Optional[list[str]], typer.Argument(
    help="Playbook names (from playbooks/) or paths; default: the inventory's `patches:`.", show_default=False)]
DiffOpt = Annotated[bool, typer.Option("--diff", help="Also show the diff of what is written.")]
LockTimeoutOpt = Annotated[float, typer.Option("--lock-timeout", envvar=settings.LOCK_TIMEOUT.name, min=0,
                                               help="Seconds to wait for another ddops run's lock on a repo.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Restore even files edited since ddops wrote them "
                                                        "(the edit is saved as a backup first).")]

STATE_STYLE = {"applied": "green", "pending": "yellow", "partial": "yellow", "drifted": "bold red",
               "modified": "bold magenta", "ambiguous": "bold red", "error": "bold red", "blocked": "red"}


def register(app: typer.Typer) -> None:
    for name, fn in (("patch", patch), ("verify", verify), ("rollback", rollback), ("status", status)):
        command(app, name)(fn)


def _playbooks(st: AppState, names: Sequence[str] | None) -> list[Any]:
    from ddops.patching.playbook import load_inventory_playbooks

    inventory = st.load_inventory()
    if not (names or inventory.patches):
        raise UsageError(f"no playbook named and no `patches:` in {inventory.path}")
    return load_inventory_playbooks(inventory, names)


def patch(ctx: typer.Context, selection: Selection, playbook: PlaybooksArg = None, check: CheckOpt = False,
          diff: DiffOpt = False, exit_code: ExitCodeOpt = False, lock_timeout: LockTimeoutOpt = 10.0) -> None:
    """Apply patch playbooks: plan locally, back up, write atomically, journal, check."""
    from ddops.patching.snapshot import all_patches, make_planner
    from ddops.tasks.patch import patch_host

    run = OnHosts(ctx, selection)
    books = _playbooks(run.state, playbook)
    planner = make_planner(all_patches(books))
    results = run.run(lambda h, s: patch_host(h, s, books, planner=planner, check=check, lock_timeout=lock_timeout),
                      title="patch --check" if check else "patch")

    def render(results: Sequence[Any]) -> None:
        if check or diff:
            show_diffs(results)
        recap(results, title="ddops patch --check (nothing written)" if check else "ddops patch")
        if run.state.verbose:
            console.print(f"transforms: {planner.cache_misses} computed, {planner.disk_hits} from the disk cache, "
                          f"{planner.cache_hits} shared between hosts")

    run.finish(results, {"check": check, "playbooks": [b.name for b in books],
                         "transforms": {"cache_hits": planner.cache_hits, "cache_misses": planner.cache_misses,
                                        "disk_hits": planner.disk_hits}}, render=render,
               exit_code_on_change=exit_code)


def show_diffs(results: Sequence[Any]) -> None:
    """Each distinct diff once, with the hosts that share it."""
    from rich.syntax import Syntax

    from ddops.patching.plan import group_diffs

    shown = [r for r in results if r.status in ("changed", "ok") and r.data.get("diff")]
    plain_text_files = {r.host: {f["path"] for f in r.data.get("files", [])
                                 if any(p.get("plain_text") for p in f["patches"])} for r in shown}
    for group in group_diffs({r.host: r.data["diff"] for r in shown}):
        console.rule(f"[bold]{escape(group.title)}[/] ({escape(', '.join(group.hosts))})", align="left")
        plain = sorted(set().union(*(plain_text_files[h] for h in group.hosts)))
        if plain:
            console.print(f"[yellow]plain-text transform (not AST-checked):[/] {escape(', '.join(plain))}")
        console.print(Syntax(group.diff, "diff", theme="ansi_dark", background_color="default", word_wrap=True))


def verify(ctx: typer.Context, selection: Selection, playbook: PlaybooksArg = None) -> None:
    """Run the playbooks' checks and print what matched, like grep."""
    from ddops.tasks.patch import verify_host

    run = OnHosts(ctx, selection)
    books = _playbooks(run.state, playbook)
    run.finish(run.run(lambda h, s: verify_host(h, s, books)), render=_show_checks)


def _show_checks(results: Sequence[Any]) -> None:
    for r in results:
        for c in r.data.get("checks", []):
            mark = "[green]ok[/]  " if c["ok"] else "[bold red]FAIL[/]"
            lines = c.get("grep") or []
            if c["kind"] in ("contains", "unchanged", "count") and lines:
                for line in lines:
                    console.print(f"{mark} {escape(r.host)}  {escape(line)}")
            else:
                detail = c.get("message") or ""
                console.print(f"{mark} {escape(r.host)}  {escape(c['name'])}"
                              + (f": {escape(detail.splitlines()[-1])}" if detail and not c["ok"] else ""))
    recap(results, title="ddops verify")


def rollback(ctx: typer.Context, selection: Selection, playbook: PlaybooksArg = None, force: ForceOpt = False,
             yes: YesOpt = False, lock_timeout: LockTimeoutOpt = 10.0) -> None:
    """Restore the exact pre-patch bytes, newest patch first; with no selection, every host ddops patched."""
    from ddops.tasks.patch import rollback_host

    run = OnHosts(ctx, selection, everywhere_when_empty=True)
    patch_ids = None
    if playbook:
        from ddops.patching.snapshot import all_patches

        patch_ids = [p.id for p in all_patches(_playbooks(run.state, playbook))]
    if selection.empty and not yes and sys.stdin.isatty() and not run.json:
        what = ", ".join(playbook) if playbook else "every ddops patch"
        if not typer.confirm(f"Roll back {what} on every host that has one ({len(run.hosts)} in the inventory)?"):
            raise typer.Exit(1)
    results = run.run(lambda h, s: rollback_host(h, s, patch_ids, force=force, lock_timeout=lock_timeout))
    run.finish(results, title="ddops rollback")


def status(ctx: typer.Context, selection: Selection, playbook: PlaybooksArg = None) -> None:
    """A host x patch table of states: pending, applied, drifted, modified; and each host's commit."""
    from ddops.patching.snapshot import all_patches, make_planner
    from ddops.tasks.patch import status_host

    run = OnHosts(ctx, selection, everywhere_when_empty=True)
    if not (playbook or run.inventory.patches):
        # No playbook to plan against: show what each host's journal holds, as rollback reads it.
        from ddops.tasks.journal_status import journal_status_host

        books, task = [], journal_status_host
    else:
        books = _playbooks(run.state, playbook)
        planner = make_planner(all_patches(books))
        task = lambda h, s: status_host(h, s, books, planner=planner)  # noqa: E731
    results = run.run(task)
    from ddops.pins import host_pins

    summaries = host_pins(run.hosts, [r.data.get("commit") for r in results])
    pins = {name: _pin_cell(summary) for name, summary in summaries.items()}
    if run.json:
        for r in results:
            if r.host in summaries:
                r.data["pin"] = summaries[r.host]["state"]
                r.data["pin_detail"] = summaries[r.host]
    run.finish(results, render=lambda results: _status_table(results, books, pins))


def _status_table(results: Sequence[Any], books: Sequence[Any], pins: dict[str, str]) -> None:
    patch_ids = [p.id for b in books for p in b.patches] or list(
        dict.fromkeys(pid for r in results for pid in r.data.get("patches", {})))
    from rich.table import Table

    table = Table(title="ddops status", header_style="bold")
    table.add_column("host", no_wrap=True)
    table.add_column("commit")
    table.add_column("pin")
    for pid in patch_ids:
        table.add_column(pid)
    table.add_column("note", overflow="fold")
    for r in results:
        states = r.data.get("patches", {})
        commit = r.data.get("commit") or ""
        cells = []
        for pid in patch_ids:
            s = states.get(pid, "-")
            cells.append(f"[{STATE_STYLE.get(s, '')}]{s}[/]" if s in STATE_STYLE else escape(s))
        note = r.message if r.status in ("failed", "unreachable", "drifted") or not books else ""
        table.add_row(escape(r.host), commit[:10], escape(pins.get(r.host, "")), *cells, escape(note))
    console.print(table)


def _pin_cell(summary: dict) -> str:
    """`at-pin main@73068c9`: the state and the pin as the controller resolved it."""
    shown = summary.get("pin")
    return f"{summary['state']} {shown}" if shown else str(summary["state"])
