"""Shared CLI options, state and rendering used by every command."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable, Iterator, Optional, Sequence

import typer

from ddops import settings

if TYPE_CHECKING:
    from rich.console import Console

    from ddops.fleet import FleetEvent, HostResult
    from ddops.inventory import Host, Inventory
    from ddops.transport import Connector

# ddops.fleet (and the inventory and YAML it imports) loads only when a command runs on hosts: `ddops --help` and
# the testbed commands start faster without it. Rich's console, tables and syntax highlighting load only when
# something is drawn (`--json` draws nothing, and rich.console alone is a visible part of every command's start).

STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "unreachable": "bold magenta",
                "drifted": "bold red", "skipped": "dim"}

def _width(stream: Any) -> int | None:
    """Terminals report their width; pipes and CI logs get a wide one rather than rich's 80 columns."""
    import shutil

    return None if stream.isatty() else shutil.get_terminal_size((200, 24)).columns


class _ConsoleOnFirstUse:
    """A rich Console, made when first used."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def made(self) -> "Console":
        """The Console itself (for rich objects that are handed one)."""
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._options.get("stderr") else sys.stdout
            self._console = Console(**self._options, width=_width(stream))
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)


console = _ConsoleOnFirstUse(highlight=False, soft_wrap=False)
err_console = _ConsoleOnFirstUse(stderr=True, highlight=False)


@dataclass(slots=True)
class AppState:
    """Global options, set once by the top-level callback."""

    inventory: str | None = None
    json: bool = False
    verbose: int = 0
    forks: int | None = None  # None: the fleet's DEFAULT_FORKS (ddops.fleet loads only when hosts are worked on)
    accept_new: bool = False
    ask_key_passphrase: bool = False
    adhoc_hosts: str | None = None  # -H user@host:port,...: these hosts instead of an inventory file
    all_rows: bool = False  # --all-rows: the recap never folds
    command: str = ""  # the running command's name (`bench status`): its --json document's and its progress title
    _inventory_cache: Any = field(default=None, repr=False)

    def given_here(self, *, inventory: str | None, json_out: bool, verbose: int, forks: int | None,
                   accept_new: bool, ask_key_passphrase: bool, all_rows: bool, adhoc_hosts: str | None = None) -> None:
        """Global options given after the command's name: they count as if given before it."""
        if inventory is not None:
            self.inventory = inventory
            self._inventory_cache = None
        if adhoc_hosts is not None:
            self.adhoc_hosts = adhoc_hosts
            self._inventory_cache = None
        self.json = self.json or json_out
        self.verbose += verbose
        if forks is not None:
            self.forks = forks
        self.accept_new = self.accept_new or accept_new
        self.ask_key_passphrase = self.ask_key_passphrase or ask_key_passphrase
        self.all_rows = self.all_rows or all_rows

    def load_inventory(self) -> "Inventory":
        from ddops.inventory import adhoc_inventory, inventory_path, load_inventory

        if self._inventory_cache is None:
            self._inventory_cache = (adhoc_inventory(self.adhoc_hosts) if self.adhoc_hosts is not None
                                     else load_inventory(inventory_path(self.inventory)))
        return self._inventory_cache

    def connector(self, inventory: "Inventory") -> "Connector":
        from ddops.transport import Connector

        # An encrypted key the ssh-agent lacks is asked for on a terminal (or wherever --ask-key-passphrase says).
        ask = read_passphrase if self.ask_key_passphrase or sys.stdin.isatty() else None
        return Connector(inventory.known_hosts, accept_new=self.accept_new,
                         jump_hosts=(*inventory.hosts, *inventory.jump_hosts), ask_passphrase=ask)


def read_passphrase(prompt: str) -> str | None:
    """A passphrase from the terminal (not echoed), else a line of stdin; None at end of input."""
    import getpass
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", getpass.GetPassWarning)  # no terminal: --ask-key-passphrase reads stdin
        try:
            return getpass.getpass(prompt, stream=sys.stderr)
        except EOFError:
            return None


# The global options, declared once: the top-level callback and every command take them, so that each works
# before or after the command's name (`ddops -i inv.yaml ping --all` and `ddops ping --all -i inv.yaml`).
InventoryOpt = Annotated[Optional[str], typer.Option("--inventory", "-i", envvar=settings.INVENTORY.name,
                                                     help="Inventory file (default: ./inventory.yaml).",
                                                     show_default=False)]
# After the command's name without the envvar: DDOPS_INVENTORY must not outvote an `-i` given before it.
_InventoryHereOpt = Annotated[Optional[str], typer.Option("--inventory", "-i", help="Inventory file (default: "
                                                          "./inventory.yaml).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else there "
                                                      "(docs/json.md).")]
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail (repeatable).")]
ForksOpt = Annotated[Optional[int], typer.Option("--forks", "-f", min=1, help="Hosts worked on at once (default 32).",
                                                 show_default=False)]
AcceptNewOpt = Annotated[bool, typer.Option("--accept-new", help="Record unknown host keys (changed keys are always "
                                                                 "refused).")]
AllRowsOpt = Annotated[bool, typer.Option("--all-rows", help="A recap row for every host (past a screenful, only "
                                                             "those to look at are shown, the rest counted).")]
AskKeyPassphraseOpt = Annotated[bool, typer.Option(
    "--ask-key-passphrase", help="Ask the passphrase of an encrypted identity_file the ssh-agent lacks, even without "
                                 "a terminal (one line of stdin).")]
GLOBAL_OPTIONS: dict[str, tuple[Any, Any]] = {  # parameter name -> (annotation, default meaning "not given here")
    "inventory": (_InventoryHereOpt, None), "json_out": (JsonOpt, False), "verbose": (VerboseOpt, 0),
    "forks": (ForksOpt, None), "accept_new": (AcceptNewOpt, False),
    "ask_key_passphrase": (AskKeyPassphraseOpt, False), "all_rows": (AllRowsOpt, False),
}

# The four host-selecting options, declared once; a command that takes a `selection` parameter gets them.
HostOpt = Annotated[Optional[list[str]], typer.Option("--host", "-H", help="Host name or address (repeatable).",
                                                       show_default=False)]
GroupOpt = Annotated[Optional[list[str]], typer.Option("--group", "-g", help="Every host of a group (repeatable).",
                                                        show_default=False)]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Every host in the inventory.")]
LimitOpt = Annotated[Optional[str], typer.Option("--limit", "-l", help="Globs over names/addresses/groups, "
                                                 "comma-separated; !glob excludes.", show_default=False)]
SELECTION_OPTIONS: dict[str, tuple[Any, Any]] = {
    "host": (HostOpt, None), "group": (GroupOpt, None), "all_": (AllOpt, False), "limit": (LimitOpt, None),
}
# `--hosts` after the command's name too (its short form -H is --host there, as in every selecting command).
_AdhocHostsHereOpt = Annotated[Optional[str], typer.Option(
    "--hosts", help="Work on these hosts, not an inventory's: [user@]host[:port], comma-separated (~/.ssh/config "
                    "fills in the rest).", show_default=False)]
CheckOpt = Annotated[bool, typer.Option("--check", help="Show what would change; write nothing.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ExitCodeOpt = Annotated[bool, typer.Option("--exit-code", help="Exit 3 when a host changed (with --check: would "
                                                               "change) and none failed, as `git diff --exit-code`.")]


def _fleet() -> Any:
    import ddops.fleet

    return ddops.fleet


# The running command's global options, for renderers deep in a command (the recap's -v columns).
_current_state: ContextVar[AppState | None] = ContextVar("ddops_app_state", default=None)


def current_state() -> AppState | None:
    """The running command's global options (None before a command started)."""
    return _current_state.get()


def state(ctx: typer.Context) -> AppState:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = AppState()
    _current_state.set(root.obj)
    return root.obj


def command(app: typer.Typer, name: str, **options: Any) -> Callable[[Callable], Callable]:
    """Register fn as `ddops NAME`, taking the global options too, and, when fn has a `selection` parameter, the
    four host options as one `Selection` value."""
    def register(fn: Callable) -> Callable:
        app.command(name, **options)(with_global_options(fn))
        return fn

    return register


def with_global_options(fn: Callable) -> Callable:
    """fn with the global options (and, for a `selection` parameter, the host options) added to its signature."""
    import functools
    import inspect

    signature = inspect.signature(fn)
    selects = "selection" in signature.parameters
    # Annotations are strings here (postponed evaluation); `selection`'s names a type imported only for checking.
    params = [p.replace(annotation=eval(p.annotation, fn.__globals__) if isinstance(p.annotation, str)  # noqa: S307
                        else p.annotation)
              for p in signature.parameters.values() if p.name != "selection"]
    if "ctx" not in signature.parameters:
        params.insert(0, inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context))
    added = {**(SELECTION_OPTIONS if selects else {}), **GLOBAL_OPTIONS,
             **({"adhoc_hosts": (_AdhocHostsHereOpt, None)} if selects else {})}
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a, default=d)
               for n, (a, d) in added.items()]

    @functools.wraps(fn)
    def run(ctx: typer.Context, **kwargs: Any) -> Any:
        st = state(ctx)
        st.given_here(**{n: kwargs.pop(n) for n in GLOBAL_OPTIONS}, adhoc_hosts=kwargs.pop("adhoc_hosts", None))
        st.command = ctx.command_path.partition(" ")[2]
        if selects:
            from ddops.inventory import Selection

            host, group, all_, limit = (kwargs.pop(n) for n in SELECTION_OPTIONS)
            kwargs["selection"] = Selection(hosts=tuple(host or ()), groups=tuple(group or ()), all=all_,
                                            limit=limit)
        if "ctx" in signature.parameters:
            kwargs["ctx"] = ctx
        return fn(**kwargs)

    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # typer must read the signature above, not fn's
    return run


def one_host(name: str) -> Any:
    """The selection of one host named by a command's argument (`ddops backups show HOST ...`)."""
    from ddops.inventory import Selection

    return Selection(hosts=(name,))


class OnHosts:
    """One command over the selected hosts: the inventory and hosts chosen once, the fleet run with its progress
    view and Ctrl-C handling, then one JSON document or the rendered recap, then the exit code."""

    def __init__(self, ctx: typer.Context, selection: Any, *, everywhere_when_empty: bool = False,
                 hosts: Sequence["Host"] | None = None) -> None:
        from ddops.fleet import Interrupt
        from ddops.inventory import select

        self.state = state(ctx)
        self.inventory = self.state.load_inventory()
        self.interrupt = Interrupt()
        if hosts is not None:
            self.hosts = list(hosts)
        elif selection.empty and (everywhere_when_empty or self.state.adhoc_hosts is not None):
            self.hosts = list(self.inventory.hosts)  # `ddops -H a,b patch`: the hosts named are the ones meant
        else:
            self.hosts = select(self.inventory, selection)

    @property
    def json(self) -> bool:
        return self.state.json

    def run(self, task: Callable, *, title: str | None = None, progress: bool = True) -> list["HostResult"]:
        """The task over the hosts: a progress view unless `progress` is off (or --json); the first Ctrl-C stops
        starting hosts (tasks that can be cancelled watch `self.interrupt.event`), a second abandons."""
        with ctrl_c(self.interrupt):
            return fleet_run(self.state, self.inventory, self.hosts, task, title=title or self.state.command,
                             progress=progress, interrupt=self.interrupt)

    def finish(self, results: Sequence["HostResult"], extra: dict[str, Any] | None = None, *,
               render: Callable[[Sequence["HostResult"]], None] | None = None, exit_code_on_change: bool = False,
               failed: bool = False, **recap_options: Any) -> None:
        """One JSON document (--json) or render(results) (default: the recap), then the exit code: 1 if any host
        failed (or `failed` says the command did), 3 with `exit_code_on_change` when one changed (or would), 130
        when the user interrupted the run."""
        from ddops.errors import EXIT_INTERRUPTED, EXIT_WOULD_CHANGE
        from ddops.fleet import CHANGED, interrupted_summary, worst_exit_code

        interrupted = self.interrupt.requested
        code = max(worst_exit_code(results), int(failed))
        if code == 0 and exit_code_on_change and any(r.status == CHANGED for r in results):
            code = EXIT_WOULD_CHANGE
        if interrupted:
            code = EXIT_INTERRUPTED
        if self.json:
            emit_json(results, extra, exit_code=code, interrupted=interrupted)
        else:
            try:
                if render is not None:
                    render(results)
                else:
                    recap(results, **recap_options)
            finally:
                if interrupted:
                    print(interrupted_summary(results), file=sys.stderr, flush=True)
        if code:
            raise typer.Exit(code)


@contextmanager
def ctrl_c(interrupt: Any) -> Iterator[None]:
    """While a fleet runs: the first Ctrl-C requests `interrupt` (no new host starts, commits in flight finish,
    running commands are ended on their hosts); a second one abandons the run at once (exit 130)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if interrupt.requested:
            os.write(2, b"ddops: abandoned: hosts still in flight may be left half way\n")
            os._exit(130)
        interrupt.request()
        os.write(2, b"ddops: interrupted: no new host starts; waiting for the hosts in flight (Ctrl-C again to "
                    b"abandon them)\n")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def fleet_run(st: AppState, inventory: "Inventory", hosts: list["Host"], task: Callable, *, title: str,
              progress: bool = True, interrupt: Any = None) -> list[HostResult]:
    """Run a task over hosts with a progress view (rich on a TTY, plain lines otherwise, silent for --json)."""
    from ddops.fleet import run_fleet

    connector = st.connector(inventory)
    view = FleetProgress(title, [h.name for h in hosts], enabled=progress and not st.json)
    try:
        connector.prepare(hosts)  # key files read and unlocked before the progress view starts and anything connects
        with view:
            return run_fleet(hosts, task, connector.connect, forks=st.forks or _fleet().DEFAULT_FORKS,
                             on_event=view.event, interrupt=interrupt)
    finally:
        connector.close()


class FleetProgress:
    """Live progress: on a terminal a bar with the hosts done, counts by state and an ETA, and a line per host that
    needs a look (failed, unreachable, drifted) above it; otherwise one plain line per host."""

    def __init__(self, title: str, names: Iterable[str], enabled: bool = True, console: Any = None) -> None:
        self.title, self.names, self.enabled = title, list(names), enabled
        self.done: dict[str, int] = {}  # status -> hosts done with it
        self.in_flight: set[str] = set()
        self._console = console if console is not None else err_console
        self._progress: Any = None
        self._task: Any = None
        self._tty = enabled and self._console.is_terminal  # not even asked for --json: it would load rich

    def __enter__(self) -> "FleetProgress":
        if self.enabled and self._tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            console = self._console.made() if hasattr(self._console, "made") else self._console
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[counts]}"), TextColumn("eta"), TimeRemainingColumn(),
                                      console=console, transient=True, refresh_per_second=4)
            self._task = self._progress.add_task(escape(self.title), total=len(self.names), counts=self._counts())
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _counts(self) -> str:
        parts = [f"[{STATUS_STYLE.get(s, '')}]{n} {s}[/]" for s, n in self.done.items()]
        waiting = len(self.names) - sum(self.done.values()) - len(self.in_flight)
        parts += [f"{len(self.in_flight)} in flight"] + ([f"{waiting} waiting"] if waiting > 0 else [])
        return " · ".join(parts)

    def line(self) -> str:
        """The bar as it is drawn now, as plain text (a terminal's view of it)."""
        import io

        from rich.console import Console

        plain = Console(file=io.StringIO(), width=self._progress.console.width, color_system=None)
        plain.print(self._progress.make_tasks_table(self._progress.tasks))
        return plain.file.getvalue()

    def event(self, event: FleetEvent) -> None:
        if not self.enabled:
            return
        if event.phase != "done" or event.result is None:
            self.in_flight.add(event.host)
            if self._progress is not None:
                self._progress.update(self._task, counts=self._counts())
            return
        self.in_flight.discard(event.host)
        r = event.result
        self.done[r.status] = self.done.get(r.status, 0) + 1
        line = f"{r.host}: {r.status} ({r.elapsed:.2f}s)" + (f" {r.message}" if r.failed and r.message else "")
        if self._progress is not None:
            if r.failed:  # the others are counted in the bar, and shown in the recap
                style = STATUS_STYLE.get(r.status, "")
                self._progress.console.print(f"[{style}]{escape(line)}[/]" if style else escape(line))
            self._progress.update(self._task, advance=1, counts=self._counts())
        else:
            print(line, file=sys.stderr, flush=True)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


# The --json envelope's version (docs/json.md): raised when a key is removed or changes meaning, never for one added.
SCHEMA_VERSION = 1


def write_document(exit_code: int, body: dict[str, Any] | None = None, *, interrupted: bool = False) -> None:
    """The one JSON document of a --json run: the envelope's keys (the running command's name from its state, the
    one home of that name), then the command's own."""
    current = current_state()
    doc = {"schema_version": SCHEMA_VERSION, "command": current.command if current else "", "exit_code": exit_code,
           "interrupted": interrupted, **(body or {})}
    # Indented for a person at a terminal; compact otherwise, which the json module writes in C (indented output
    # goes through its pure-Python encoder: a quarter of a 32-host `patch --check --json` run's CPU).
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(doc, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def emit_json(results: Sequence[HostResult], extra: dict[str, Any] | None = None, *,
              exit_code: int | None = None, interrupted: bool = False) -> None:
    """A fleet command's document: the envelope, a count per status, and one result per host."""
    fleet = _fleet()
    code = fleet.worst_exit_code(results) if exit_code is None else exit_code
    write_document(code, {"summary": fleet.counts(results), "hosts": [r.to_json() for r in results],
                                   **(extra or {})}, interrupted=interrupted)


def recap(results: Sequence[HostResult], columns: Sequence[tuple[str, Callable[[HostResult], str]]] = (),
          title: str | None = None) -> None:
    """The final table and a one-line summary; past a screenful of hosts, only those to look at (failed, drifted,
    changed; identical rows grouped) and one line counting the rest, unless --all-rows."""
    from rich.table import Table

    view = _fleet().fold_recap(results, lambda r: tuple(fn(r) for _, fn in columns), all_rows=_all_rows())
    table = Table(title=title, show_lines=False, header_style="bold")
    grouped = len(view.rows) != len(results) or bool(view.folded)
    table.add_column("host", no_wrap=not grouped, overflow="fold" if grouped else "ellipsis")
    table.add_column("status", no_wrap=True)
    for name, _ in columns:
        table.add_column(name)
    table.add_column("time", justify="right")
    detail = _verbosity() > 0  # -v: where the time went, and how many remote round trips it took
    if detail:
        table.add_column("connect", justify="right")
        table.add_column("round trips", justify="right")
        table.add_column("agent")
    table.add_column("message", overflow="fold")
    for row in view.rows:
        style = STATUS_STYLE.get(row.status, "")
        cells = [escape(c) for c in row.cells]
        if detail:
            r = row.results[0]
            cells += (["" if r.connect_time is None else f"{r.connect_time * 1000:.0f} ms", str(r.round_trips),
                       r.agent or ""] if len(row.results) == 1 else ["", "", ""])
        table.add_row(escape(", ".join(row.hosts)), f"[{style}]{row.status}[/]", *cells[:len(columns)],
                      f"{row.elapsed:.2f}s", *cells[len(columns):], escape(row.message))
    console.print(table)
    if view.folded:
        n = sum(view.folded.values())
        what = (f"{n} more host{'s' if n != 1 else ''} {next(iter(view.folded))}" if len(view.folded) == 1 else
                f"{n} more hosts: " + ", ".join(f"{k} {s}" for s, k in view.folded.items()))
        console.print(f"{what} (--all-rows shows every host)")
    summary = ", ".join(f"{n} {s}" for s, n in _fleet().counts(results).items())
    console.print(f"{len(results)} host{'s' if len(results) != 1 else ''}: {summary}")


def _all_rows() -> bool:
    current = _current_state.get()
    return current.all_rows if current is not None else False


def _verbosity() -> int:
    """-v count of the running command (0 outside one)."""
    current = _current_state.get()
    return current.verbose if current is not None else 0

