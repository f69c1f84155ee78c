"""`ddops bench [PLAN]` (launch detached runs, then follow them) and `ddops bench
status|logs|stop|list|collect|report`."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from ddops.cli import completion
from ddops.cli.follow import RUN_STYLE, follow_run, hints, print_logs, render_runs, when
from ddops.cli.onhosts import OnHosts
from ddops.cli.options import CheckOpt, YesOpt, command
from ddops.cli.render import console, err_console, escape, recap, write_document
from ddops.cli.state import current_state, state
from ddops.safe_text import csv_safe, printable

if TYPE_CHECKING:
    from ddops.bench.document import ReportDocument
    from ddops.fleet import HostResult
    from ddops.inventory import Inventory, Selection


class _BenchGroup(TyperGroup):
    """`ddops bench PLAN --all` means `ddops bench run PLAN --all`: anything that is not a subcommand goes to `run`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


bench_app = typer.Typer(cls=_BenchGroup, no_args_is_help=True,
                        help="Run bench plans detached on the hosts, follow them, collect results, report.")

ResultsDirOpt = Annotated[Path | None, typer.Option("--results-dir", help="Where collected results and launch "
                                                       "records live (default: $DDOPS_RESULTS_DIR or ./results).",
                                                       show_default=False)]
FollowOpt = Annotated[bool | None, typer.Option("--follow/--no-follow", "-f", help="Stream the hosts' logs and "
                                                   "progress until the run ends (default: on a terminal).",
                                                   show_default=False)]
RunIdArg = Annotated[str | None, typer.Argument(help="Run id (default: the last one launched from here).",
                                                   show_default=False, autocompletion=completion.run_ids)]
AllowBusyGpusOpt = Annotated[bool, typer.Option("--allow-busy-gpus", help="Launch on a GPU that is busy or unhealthy "
                                                "(held by another process, ECC errors, Xid events, throttled, unlike "
                                                "its siblings): a warning instead of a refusal.")]


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


# --- launch --------------------------------------------------------------------------------------------------------


@command(bench_app, "run")
def run(ctx: typer.Context, selection: Selection,
        plan: Annotated[str | None, typer.Argument(
            help="Bench plan: a name from playbooks/ or a YAML path (default: the inventory's `bench:`).",
            show_default=False, autocompletion=completion.plans)] = None,
        follow: FollowOpt = None,
        run_id: Annotated[str | None, typer.Option("--run-id", help="Name the run (default: "
                                                      "YYYYMMDD-HHMM-xxxx, UTC).", show_default=False)] = None,
        check: CheckOpt = False, results_dir: ResultsDirOpt = None,
        var: Annotated[list[str] | None, typer.Option("--var", help="NAME=VALUE for one of the plan's "
                                                         "placeholders, in every run (beats the plan's and the "
                                                         "host's vars). Repeatable.", show_default=False)] = None,
        only: Annotated[list[str] | None, typer.Option("--only", help="NAME=V1[,V2]: run only the matrix "
                                                          "entries with these values (a smoke run). Repeatable.",
                                                          show_default=False)] = None,
        from_: Annotated[str | None, typer.Option("--from", help="Local clone to resolve branch and tag pins "
                                                     "in, as `sync --from` (default: each host's repo_url).",
                                                     show_default=False)] = None,
        allow_busy_gpus: AllowBusyGpusOpt = False) -> None:
    """Check each host (patches applied, packages, disk, GPUs and their health, repo and commit), then start the
    plan's runs detached.

    With --json: one JSON document with the run id and each host's launch result; never follows."""
    from ddops.bench.plan import narrow_plan, parse_assignments
    from ddops.bench.runs import check_run_id, new_run_id, results_root, write_launch_record
    from ddops.fleet import worst_exit_code
    from ddops.pins import Pins, checked_clone
    from ddops.tasks.bench import check_task, launch_task

    inventory = state(ctx).load_inventory()  # its playbooks are where the patches the plan requires are defined
    values = {k: v[0] for k, v in parse_assignments(var or (), "--var").items()}
    bench_plan = narrow_plan(_plan(inventory, plan), values, parse_assignments(only or (), "--only"))
    pins = Pins(from_clone=checked_clone(from_) if from_ else None)  # each pin resolved once, on this machine
    on = OnHosts(ctx, selection)
    if check:
        on.finish(on.run(check_task(bench_plan, pins, inventory, allow_busy_gpus=allow_busy_gpus),
                         title=f"bench {bench_plan.name} --check"),
                  {"check": True, "plan": bench_plan.name}, render=_show_check)
        return
    rid = check_run_id(run_id) if run_id else new_run_id()
    results = on.run(launch_task(bench_plan, rid, pins, inventory, allow_busy_gpus=allow_busy_gpus),
                     title=f"bench {bench_plan.name}")
    launched = [h for h, r in zip(on.hosts, results) if r.status == "changed"]
    if launched:
        write_launch_record(results_root(results_dir), rid, bench_plan, [h.name for h in launched], inventory.path)
    following = bool(launched) and not on.json and not on.interrupt.requested and \
        (sys.stdout.isatty() if follow is None else follow)
    render = functools.partial(_show_launch, rid, len(launched), following)
    if not following:
        on.finish(results, {"check": False, "run_id": rid if launched else None, "plan": bench_plan.name},
                  render=render, failed=not launched)
        return
    render(results)
    raise typer.Exit(max(follow_run(on.state, inventory, launched, rid), worst_exit_code(results)))


def _show_check(results: Sequence[HostResult]) -> None:
    """The recap, then each distinct list of commands once, with the hosts that would run it."""
    from ddops.bench.runs import PreflightReport
    from ddops.grouping import group_identical, hosts_cell

    recap(results, title="ddops bench --check (nothing launched)")
    ready = [r for r in results if isinstance(r.report, PreflightReport) and r.report.commands]
    for commands, group in group_identical(ready, key=lambda r: r.report.commands):
        who = hosts_cell([r.host for r in group], among=len(results))
        console.rule(f"[bold]{escape(who)}[/]: {len(commands)} run{'s' if len(commands) != 1 else ''}", align="left")
        for line in commands:
            console.print(escape(line), soft_wrap=True, highlight=False)


def _show_launch(run_id: str, launched: int, following: bool, results: Sequence[HostResult]) -> None:
    recap(results, columns=[("runs", lambda r: str(r.report.total) if r.status == "changed" else "")])
    if launched:
        console.print(f"run {run_id}: launched on {launched} host{'s' if launched != 1 else ''}")
        if not following:
            hints(run_id, detached=False)


def _plan(inventory: Inventory, named: str | None) -> Any:
    """The plan named, else the inventory's `bench:`; with neither, the plans there are, and nothing launched."""
    from ddops.bench.preflight import list_plans, load_plan
    from ddops.errors import PlaybookError, UsageError

    if named:
        return load_plan(named, inventory)
    if inventory.bench:
        try:
            return load_plan(inventory.bench, inventory)
        except PlaybookError as exc:
            raise PlaybookError(f"{inventory.bench_where}: bench: {exc}") from None
    plans = list_plans(inventory)
    current = current_state()
    if not (current and current.json):
        from rich.table import Table

        table = Table(title="bench plans", header_style="bold")
        table.add_column("plan", no_wrap=True)
        table.add_column("what it runs", overflow="fold")
        for name, description in plans:
            table.add_row(escape(name), escape(description))
        err_console.print(table)
    raise UsageError(f"no bench plan named and no `bench:` in {inventory.path}: nothing launched; name one "
                     f"(`ddops bench PLAN --all`) or set `bench: PLAN` there ({', '.join(n for n, _ in plans)})")


# --- status, logs, stop, list -----------------------------------------------------------------------------------------


def _on_run(ctx: typer.Context, selection: Selection, results_dir: Path | None,
            run_id: str | None) -> tuple[Path, str, OnHosts]:
    """The results folder, the run id (default: the last one launched from here) and its hosts: the selection when
    one is given, else the hosts the run was launched on (else every inventory host)."""
    from ddops.bench.runs import resolve_run_id, results_root, run_hosts

    root = results_root(results_dir)
    rid = resolve_run_id(root, run_id)
    if not selection.empty:
        return root, rid, OnHosts(ctx, selection)
    return root, rid, OnHosts(ctx, selection, hosts=run_hosts(state(ctx).load_inventory().hosts, root, rid))


@command(bench_app, "status")
def status(ctx: typer.Context, selection: Selection, run_id: RunIdArg = None,
           results_dir: ResultsDirOpt = None) -> None:
    """Each host's state of a run: progress, exit codes, and the log tail of every command that failed."""
    from ddops.bench.runs import RunReport
    from ddops.tasks.bench import status_task

    _, rid, on = _on_run(ctx, selection, results_dir, run_id)
    results = on.run(status_task(rid), title=f"bench status {rid}")

    def render(results: Sequence[HostResult]) -> None:
        runs = [r.report.run for r in results if isinstance(r.report, RunReport)]
        errors = {r.host: r.message for r in results if r.status == "unreachable"}
        render_runs(runs, errors)
        skipped = [r.host for r in results if r.status == "skipped"]
        if skipped:
            err_console.print(f"no run {rid} on: {', '.join(skipped)}")
        if not runs:
            raise typer.Exit(1)

    on.finish(results, {"run_id": rid}, render=render)


@command(bench_app, "logs")
def logs(ctx: typer.Context, selection: Selection, run_id: RunIdArg = None,
         follow: Annotated[bool, typer.Option("--follow", "-f", "-F", help="Keep streaming until the run ends.")]
         = False, results_dir: ResultsDirOpt = None) -> None:
    """The run's log from each host (prefixed with the host name), or streamed live with --follow (-f)."""
    from ddops.bench.runs import LogReport
    from ddops.tasks.bench import logs_task

    _, rid, on = _on_run(ctx, selection, results_dir, run_id)
    if follow:
        raise typer.Exit(follow_run(on.state, on.inventory, on.hosts, rid))
    results = on.run(logs_task(rid), progress=False)
    logs = {r.host: r.report.log for r in results if isinstance(r.report, LogReport)}
    if on.json:
        on.finish(results, {"run_id": rid}, failed=not logs)
        return
    print_logs(logs, prefix=len(results) > 1)
    for r in results:
        if r.host not in logs:
            err_console.print(f"{escape(r.host)}: {escape(r.status)}: {escape(r.message)}")
    if not logs:
        raise typer.Exit(1)


@command(bench_app, "stop")
def stop(ctx: typer.Context, selection: Selection,
         run_id: Annotated[str, typer.Argument(help="Run id.", autocompletion=completion.run_ids)],
         grace: Annotated[float, typer.Option("--grace", min=0, help="Seconds between SIGTERM and SIGKILL.")] = 5.0,
         yes: YesOpt = False, results_dir: ResultsDirOpt = None,
         task: Annotated[list[int] | None, typer.Option("--task", min=0, help="Slurm runs: cancel only this array "
                                                           "task (repeatable).", show_default=False)] = None) -> None:
    """End every process of the run on each host (and all they started) and record it as stopped; a Slurm run's
    job (or only --task N of its array) is scancel'ed."""
    from ddops.bench.runs import check_run_id
    from ddops.tasks.base import default_actor
    from ddops.tasks.bench import stop_task
    from ddops.tasks.slurm import check_tasks_option

    _, rid, on = _on_run(ctx, selection, results_dir, check_run_id(run_id))
    if not yes and sys.stdin.isatty() and not on.json:
        typer.confirm(f"stop run {rid} on {len(on.hosts)} host(s)?", abort=True)
    check_tasks_option(on.hosts, task or [])
    on.finish(on.run(stop_task(rid, default_actor(), grace, task or []), title=f"bench stop {rid}"), {"run_id": rid})


@command(bench_app, "list")
def list_runs(ctx: typer.Context, selection: Selection) -> None:
    """Every bench run found on the hosts (all inventory hosts when none is selected), newest first."""
    from ddops.tasks.bench import list_task

    on = OnHosts(ctx, selection, everywhere_when_empty=True)
    on.finish(on.run(list_task, title="bench list"), render=_runs_table)


def _alike_runs(results: Sequence[HostResult]) -> list[tuple[tuple, list]]:
    """((run id, plan, status, done, total), [(run, host)...]): the hosts whose run is alike, newest run first."""
    from ddops.grouping import group_identical, natural_key

    rows = [(run, r.host) for r in results if r.report for run in r.report.runs]
    rows.sort(key=lambda x: natural_key(x[1]))
    rows.sort(key=lambda x: x[0].run_id or "", reverse=True)
    return group_identical(rows, key=lambda x: (x[0].run_id, x[0].plan, str(x[0].status), x[0].done, x[0].total))


def _runs_table(results: Sequence[HostResult]) -> None:
    """One row per run and state: the hosts whose run is alike (plan, status, progress) share it, with the earliest
    start and the latest end among them."""
    from ddops.cli.render import show_table
    from ddops.grouping import hosts_cell

    rows, styles = [], []
    for (run_id, plan, status, done, total), group in _alike_runs(results):
        hosts = [h for _, h in group]
        started = min((run.started for run, _ in group if run.started), default=None)
        ended = None if any(not run.ended for run, _ in group) else max(run.ended for run, _ in group)
        rows.append([hosts_cell(hosts), status, run_id or "", plan or "", f"{done}/{total}", when(started),
                     when(ended)])
        styles.append({1: RUN_STYLE.get(status, "")})
    show_table(["hosts", "status", "run", "plan", "done", "started", "ended"], rows, styles=styles)
    for r in results:
        if r.failed:
            err_console.print(f"{escape(r.host)}: {escape(r.status)}: {escape(r.message)}")


# --- collect and report -----------------------------------------------------------------------------------------------


@command(bench_app, "collect")
def collect(ctx: typer.Context, selection: Selection,
            run_id: RunIdArg = None, results_dir: ResultsDirOpt = None,
            max_file_size: Annotated[str, typer.Option("--max-file-size", help="Refuse (never download) a result "
                                                       "file the host lists as bigger than this: 500M, 2G, bytes.")]
            = "2G") -> None:
    """Copy result files to results/<run-id>/<host>/ (sha256-checked, resumable) and write manifest.json."""
    from ddops.bench.collect import parse_size, write_manifest
    from ddops.bench.runs import CollectReport
    from ddops.tasks.bench import collect_task, manifest_entries

    max_bytes = parse_size(max_file_size)
    root, rid, on = _on_run(ctx, selection, results_dir, run_id)
    results = on.run(collect_task(rid, root, max_bytes), title=f"bench collect {rid}")
    manifest = write_manifest(root, rid, manifest_entries(results))

    def render(results: Sequence[HostResult]) -> None:
        recap(results, columns=[("files", lambda r: str(r.report.files)
                                  if isinstance(r.report, CollectReport) and r.report.manifest else "")])
        console.print(f"results: {escape(str(root / rid))}  (manifest: {escape(str(manifest))})")

    on.finish(results, {"run_id": rid, "manifest": str(manifest)}, render=render)


@command(bench_app, "report")
def report(ctx: typer.Context,
           run_ids: Annotated[list[str] | None, typer.Argument(help="Collected run ids (default: the newest).",
                                                                  show_default=False,
                                                                  autocompletion=completion.run_ids)] = None,
           fmt: Annotated[str, typer.Option("--format", help="table, json, csv or md.")] = "table",
           by: Annotated[str | None, typer.Option("--by", help="host: one row per host and method (repeats "
                                                     "aggregated); method: one row per method over every host and "
                                                     "repeat; run: one row per run, host and method; patchset: each "
                                                     "method's code variants side by side; engine: every engine's "
                                                     "methods per host, target, dataset and temperature against the "
                                                     "best chain method, with per-prompt paired statistics. Different "
                                                     "code (commit, patches, library versions) and engines are never "
                                                     "pooled. Default: host and method, or engine when the runs hold "
                                                     "several engines. --json and md follow it; csv has one line per "
                                                     "aggregated row with it, per result row without.",
                                                     show_default=False)] = None,
           plot: Annotated[Path | None, typer.Option("--plot", help="Also write a PNG chart here (speedup and "
                                                        "τ per method, with error bars; with several engines, tok/s "
                                                        "against the best chain method).", show_default=False)] = None,
           results_dir: ResultsDirOpt = None) -> None:
    """One comparison table over collected runs: speedup, acceptance length, fidelity per host and method."""
    from ddops.bench.document import report_document
    from ddops.bench.runs import check_run_id, results_root

    fmt = "json" if state(ctx).json else fmt
    doc = report_document(results_root(results_dir), [check_run_id(r) for r in run_ids or []], by, fmt)
    if doc.note and fmt != "json":
        err_console.print(escape(doc.note))
    if fmt == "json":
        write_document(doc.exit_code, doc.to_json())
    elif fmt in ("csv", "md"):
        sys.stdout.write(csv_safe(doc.csv(by)) if fmt == "csv" else printable(doc.markdown()))
    else:
        _report_tables(doc)
    _report_plot_and_problems(doc, plot)
    if doc.exit_code:
        raise typer.Exit(1)


def _report_tables(doc: ReportDocument) -> None:
    from ddops.bench.compare import ENGINE_VIEW, engine_columns, verdicts
    from ddops.bench.report import aggregate, group_columns

    for view in doc.views if doc.report.rows else ():
        if view == ENGINE_VIEW:
            _report_table(*engine_columns(doc.comparisons), [r.group for t in doc.comparisons for r in t.rows],
                          f"{doc.title}: engines side by side, per host (mean ± std over n runs)",
                          doc.collected.caption)
            for line in verdicts(doc.comparisons):
                console.print(escape(line))
        else:
            groups = aggregate(doc.report, view)
            _report_table(*group_columns(groups), groups, f"{doc.title}: {_SCOPES[view]} (mean ± std over n runs)",
                          doc.collected.caption)


def _report_plot_and_problems(doc: ReportDocument, plot: Path | None) -> None:
    if plot is not None and doc.report.rows:
        from ddops.bench.plot import plot_report

        written = plot_report(doc.report, plot, title=doc.title, caption=doc.collected.caption)
        err_console.print(f"plot: {escape(str(written))}")
    for problem in [*doc.collected.problems, *doc.collected.caption.splitlines()]:  # one line each, never wrapped
        err_console.print(f"[bold red]ddops: error:[/] {escape(problem)}", soft_wrap=True)
    if doc.exit_code and not doc.report.rows:
        err_console.print("no result rows")


_SCOPES = {"host": "per host", "run": "per run and host", "patchset": "per patch set, all hosts",
           "method": "per method, all hosts"}


def _report_table(headers: list[str], rows: list[list[str]], groups: Sequence[Any], title: str, caption: str) -> None:
    """Aggregated rows as a rich table, lossy rows red, a note under it for each flagged row; the caption names
    what produced nothing."""
    from rich.table import Table

    from ddops.bench.report import note_label

    table = Table(title=escape(title), caption=escape(caption) or None, caption_style="bold red",
                  caption_justify="left", header_style="bold")
    for h in headers:
        numeric = h in ("tok/s", "Speedup", "τ", "TTFT", "n", "Resp", "Fidelity", "T", "Hosts", "vs best chain")
        table.add_column(h, justify="right" if numeric else "left")
    method_col = headers.index("Method")
    for g, cells in zip(groups, rows):
        cells = [escape(c) for c in cells]
        if g.best_budget:
            cells[method_col] = f"[bold]{cells[method_col]}[/]"
        table.add_row(*cells, style="red" if g.lossy else None)
    console.print(table)
    for g in groups:
        if g.note:
            console.print(f"[red]{escape(note_label(g))}: {escape(g.note)}[/]")
