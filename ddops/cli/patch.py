"""`ddops patch`, `verify`, `rollback`, `status`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddops import settings
from ddops.cli import completion
from ddops.cli.onhosts import OnHosts
from ddops.cli.options import CheckOpt, ExitCodeOpt, YesOpt, command
from ddops.cli.render import console, escape, recap
from ddops.cli.state import AppState
from ddops.errors import UsageError
from ddops.safe_text import printable

if TYPE_CHECKING:
    from ddops.fleet import HostResult, TaskOutcome
    from ddops.inventory import Host, Selection

PlaybooksArg = Annotated[list[str] | None, typer.Argument(
    help="Playbook names (from playbooks/) or paths; default: the inventory's `patches:`.", show_default=False,
    autocompletion=completion.playbooks)]
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
    from ddops.patching.snapshot import make_planner
    from ddops.tasks.patch import patch_host

    run = OnHosts(ctx, selection)
    books = _playbooks(run.state, playbook)
    planner = make_planner()
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


def show_diffs(results: Sequence[HostResult]) -> None:
    """Each distinct diff once, with the hosts that share it."""
    from rich.syntax import Syntax

    from ddops.patching.plan import group_diffs
    from ddops.patching.reports import PatchReport

    shown = {r.host: r.report for r in results
             if r.status in ("changed", "ok") and isinstance(r.report, PatchReport) and r.report.diff}
    for group in group_diffs({host: report.diff for host, report in shown.items()}):
        console.rule(f"[bold]{escape(group.title)}[/] ({escape(', '.join(group.hosts))})", align="left")
        plain = sorted(set().union(*(shown[h].plain_text_files for h in group.hosts)))
        if plain:
            console.print(f"[yellow]plain-text transform (not AST-checked):[/] {escape(', '.join(plain))}")
        console.print(Syntax(printable(group.diff), "diff", theme="ansi_dark", background_color="default",
                             word_wrap=True))


def verify(ctx: typer.Context, selection: Selection, playbook: PlaybooksArg = None) -> None:
    """Run the playbooks' checks and print what matched, like grep."""
    from ddops.tasks.patch import verify_host

    run = OnHosts(ctx, selection)
    books = _playbooks(run.state, playbook)
    run.finish(run.run(lambda h, s: verify_host(h, s, books)), render=_show_checks)


def _show_checks(results: Sequence[HostResult]) -> None:
    """Each distinct check line once, with the hosts that printed it (`all 24 hosts`, `host[1-3,7]`)."""
    from ddops.grouping import group_identical, hosts_cell
    from ddops.patching.reports import VerifyReport

    lines: list[tuple[str, str, str]] = []  # (host, mark, text)
    for r in results:
        for c in r.report.checks if isinstance(r.report, VerifyReport) else ():
            mark = "[green]ok[/]  " if c.ok else "[bold red]FAIL[/]"
            if c.finds_lines:
                lines += [(r.host, mark, line) for line in c.grep_lines()]
            else:
                lines.append((r.host, mark, c.name + (f": {c.message.splitlines()[-1]}" if c.message and not c.ok
                                                      else "")))
    checked = {host for host, _, _ in lines}
    for (mark, text), group in group_identical(lines, key=lambda line: line[1:]):
        who = hosts_cell(list(dict.fromkeys(host for host, _, _ in group)), among=len(checked))
        console.print(f"{mark} {escape(who)}  {escape(text)}")
    recap(results, title="ddops verify")


def rollback(ctx: typer.Context, selection: Selection, playbook: PlaybooksArg = None, force: ForceOpt = False,
             yes: YesOpt = False, check: CheckOpt = False, lock_timeout: LockTimeoutOpt = 10.0) -> None:
    """Restore the exact pre-patch bytes, newest patch first; with no selection, every host ddops patched (asked
    first at a terminal; --yes elsewhere)."""
    from ddops.tasks.patch import rollback_host

    run = OnHosts(ctx, selection, everywhere_when_empty=True)
    patch_ids = None
    if playbook:
        from ddops.patching.snapshot import all_patches

        patch_ids = [p.id for p in all_patches(_playbooks(run.state, playbook))]
    if selection.empty and not yes and not check:
        what = ", ".join(playbook) if playbook else "every ddops patch"
        if not sys.stdin.isatty() or run.json:
            raise UsageError(f"no host selected: this would roll back {what} on every host that has one "
                             f"({len(run.hosts)} in the inventory); pass --yes to do that without a terminal, "
                             "select hosts (--host, --group, --all, --limit), or see first with --check")
        if not typer.confirm(f"Roll back {what} on every host that has one ({len(run.hosts)} in the inventory)?"):
            raise typer.Exit(1)
    results = run.run(lambda h, s: rollback_host(h, s, patch_ids, force=force, lock_timeout=lock_timeout,
                                                 check=check), title="rollback --check" if check else "rollback")
    run.finish(results, title="ddops rollback --check (nothing written)" if check else "ddops rollback")


def status(ctx: typer.Context, selection: Selection, playbook: PlaybooksArg = None) -> None:
    """A host x patch table of states: pending, applied, drifted, modified; and each host's commit."""
    from ddops.patching.snapshot import make_planner
    from ddops.tasks.patch import status_host, with_pins

    run = OnHosts(ctx, selection, everywhere_when_empty=True)
    task: Callable[[Host, Any], TaskOutcome]
    if not (playbook or run.inventory.patches):
        # No playbook to plan against: show what each host's journal holds, as rollback reads it.
        from ddops.tasks.journal_status import journal_status_host

        books, task = [], journal_status_host
    else:
        books = _playbooks(run.state, playbook)
        planner = make_planner()
        task = lambda h, s: status_host(h, s, books, planner=planner)  # noqa: E731
    results = with_pins(run.run(task), run.hosts)
    run.finish(results, render=lambda results: _status_table(results, books, run.inventory,
                                                             versions=run.state.verbose > 0))


def _status_columns(books: Sequence[Any], patch_ids: Sequence[str],
                    inventory: Any) -> list[tuple[str, tuple[str, ...]]]:
    """(title, the patch ids it stands for): a column per playbook, not per patch id. With no playbook named, the
    playbooks that define the journal's patch ids, and a column of its own for an id none of them defines."""
    if not books:
        from ddops.errors import DdopsError
        from ddops.patching.playbook import playbooks_defining

        try:
            books = playbooks_defining(patch_ids, inventory)
        except DdopsError:  # a playbook on the search path that does not load: show the ids as they are
            books = []
    columns = [(b.name, tuple(p.id for p in b.patches)) for b in books]
    covered = {pid for _, ids in columns for pid in ids}
    return columns + [(pid, (pid,)) for pid in patch_ids if pid not in covered]


def _combined(states: Mapping[str, str], ids: Sequence[str], absent: str) -> tuple[str, str]:
    """A playbook's cell from its patches' states (`applied`, or `applied 2/3` when they differ) and the odd ones
    out for the note (`crop-recording pending`)."""
    from collections import Counter

    got = [states.get(pid, absent) for pid in ids]
    if len(set(got)) == 1:
        return got[0], ""
    most, n = Counter(got).most_common(1)[0]
    return f"{most} {n}/{len(ids)}", ", ".join(f"{pid} {state}" for pid, state in zip(ids, got) if state != most)


def _status_table(results: Sequence[HostResult], books: Sequence[Any], inventory: Any, *,
                  versions: bool = False) -> None:
    """Host x playbook states; with -v each host's python, torch (its CUDA) and transformers too."""
    from ddops.bench.environment import torch_cell
    from ddops.cli.render import show_table
    from ddops.cli.state import current_state
    from ddops.fleet import FOLD_OVER
    from ddops.grouping import group_identical, hosts_cell, natural_key

    shown = {r.host: r.report.status for r in results if r.report.status is not None}
    journal_ids = list(dict.fromkeys(pid for status in shown.values() for pid in status.patches))
    columns = _status_columns(books, journal_ids, inventory)
    # With playbooks every patch has a state; from a journal, a patch it does not hold is not applied there.
    absent = "-" if books else "not-applied"
    headers = ["host", "commit", "pin", *(["python", "torch", "transformers"] if versions else []),
               *(title for title, _ in columns), "note"]
    lines: list[tuple[str, list[str], dict[int, str]]] = []
    for r in sorted(results, key=lambda r: natural_key(r.host)):
        status = shown.get(r.host)
        states = status.patches if status else {}
        cells = [((status and status.commit) or "")[:10], r.report.pin.cell]
        if versions:
            found = (status.versions if status else None) or {}
            cells += [found.get("python") or "-", torch_cell(found), found.get("transformers") or "-"]
        odd, style = [], {}
        for title, ids in columns:
            cell, others = _combined(states, ids, absent) if status else ("-", "")
            style[len(cells) + 1] = STATE_STYLE.get(cell.partition(" ")[0], "")
            cells.append(cell)
            odd += [f"{title}: {others}"] if others else []
        said = r.message if r.status in ("failed", "unreachable", "drifted", "skipped") or not books else ""
        lines.append((r.host, [*cells, "; ".join([said] * bool(said) + odd)], style))
    # Past a screenful (and without --all-rows), hosts whose rows read the same share one.
    current = current_state()
    each = len(lines) <= FOLD_OVER or bool(current and current.all_rows)
    alike = group_identical(lines, key=(lambda line: line[0]) if each else (lambda line: tuple(line[1])))
    show_table(headers, [[hosts_cell([host for host, _, _ in group]), *group[0][1]] for _, group in alike],
               title="ddops status", styles=[group[0][2] for _, group in alike], folding=len(headers) - 1)
