"""A run as it goes: the live follow view (`bench ... --follow`: each host's log lines and progress), and the table of
each host's run that ends it and that `bench status` shows."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ddops.cli.render import console, ddops_line, err_console, escape, styled
from ddops.safe_text import one_line, printable

if TYPE_CHECKING:
    from ddops.bench.runs import HostRun
    from ddops.inventory import Host, Inventory
    from ddops.tasks.bench import FollowEvent

RUN_STYLE = {"completed": "green", "running": "yellow", "starting": "yellow", "failed": "bold red",
             "stopped": "magenta", "error": "bold red", "lost": "bold red", "ok": "green", "timeout": "bold red",
             "pending": "dim", "submitted": "yellow", "cancelled": "magenta", "node_fail": "bold red",
             "out_of_memory": "bold red", "unknown": "bold red"}
HOST_COLORS = ("cyan", "green", "magenta", "blue", "yellow", "bright_cyan", "bright_green", "bright_magenta")


def hints(run_id: str, detached: bool) -> None:
    lead = f"detached: run {run_id} keeps going on the hosts; nothing was stopped." if detached else \
        f"run {run_id} is going on the hosts."
    err_console.print(f"{lead}\n  follow it:  {ddops_line(f'bench logs {run_id} --follow')}\n"
                      f"  status:     {ddops_line(f'bench status {run_id}')}\n"
                      f"  stop it:    {ddops_line(f'bench stop {run_id}')}\n"
                      f"  results:    {ddops_line(f'bench collect {run_id}')} && "
                      f"{ddops_line(f'bench report {run_id}')}", highlight=False, markup=False)


def _elapsed_column() -> Any:
    """A progress column: the time since the run started on the host (until it ended), from the host's own
    timestamps. Made here so that rich.progress loads only when a run is followed on a terminal."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Elapsed(ProgressColumn):
        def render(self, task: Any) -> Text:
            run = task.fields.get("run")
            seconds = run.elapsed() if run is not None else None
            return Text(duration(seconds), style="progress.elapsed")

    return Elapsed()


def when(iso: str | None) -> str:
    """`2026-11-30 07:34:23` from the hosts' ISO times."""
    return (iso or "")[:19].replace("T", " ")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-:--"
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class FollowView:
    """Log lines with a host prefix, and per-host progress (live on a terminal, plain lines otherwise)."""

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

    def __enter__(self) -> FollowView:
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

    def handle(self, event: FollowEvent) -> None:
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
        line = one_line(line)
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

    def _status(self, host: str, run: HostRun | None, error: str | None, final: bool) -> None:
        if self.progress is not None:
            fields: dict[str, Any] = {}
            if run is not None:
                style = RUN_STYLE.get(run.status, "")
                label = f" {run.current_label}" if run.current_label and not run.terminal else ""
                fields.update(total=run.total, completed=run.done, run=run,
                              status=styled(run.status, style) + escape(label))
            if error:
                fields["status"] = f"[bold magenta]{escape(error if final else 'reconnecting: ' + error)}[/]"
            self.progress.update(self.tasks[host], **fields)
            return
        key = (run.status, run.done) if run is not None else (error,)
        if self._last_plain.get(host) == key and not final:
            return
        self._last_plain[host] = key
        text = run.summary() if run is not None else f"unreachable: {error}"
        print(one_line(f"{host}: {text}"), file=sys.stderr, flush=True)

    def exit_code(self, hosts: Sequence[str]) -> int:
        ok = all(h in self.runs and self.runs[h].status == "completed" and h not in self.errors for h in hosts)
        return 0 if ok else 1


def follow_run(st: Any, inventory: Inventory, hosts: Sequence[Host], run_id: str, *, logs: bool = True) -> int:
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
        hints(run_id, detached=True)
        return 130
    finally:
        follower.close()
        connector.close()
    runs = [view.runs[h.name] for h in hosts if h.name in view.runs]
    render_runs(runs, {h: e for h, e in view.errors.items()})
    return view.exit_code([h.name for h in hosts])


def render_runs(runs: Sequence[HostRun], errors: dict[str, str] | None = None) -> None:
    """A table of each host's run, then every failed command with its exit code and the end of its log."""
    from ddops.cli.render import show_table
    from ddops.grouping import natural_key

    rows, styles = [], []
    for run in sorted(runs, key=lambda run: natural_key(run.host)):
        ok = sum(1 for r in run.runs if r.status == "ok")
        rows.append([run.host, str(run.status), run.run_id, f"{ok}/{run.total}",
                     run.current_label or "" if not run.terminal else "", when(run.started), duration(run.elapsed()),
                     run.message or ""])
        styles.append({1: RUN_STYLE.get(run.status, "")})
    for host, error in (errors or {}).items():
        rows.append([host, "unreachable", "", "", "", "", "", error])
        styles.append({1: "bold magenta"})
    show_table(["host", "status", "run", "runs ok", "now", "started", "elapsed", "message"], rows, styles=styles,
               folding=7)
    _render_slurm_tasks(runs)
    for run in runs:
        for rec in run.runs:
            if not (rec.failed or (rec.log_tail is not None and rec.status != "ok")):
                continue
            console.print(f"[bold red]{escape(run.host)}: {escape(rec.label)} {escape(rec.status)} with exit code "
                          f"{rec.exit_code}[/]" + (f" (signal {rec.signal})" if rec.signal else ""))
            if rec.log_tail:
                from rich.text import Text

                console.print(Text(printable("\n".join("    " + line
                                                        for line in rec.log_tail.rstrip("\n").splitlines()[-60:]))))


def _render_slurm_tasks(runs: Sequence[HostRun]) -> None:
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
                      styled(str(slurm.get('detail') or slurm.get('state')), style),
                      escape(describe_task(slurm).split(",")[0]), escape(str(gpus)),
                      "" if rec.exit_code is None else str(rec.exit_code))
    console.print(table)


def print_logs(logs: Mapping[str, str], *, prefix: bool) -> None:
    """Whole logs (`bench logs` without --follow), as the follow view prints them, host by host."""
    view = FollowView(list(logs), prefix=prefix)
    view.tty = False
    for host, text in logs.items():
        view._text(host, text)
        view._flush(host)
