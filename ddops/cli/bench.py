"""`ddops bench [PLAN]` (launch detached runs, then follow them) and `ddops bench status|logs|stop|list|collect|report`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, Sequence

import typer
from typer.core import TyperGroup

from ddops.cli.common import (CheckOpt, OnHosts, YesOpt, command, console, err_console, escape, recap, state,
                              write_document)

if TYPE_CHECKING:
    from ddops.bench.runs import HostRun
    from ddops.tasks.bench import FollowEvent
    from ddops.fleet import HostResult
    from ddops.inventory import Host, Inventory, Selection


class _BenchGroup(TyperGroup):
    """`ddops bench PLAN --all` means `ddops bench run PLAN --all`: anything that is not a subcommand goes to `run`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


bench_app = typer.Typer(cls=_BenchGroup, no_args_is_help=True,
                        help="Run bench plans detached on the hosts, follow them, collect results, report.")

RUN_STYLE = {"completed": "green", "running": "yellow", "starting": "yellow", "failed": "bold red",
             "stopped": "magenta", "error": "bold red", "lost": "bold red", "ok": "green", "timeout": "bold red",
             "pending": "dim", "submitted": "yellow", "cancelled": "magenta", "node_fail": "bold red",
             "out_of_memory": "bold red", "unknown": "bold red"}
HOST_COLORS = ("cyan", "green", "magenta", "blue", "yellow", "bright_cyan", "bright_green", "bright_magenta")
ResultsDirOpt = Annotated[Optional[Path], typer.Option("--results-dir", help="Where collected results and launch "
                                                       "records live (default: $DDOPS_RESULTS_DIR or ./results).",
                                                       show_default=False)]
FollowOpt = Annotated[Optional[bool], typer.Option("--follow/--no-follow", help="Stream the hosts' logs and "
                                                   "progress until the run ends (default: on a terminal).",
                                                   show_default=False)]


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


# --- launch --------------------------------------------------------------------------------------------------------


@command(bench_app, "run")
def run(ctx: typer.Context, selection: Selection,
        plan: Annotated[Optional[str], typer.Argument(
            help="Bench plan: a name from playbooks/ or a YAML path (default: the inventory's `bench:`).",
            show_default=False)] = None,
        follow: FollowOpt = None,
        run_id: Annotated[Optional[str], typer.Option("--run-id", help="Name the run (default: "
                                                      "YYYYMMDD-HHMM-xxxx, UTC).", show_default=False)] = None,
        check: CheckOpt = False, results_dir: ResultsDirOpt = None,
        var: Annotated[Optional[list[str]], typer.Option("--var", help="NAME=VALUE for one of the plan's "
                                                         "placeholders, in every run (beats the plan's and the "
                                                         "host's vars). Repeatable.", show_default=False)] = None,
        only: Annotated[Optional[list[str]], typer.Option("--only", help="NAME=V1[,V2]: run only the matrix "
                                                          "entries with these values (a smoke run). Repeatable.",
                                                          show_default=False)] = None,
        from_: Annotated[Optional[str], typer.Option("--from", help="Local clone to resolve branch and tag pins "
                                                     "in, as `sync --from` (default: each host's repo_url).",
                                                     show_default=False)] = None) -> None:
    """Check each host (patches applied, disk, GPUs, repo and commit), then start the plan's runs detached.

    With --json: one JSON document with the run id and each host's launch result; never follows."""
    from ddops.tasks.bench import check_task, launch_task
    from ddops.bench.plan import narrow_plan, parse_assignments
    from ddops.bench.runs import check_run_id, new_run_id, results_root, write_launch_record

    inventory = state(ctx).load_inventory()  # its playbooks are where the patches the plan requires are defined
    bench_plan = narrow_plan(_plan(inventory, plan),
                             {k: v[0] for k, v in parse_assignments(var or (), "--var").items()},
                             parse_assignments(only or (), "--only"))
    from ddops.pins import Pins, checked_clone

    pins = Pins(from_clone=checked_clone(from_) if from_ else None)  # each pin resolved once, on this machine
    if check:
        on = OnHosts(ctx, selection)
        on.finish(on.run(check_task(bench_plan, pins, inventory), title=f"bench {bench_plan.name} --check"),
                  {"check": True, "plan": bench_plan.name})
        return
    on = OnHosts(ctx, selection)
    rid = check_run_id(run_id) if run_id else new_run_id()
    results = on.run(launch_task(bench_plan, rid, pins, inventory), title=f"bench {bench_plan.name}")
    launched = [h for h, r in zip(on.hosts, results) if r.status == "changed"]
    root = results_root(results_dir)
    if launched:
        write_launch_record(root, rid, {"run_id": rid, "plan": bench_plan.name, "plan_path": str(bench_plan.path),
                                        "hosts": [h.name for h in launched], "inventory": on.inventory.path,
                                        "launched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    following = bool(launched) and not on.json and not on.interrupt.requested and \
        (sys.stdout.isatty() if follow is None else follow)

    def render(results: Sequence[Any]) -> None:
        recap(results, columns=[("runs", lambda r: str(r.report.total) if r.status == "changed" else "")])
        if launched:
            console.print(f"run {rid}: launched on {len(launched)} host{'s' if len(launched) != 1 else ''}")
            if not following:
                _hints(rid, detached=False)

    if not following:
        on.finish(results, {"check": False, "run_id": rid if launched else None, "plan": bench_plan.name},
                  render=render, failed=not launched)
        return
    render(results)
    code = follow_run(on.state, on.inventory, launched, rid)
    from ddops.fleet import worst_exit_code

    raise typer.Exit(max(code, worst_exit_code(results)))


def _plan(inventory: "Inventory", named: str | None) -> Any:
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
    if not state_json():
        from rich.table import Table

        table = Table(title="bench plans", header_style="bold")
        table.add_column("plan", no_wrap=True)
        table.add_column("what it runs", overflow="fold")
        for name, description in plans:
            table.add_row(escape(name), escape(description))
        err_console.print(table)
    raise UsageError(f"no bench plan named and no `bench:` in {inventory.path}: nothing launched; name one "
                     f"(`ddops bench PLAN --all`) or set `bench: PLAN` there ({', '.join(n for n, _ in plans)})")


def state_json() -> bool:
    from ddops.cli.common import current_state

    current = current_state()
    return bool(current and current.json)


def _hints(run_id: str, detached: bool) -> None:
    lead = f"detached: run {run_id} keeps going on the hosts; nothing was stopped." if detached else \
        f"run {run_id} is going on the hosts."
    err_console.print(f"{lead}\n  follow it:  ddops bench logs {run_id} --follow\n"
                      f"  status:     ddops bench status {run_id}\n  stop it:    ddops bench stop {run_id}\n"
                      f"  results:    ddops bench collect {run_id} && ddops bench report {run_id}",
                      highlight=False, markup=False)


# --- following -------------------------------------------------------------------------------------------------------


def _elapsed_column() -> Any:
    """A progress column: the time since the run started on the host (until it ended), from the host's own
    timestamps. Made here so that rich.progress loads only when a run is followed on a terminal."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Elapsed(ProgressColumn):
        def render(self, task: Any) -> Text:
            run = task.fields.get("run")
            seconds = run.elapsed() if run is not None else None
            return Text(_duration(seconds), style="progress.elapsed")

    return Elapsed()


def _when(iso: str | None) -> str:
    """`2026-11-30 07:34:23` from the hosts' ISO times."""
    return (iso or "")[:19].replace("T", " ")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-:--"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class FollowView:
    """Log lines with a host prefix, and per-host progress (a live rich display on a terminal, plain lines otherwise)."""

    def __init__(self, hosts: Sequence[str], *, logs: bool = True, prefix: bool = True) -> None:
        self.logs = logs
        self.prefix = prefix
        self.width = max((len(h) for h in hosts), default=0)
        self.color = {h: HOST_COLORS[i % len(HOST_COLORS)] for i, h in enumerate(hosts)}
        self.partial = {h: "" for h in hosts}
        self.runs: dict[str, HostRun] = {}
        self.errors: dict[str, str] = {}
        self.tty = console.is_terminal
        self.progress: Any = None  # a rich Progress while it is drawn
        self.tasks: dict[str, Any] = {}
        self._last_plain: dict[str, tuple] = {}

    def __enter__(self) -> "FollowView":
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                     TextColumn("{task.fields[status]}"), _elapsed_column(), console=console.made(),
                                     transient=False, auto_refresh=True, refresh_per_second=4)
            for h in self.partial:
                self.tasks[h] = self.progress.add_task(f"[{self.color[h]}]{escape(h)}[/]", total=None,
                                                       status="connecting", run=None)
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for h in list(self.partial):
            self._flush(h)
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def handle(self, event: "FollowEvent") -> None:
        from ddops.tasks.bench import LogText

        if isinstance(event, LogText):
            self._text(event.host, event.text)
            return
        if event.error:
            self.errors[event.host] = event.error
        if event.run is not None:
            self.runs[event.host] = event.run
            self.errors.pop(event.host, None)
        if event.final:
            self._flush(event.host)
        self._status(event.host, event.run, event.error, event.final)

    def _text(self, host: str, text: str) -> None:
        if not self.logs:
            return
        lines = (self.partial[host] + text).split("\n")
        self.partial[host] = lines.pop()
        for line in lines:
            self._line(host, line)

    def _flush(self, host: str) -> None:
        if self.partial.get(host):
            self._line(host, self.partial[host])
            self.partial[host] = ""

    def _line(self, host: str, line: str) -> None:
        if "\r" in line:  # progress bars redraw with \r: keep what the line finally showed
            line = next((part for part in reversed(line.split("\r")) if part.strip()), "")
        if self.progress is not None:
            from rich.text import Text

            out = Text()
            if self.prefix:
                out.append(f"{host:<{self.width}} | ", style=self.color[host])
            out.append(line)
            self.progress.console.print(out, soft_wrap=True)
        else:
            sys.stdout.write((f"{host:<{self.width}} | " if self.prefix else "") + line + "\n")
            sys.stdout.flush()

    def _status(self, host: str, run: "HostRun | None", error: str | None, final: bool) -> None:
        if self.progress is not None:
            fields: dict[str, Any] = {}
            if run is not None:
                style = RUN_STYLE.get(run.status, "")
                label = f" {run.current_label}" if run.current_label and not run.terminal else ""
                fields.update(total=run.total, completed=run.done, run=run,
                              status=f"[{style}]{escape(run.status)}[/]{escape(label)}")
            if error:
                fields["status"] = f"[bold magenta]{escape(error if final else 'reconnecting: ' + error)}[/]"
            self.progress.update(self.tasks[host], **fields)
            return
        key = (run.status, run.done) if run is not None else (error,)
        if self._last_plain.get(host) == key and not final:
            return
        self._last_plain[host] = key
        text = run.summary() if run is not None else f"unreachable: {error}"
        print(f"{host}: {text}", file=sys.stderr, flush=True)

    def exit_code(self, hosts: Sequence[str]) -> int:
        ok = all(h in self.runs and self.runs[h].status == "completed" and h not in self.errors for h in hosts)
        return 0 if ok else 1


def follow_run(st: Any, inventory: "Inventory", hosts: Sequence["Host"], run_id: str, *, logs: bool = True) -> int:
    """Follow a run until every host is done; Ctrl-C detaches (exit 130) and leaves the runs going."""
    from ddops.tasks.bench import Follower

    connector = st.connector(inventory)
    follower = Follower(hosts, run_id, connector.connect, interval=1.0, logs=logs)
    view = FollowView([h.name for h in hosts], logs=logs)
    try:
        with view:
            for event in follower.events():
                view.handle(event)
    except KeyboardInterrupt:
        follower.close()
        view.stop()
        _hints(run_id, detached=True)
        return 130
    finally:
        follower.close()
        connector.close()
    runs = [view.runs[h.name] for h in hosts if h.name in view.runs]
    _render_runs(runs, {h: e for h, e in view.errors.items()})
    return view.exit_code([h.name for h in hosts])


# --- status, logs, stop, list -----------------------------------------------------------------------------------------


def _run_hosts(ctx: typer.Context, selection: Selection, root: Path, run_id: str) -> OnHosts:
    """The selection when one is given, else the hosts the run was launched on (else every inventory host)."""
    from ddops.bench.runs import run_hosts

    if not selection.empty:
        return OnHosts(ctx, selection)
    return OnHosts(ctx, selection, hosts=run_hosts(state(ctx).load_inventory().hosts, root, run_id))


def _render_runs(runs: Sequence["HostRun"], errors: dict[str, str] | None = None) -> None:
    """A table of each host's run, then every failed command with its exit code and the end of its log."""
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("host", "run", "status", "runs ok", "now", "started", "elapsed", "message"):
        table.add_column(col, overflow="fold")
    for run in runs:
        style = RUN_STYLE.get(run.status, "")
        ok = sum(1 for r in run.runs if r.status == "ok")
        table.add_row(escape(run.host), escape(run.run_id), f"[{style}]{escape(run.status)}[/]", f"{ok}/{run.total}",
                      escape(run.current_label or "") if not run.terminal else "", escape(_when(run.started)),
                      _duration(run.elapsed()), escape(run.message or ""))
    for host, error in (errors or {}).items():
        table.add_row(escape(host), "", "[bold magenta]unreachable[/]", "", "", "", "", escape(error))
    console.print(table)
    _render_slurm_tasks(runs)
    for run in runs:
        for rec in run.runs:
            if not (rec.failed or (rec.log_tail is not None and rec.status != "ok")):
                continue
            console.print(f"[bold red]{escape(run.host)}: {escape(rec.label)} {escape(rec.status)} with exit code "
                          f"{rec.exit_code}[/]" + (f" (signal {rec.signal})" if rec.signal else ""))
            if rec.log_tail:
                from rich.text import Text

                console.print(Text("\n".join("    " + line for line in rec.log_tail.rstrip("\n").splitlines()[-60:])))


def _render_slurm_tasks(runs: Sequence["HostRun"]) -> None:
    """Per array task of each Slurm run: Slurm's state (PENDING with its reason, RUNNING on a node, exit codes), the
    node and the GPU ids the task was given."""
    from ddops.tasks.slurm import describe_task

    rows = [(run, rec) for run in runs for rec in run.runs if rec.slurm]
    if not rows:
        return
    from rich.table import Table

    table = Table(header_style="bold", title="Slurm array tasks")
    for col in ("host", "task", "run", "slurm state", "job", "GPUs", "exit"):
        table.add_column(col, overflow="fold")
    for run, rec in rows:
        slurm = rec.slurm or {}
        style = RUN_STYLE.get(rec.status, "")
        gpus = slurm.get("slurm_job_gpus") or slurm.get("cuda_visible_devices") or ""
        table.add_row(escape(run.host), str(rec.index), escape(rec.label),
                      f"[{style}]{escape(str(slurm.get('detail') or slurm.get('state')))}[/]",
                      escape(describe_task(slurm).split(",")[0]), escape(str(gpus)),
                      "" if rec.exit_code is None else str(rec.exit_code))
    console.print(table)


@command(bench_app, "status")
def status(ctx: typer.Context, selection: Selection,
           run_id: Annotated[Optional[str], typer.Argument(help="Run id (default: the last one launched from here).",
                                                           show_default=False)] = None,
           results_dir: ResultsDirOpt = None) -> None:
    """Each host's state of a run: progress, exit codes, and the log tail of every command that failed."""
    from ddops.bench.runs import RunReport, resolve_run_id, results_root
    from ddops.tasks.bench import status_task

    root = results_root(results_dir)
    rid = resolve_run_id(root, run_id)
    on = _run_hosts(ctx, selection, root, rid)
    results = on.run(status_task(rid), title=f"bench status {rid}")

    def render(results: Sequence["HostResult"]) -> None:
        runs = [r.report.run for r in results if isinstance(r.report, RunReport)]
        errors = {r.host: r.message for r in results if r.status == "unreachable"}
        _render_runs(runs, errors)
        skipped = [r.host for r in results if r.status == "skipped"]
        if skipped:
            err_console.print(f"no run {rid} on: {', '.join(skipped)}")
        if not runs:
            raise typer.Exit(1)

    on.finish(results, {"run_id": rid}, render=render)


@command(bench_app, "logs")
def logs(ctx: typer.Context, selection: Selection, run_id: Annotated[str, typer.Argument(help="Run id.")],
         follow: Annotated[bool, typer.Option("--follow", "-F", help="Keep streaming until the run ends.")] = False,
         results_dir: ResultsDirOpt = None) -> None:
    """The run's log from each host (prefixed with the host name), or streamed live with --follow."""
    from ddops.bench.runs import LogReport, check_run_id, results_root
    from ddops.tasks.bench import logs_task

    rid = check_run_id(run_id)
    on = _run_hosts(ctx, selection, results_root(results_dir), rid)
    if follow:
        raise typer.Exit(follow_run(on.state, on.inventory, on.hosts, rid))
    results = on.run(logs_task(rid), progress=False)
    logs = {r.host: r.report.log for r in results if isinstance(r.report, LogReport)}
    if on.json:
        on.finish(results, {"run_id": rid}, failed=not logs)
        return
    view = FollowView(list(logs), prefix=len(results) > 1)
    view.tty = False
    for r in results:
        if r.host in logs:
            view._text(r.host, logs[r.host])
            view._flush(r.host)
        else:
            err_console.print(f"{escape(r.host)}: {r.status}: {escape(r.message)}")
    if not logs:
        raise typer.Exit(1)


@command(bench_app, "stop")
def stop(ctx: typer.Context, selection: Selection, run_id: Annotated[str, typer.Argument(help="Run id.")],
         grace: Annotated[float, typer.Option("--grace", min=0, help="Seconds between SIGTERM and SIGKILL.")] = 5.0,
         yes: YesOpt = False, results_dir: ResultsDirOpt = None,
         task: Annotated[Optional[list[int]], typer.Option("--task", min=0, help="Slurm runs: cancel only this array "
                                                           "task (repeatable).", show_default=False)] = None) -> None:
    """End every process of the run on each host (and all they started) and record it as stopped; a Slurm run's
    job (or only --task N of its array) is scancel'ed."""
    from ddops.bench.runs import check_run_id, results_root
    from ddops.tasks.base import default_actor
    from ddops.tasks.bench import stop_task
    from ddops.tasks.slurm import check_tasks_option

    rid = check_run_id(run_id)
    on = _run_hosts(ctx, selection, results_root(results_dir), rid)
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


def _runs_table(results: Sequence["HostResult"]) -> None:
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("run", "host", "plan", "status", "done", "started", "ended"):
        table.add_column(col, no_wrap=col in ("run", "host"))
    rows = [(run, r.host) for r in results if r.report for run in r.report.runs]
    rows.sort(key=lambda x: (x[0].run_id or "", x[1]), reverse=True)
    for run, h in rows:
        style = RUN_STYLE.get(run.status, "")
        table.add_row(escape(run.run_id or ""), escape(h), escape(run.plan or ""),
                      f"[{style}]{escape(str(run.status))}[/]", f"{run.done}/{run.total}",
                      escape(_when(run.started)), escape(_when(run.ended)))
    console.print(table)
    for r in results:
        if r.failed:
            err_console.print(f"{escape(r.host)}: {r.status}: {escape(r.message)}")


# --- collect and report -----------------------------------------------------------------------------------------------


@command(bench_app, "collect")
def collect(ctx: typer.Context, selection: Selection,
            run_id: Annotated[Optional[str], typer.Argument(help="Run id (default: the last one launched from here).",
                                                            show_default=False)] = None,
            results_dir: ResultsDirOpt = None,
            max_file_size: Annotated[str, typer.Option("--max-file-size", help="Refuse (never download) a result "
                                                       "file the host lists as bigger than this: 500M, 2G, bytes.")]
            = "2G") -> None:
    """Copy result files to results/<run-id>/<host>/ (sha256-checked, resumable) and write manifest.json."""
    from ddops.bench.collect import parse_size, write_manifest
    from ddops.tasks.bench import collect_task, manifest_entries
    from ddops.bench.runs import CollectReport, resolve_run_id, results_root

    max_bytes = parse_size(max_file_size)
    root = results_root(results_dir)
    rid = resolve_run_id(root, run_id)
    on = _run_hosts(ctx, selection, root, rid)
    results = on.run(collect_task(rid, root, max_bytes), title=f"bench collect {rid}")
    manifest = write_manifest(root, rid, manifest_entries(results))

    def render(results: Sequence["HostResult"]) -> None:
        recap(results, columns=[("files", lambda r: str(r.report.files)
                                  if isinstance(r.report, CollectReport) and r.report.manifest else "")])
        console.print(f"results: {escape(str(root / rid))}  (manifest: {escape(str(manifest))})")

    on.finish(results, {"run_id": rid, "manifest": str(manifest)}, render=render)


@command(bench_app, "report")
def report(ctx: typer.Context,
           run_ids: Annotated[Optional[list[str]], typer.Argument(help="Collected run ids (default: the newest).",
                                                                  show_default=False)] = None,
           fmt: Annotated[str, typer.Option("--format", help="table, json, csv or md.")] = "table",
           by: Annotated[Optional[str], typer.Option("--by", help="host: one row per host and method (repeats "
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
           plot: Annotated[Optional[Path], typer.Option("--plot", help="Also write a PNG chart here (speedup and "
                                                        "τ per method, with error bars; with several engines, tok/s "
                                                        "against the best chain method).", show_default=False)] = None,
           results_dir: ResultsDirOpt = None) -> None:
    """One comparison table over collected runs: speedup, acceptance length, fidelity per host and method."""
    from ddops.bench.collect import collected_run_ids, load_collected
    from ddops.bench.compare import ENGINE_VIEW, engine_columns, engines_csv, engines_markdown, side_by_side, \
        verdicts
    from ddops.bench.report import BY, DEFAULT_VIEWS, aggregate, build_report, group_columns, groups_markdown, \
        pooling_note, report_title, to_csv, to_json
    from ddops.bench.runs import check_run_id, results_root
    from ddops.errors import UsageError

    st = state(ctx)
    if st.json:
        fmt = "json"
    if fmt not in ("table", "json", "csv", "md"):
        raise UsageError(f"--format {fmt}: use table, json, csv or md")
    if by is not None and by not in (*BY, ENGINE_VIEW):
        raise UsageError(f"--by {by}: use {', '.join((*BY, ENGINE_VIEW))}")
    root = results_root(results_dir)
    ids = [check_run_id(r) for r in run_ids or []]
    if not ids:
        newest = collected_run_ids(root)[:1]
        if not newest:
            raise UsageError(f"nothing collected under {root}: run `ddops bench collect RUN` first")
        ids = newest
    collected = load_collected(root, ids)
    rep = build_report(collected.items)
    views = [by] if by else [ENGINE_VIEW] if len({r.engine for r in rep.rows}) > 1 else list(DEFAULT_VIEWS)
    tables = side_by_side(rep) if ENGINE_VIEW in views or fmt == "json" or by == ENGINE_VIEW else ()
    title = report_title(rep.rows, ids)
    problems = [*collected.problems, *(g.line for g in collected.gaps)]
    note = pooling_note(rep)
    if note and fmt != "json":
        err_console.print(escape(note))
    code = 1 if problems or not rep.rows else 0
    if fmt == "json":
        import json

        write_document(code, {"run_ids": ids, "title": title,
                              **json.loads(to_json(rep, [v for v in views if v != ENGINE_VIEW])),
                              "views": views, "comparisons": [t.to_json() for t in tables], "problems": problems,
                              "gaps": [g.to_json() for g in collected.gaps], **({"note": note} if note else {})})
    elif fmt == "csv":  # --by: the aggregated rows of that table; without it, every result row
        sys.stdout.write(engines_csv(tables) if by == ENGINE_VIEW else to_csv(rep, by))
    elif fmt == "md":
        sys.stdout.write(f"**{title}**\n\n" + "\n".join(
            engines_markdown(tables) if view == ENGINE_VIEW else groups_markdown(aggregate(rep, view))
            for view in views))
    elif rep.rows:
        for view in views:
            if view == ENGINE_VIEW:
                _report_table(*engine_columns(tables), [r.group for t in tables for r in t.rows],
                              f"{title}: engines side by side, per host (mean ± std over n runs)", collected.caption)
                for line in verdicts(tables):
                    console.print(escape(line))
            else:
                groups = aggregate(rep, view)
                _report_table(*group_columns(groups), groups,
                              f"{title}: {_SCOPES[view]} (mean ± std over n runs)", collected.caption)
    if plot is not None and rep.rows:
        from ddops.bench.plot import plot_report

        written = plot_report(rep, plot, title=title, caption=collected.caption)
        err_console.print(f"plot: {escape(str(written))}")
    for problem in [*collected.problems, *collected.caption.splitlines()]:  # one line each, never wrapped
        err_console.print(f"[bold red]ddops: error:[/] {escape(problem)}", soft_wrap=True)
    if code:
        if not rep.rows:
            err_console.print("no result rows")
        raise typer.Exit(1)


_SCOPES = {"host": "per host", "run": "per run and host", "patchset": "per patch set, all hosts",
           "method": "per method, all hosts"}


def _report_table(headers: list[str], rows: list[list[str]], groups: Sequence[Any], title: str,
                  caption: str) -> None:
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
