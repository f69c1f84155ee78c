"""Shared CLI options, state and rendering used by every command."""

from __future__ import annotations

import json
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable, Optional, Sequence

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from ddops.fleet import FleetEvent, HostResult
    from ddops.inventory import Host, Inventory
    from ddops.transport import Connector

# ddops.fleet (and the inventory and YAML it imports) loads only when a command runs on hosts: `ddops --help` and
# the testbed commands start faster without it. Rich's console, tables and syntax highlighting load only when
# something is drawn (`--json` draws nothing: rich.console alone is ~15 ms of every command's start).

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
    forks: int = field(default_factory=lambda: _fleet().DEFAULT_FORKS)
    accept_new: bool = False
    ask_key_passphrase: bool = False
    adhoc_hosts: str | None = None  # -H user@host:port,...: these hosts instead of an inventory file
    _inventory_cache: Any = field(default=None, repr=False)

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


# Options shared by the host-selecting commands, declared once.
HostOpt = Annotated[Optional[list[str]], typer.Option("--host", "-H", help="Host name or address (repeatable).",
                                                       show_default=False)]
GroupOpt = Annotated[Optional[list[str]], typer.Option("--group", "-g", help="Every host of a group (repeatable).",
                                                        show_default=False)]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Every host in the inventory.")]
LimitOpt = Annotated[Optional[str], typer.Option("--limit", "-l", help="Globs over names/addresses/groups, "
                                                 "comma-separated; !glob excludes.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else there.")]
CheckOpt = Annotated[bool, typer.Option("--check", help="Show what would change; write nothing.")]
ForksOpt = Annotated[Optional[int], typer.Option("--forks", "-f", min=1, help="Hosts worked on at once.",
                                                 show_default=False)]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _fleet() -> Any:
    import ddops.fleet

    return ddops.fleet


# The running command's global options, for renderers deep in a command (the recap's -v columns).
_current_state: ContextVar[AppState | None] = ContextVar("ddops_app_state", default=None)


def state(ctx: typer.Context) -> AppState:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = AppState()
    _current_state.set(root.obj)
    return root.obj


def selected_hosts(st: AppState, host: Sequence[str] | None, group: Sequence[str] | None, all_: bool,
                   limit: str | None) -> tuple["Inventory", list["Host"]]:
    from ddops.inventory import Selection, select

    inventory = st.load_inventory()
    selection = Selection(hosts=tuple(host or ()), groups=tuple(group or ()), all=all_, limit=limit)
    if st.adhoc_hosts is not None and selection.empty:
        selection = Selection(all=True)  # `ddops -H a,b patch`: the hosts named are the ones meant
    return inventory, select(inventory, selection)


def fleet_run(st: AppState, inventory: "Inventory", hosts: list["Host"], task: Callable, *, title: str,
              forks: int | None = None) -> list[HostResult]:
    """Run a task over hosts with a progress view (rich on a TTY, plain lines otherwise, silent for --json)."""
    from ddops.fleet import run_fleet

    connector = st.connector(inventory)
    progress = FleetProgress(title, [h.name for h in hosts], enabled=not st.json)
    try:
        connector.prepare(hosts)  # key files read and unlocked before the progress view starts and anything connects
        with progress:
            return run_fleet(hosts, task, connector.connect, forks=forks or st.forks, on_event=progress.event)
    finally:
        connector.close()


class FleetProgress:
    """Live per-host progress: a rich status line on a terminal, one plain line per host otherwise."""

    def __init__(self, title: str, names: Iterable[str], enabled: bool = True) -> None:
        self.title, self.names, self.enabled = title, list(names), enabled
        self.done = 0
        self._live = None
        self._tty = enabled and err_console.is_terminal  # not even asked for --json: it would load rich

    def __enter__(self) -> "FleetProgress":
        if self.enabled and self._tty:
            from rich.status import Status

            self._live = Status(self._text(), console=err_console.made())
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def _text(self) -> str:
        return f"{self.title}: {self.done}/{len(self.names)} hosts done"

    def event(self, event: FleetEvent) -> None:
        if not self.enabled or event.phase != "done" or event.result is None:
            return
        self.done += 1
        r = event.result
        line = f"{r.host}: {r.status} ({r.elapsed:.2f}s)" + (f" {r.message}" if r.failed and r.message else "")
        if self._live is not None:
            style = STATUS_STYLE.get(r.status, "")
            err_console.print(f"[{style}]{escape(line)}[/]" if style else escape(line))
            self._live.update(self._text())
        else:
            print(line, file=sys.stderr, flush=True)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def emit_json(command: str, results: Sequence[HostResult], extra: dict[str, Any] | None = None) -> None:
    fleet = _fleet()
    doc = {"command": command, "exit_code": fleet.worst_exit_code(results), "summary": fleet.counts(results),
           "hosts": [r.to_json() for r in results]}
    if extra:
        doc.update(extra)
    # Indented for a person at a terminal; compact otherwise, which the json module writes in C (indented output
    # goes through its pure-Python encoder: a quarter of a 32-host `patch --check --json` run's CPU).
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(doc, indent=indent, default=str) + "\n")


def recap(results: Sequence[HostResult], columns: Sequence[tuple[str, Callable[[HostResult], str]]] = (),
          title: str | None = None) -> None:
    """The final per-host table and a one-line summary."""
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("host", no_wrap=True)
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
    for r in results:
        style = STATUS_STYLE.get(r.status, "")
        cells = [escape(fn(r)) for _, fn in columns]
        if detail:
            cells += ["" if r.connect_time is None else f"{r.connect_time * 1000:.0f} ms", str(r.round_trips),
                      r.agent or ""]
        table.add_row(escape(r.host), f"[{style}]{r.status}[/]", *cells[:len(columns)], f"{r.elapsed:.2f}s",
                      *cells[len(columns):], escape(r.message))
    console.print(table)
    summary = ", ".join(f"{n} {s}" for s, n in _fleet().counts(results).items())
    console.print(f"{len(results)} host{'s' if len(results) != 1 else ''}: {summary}")


def _verbosity() -> int:
    """-v count of the running command (0 outside one)."""
    current = _current_state.get()
    return current.verbose if current is not None else 0


def finish(results: Sequence[HostResult]) -> None:
    code = _fleet().worst_exit_code(results)
    if code:
        raise typer.Exit(code)
