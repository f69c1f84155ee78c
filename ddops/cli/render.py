"""What a command shows: the console (made on first use), the live progress of a fleet run, the recap table, and the
one --json document."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ddops.cli.state import current_state
from ddops.safe_text import one_line, printable

if TYPE_CHECKING:
    from rich.console import Console

    from ddops.fleet import FleetEvent, HostResult

# Rich's console, tables and syntax highlighting load only when something is drawn (`--json` draws nothing, and
# rich.console alone is a visible part of every command's start).

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

    def made(self) -> Console:
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

    def __enter__(self) -> FleetProgress:
        if self.enabled and self._tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            console = self._console.made() if isinstance(self._console, _ConsoleOnFirstUse) else self._console
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
        line = one_line(f"{r.host}: {r.status} ({r.elapsed:.2f}s)"
                        + (f" {hinted(r.message)}" if r.failed and r.message else ""))
        if self._progress is not None:
            if r.failed:  # the others are counted in the bar, and shown in the recap
                self._progress.console.print(styled(line, STATUS_STYLE.get(r.status)))
            self._progress.update(self._task, advance=1, counts=self._counts())
        else:
            print(line, file=sys.stderr, flush=True)


def ddops_line(words: str) -> str:
    """`ddops WORDS` as the user types it next: with the -i this run was given (hints must work where they are
    read, not only from the folder of a default inventory)."""
    import shlex

    current = current_state()
    given = current.inventory if current is not None and current.adhoc_hosts is None else None
    return f"ddops -i {shlex.quote(given)} {words}" if given else f"ddops {words}"


# Commands that read no inventory: a hint naming one needs no -i.
WITHOUT_INVENTORY = ("testbed up", "inventory init", "inventory import", "playbook lint", "bench report")


def hinted(text: str) -> str:
    """A message's next-step hints, written `ddops CMD` in backticks by the layers below (which do not know how
    ddops was run), with the -i this run was given (where CMD reads an inventory)."""
    import re

    prefix = ddops_line("")
    if prefix == "ddops " or "`ddops " not in text:
        return text
    return re.sub(r"`ddops (?!" + "|".join(map(re.escape, WITHOUT_INVENTORY)) + r")", lambda _: f"`{prefix}", text)


def escape(text: str) -> str:
    """Text as rich markup that shows it as it is: no markup of its own, no control character (ddops.safe_text)."""
    from rich.markup import escape as rich_escape

    return rich_escape(printable(text))


def styled(text: str, style: str | None) -> str:
    """`text` escaped, in `style` where there is one (a status this ddops has no style for stays plain)."""
    return f"[{style}]{escape(text)}[/]" if style else escape(text)


# The --json envelope's version (docs/json.md): raised when a key is removed or changes meaning, never for one added.
SCHEMA_VERSION = 1


def write_document(exit_code: int, body: dict[str, Any] | None = None, *, interrupted: bool = False,
                   command: str | None = None) -> None:
    """The one JSON document of a --json run: the envelope's keys (the running command's name from its state, the
    one home of that name; `command` where none ran: a usage error), then the command's own."""
    current = current_state()
    if command is None:
        command = current.command if current else ""
    doc = {"schema_version": SCHEMA_VERSION, "command": command, "exit_code": exit_code,
           "interrupted": interrupted, **(body or {})}
    # Indented for a person at a terminal; compact otherwise, which the json module writes in C (indented output
    # goes through its pure-Python encoder: a quarter of a 32-host `patch --check --json` run's CPU).
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(doc, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def emit_json(results: Sequence[HostResult], extra: dict[str, Any] | None = None, *,
              exit_code: int | None = None, interrupted: bool = False) -> None:
    """A fleet command's document: the envelope, a count per status, and one result per host."""
    from ddops.fleet import counts, worst_exit_code

    code = worst_exit_code(results) if exit_code is None else exit_code
    write_document(code, {"summary": counts(results), "hosts": [r.to_json() for r in results],
                                   **(extra or {})}, interrupted=interrupted)


def show_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
               styles: Sequence[Mapping[int, str]] = (), right: Iterable[int] = (),
               folding: int | None = None) -> None:
    """Rows of plain-text cells as a table where every column's longest word fits the console (the `folding`
    column, a message, may wrap within a word), else one block per row: its first two cells on a line, the others as
    `header: value` below, the folding one last. No cell is ever cut short (`3.1…`). `styles[n]` maps a column of
    row n to the style its cell is drawn in."""
    from rich.table import Table

    from ddops.grouping import columns_fit, words

    keep = [i for i in range(len(headers)) if i != folding]
    measured = [[row[i] for i in keep] for row in [list(headers), *rows]]
    room = console.width - (24 if folding is not None else 0)  # a message column keeps at least this much

    def drawn(n: int, i: int, text: str) -> str:
        return styled(text, styles[n].get(i) if n < len(styles) else None)

    if columns_fit(measured, room):
        table = Table(title=title, show_lines=False, header_style="bold")
        right = set(right)
        for i, name in enumerate(headers):
            # Never narrower than its longest word: rich would otherwise shrink the widest columns first.
            longest = None if i == folding else max(len(w) for row in [headers, *rows] for w in words(row[i]) or [""])
            table.add_column(escape(name), overflow="fold", justify="right" if i in right else "left",
                             min_width=longest)
        for n, row in enumerate(rows):
            table.add_row(*(drawn(n, i, c) for i, c in enumerate(row)))
        console.print(table)
        return
    if title:
        console.print(f"[bold]{escape(title)}[/]")
    for n, row in enumerate(rows):
        console.print("  ".join(drawn(n, i, c) for i, c in enumerate(row[:2]) if c))
        rest = [(i, f"{headers[i]}: {c}") for i, c in enumerate(row) if i >= 2 and c and i != folding]
        for line in _packed([text for _, text in rest], console.width - 4):
            console.print("    " + escape(line))
        if folding is not None and folding < len(row) and row[folding]:
            console.print("    " + escape(row[folding]))


def _packed(items: Sequence[str], width: int) -> list[str]:
    """`a · b · c` over as few lines as fit `width`, an item never split across two."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 3 + len(item) <= width:
            lines[-1] += " · " + item
        else:
            lines.append(item)
    return lines


def recap(results: Sequence[HostResult], columns: Sequence[tuple[str, Callable[[HostResult], str]]] = (),
          title: str | None = None) -> None:
    """The final table and a one-line summary; past a screenful of hosts, only those to look at (failed, drifted,
    changed; identical rows grouped) and one line counting the rest, unless --all-rows. Rows in natural order of
    their first host (host2 before host10)."""
    from ddops.fleet import fold_recap
    from ddops.grouping import hosts_cell, natural_key

    current = current_state()
    view = fold_recap(results, lambda r: tuple(fn(r) for _, fn in columns), all_rows=bool(current and current.all_rows))
    detail = bool(current and current.verbose)  # -v: where the time went, and how many remote round trips it took
    headers = ["host", "status", *(name for name, _ in columns), "time"]
    if detail:
        headers += ["connect", "round trips", "agent"]
    headers.append("message")
    rows, styles = [], []
    for row in sorted(view.rows, key=lambda row: natural_key(row.hosts[0])):
        cells = list(row.cells)
        if detail:
            r = row.results[0]
            cells += (["" if r.connect_time is None else f"{r.connect_time * 1000:.0f} ms", str(r.round_trips),
                       r.agent or ""] if len(row.results) == 1 else ["", "", ""])
        rows.append([hosts_cell(row.hosts), str(row.status), *cells[:len(columns)], f"{row.elapsed:.2f}s",
                     *cells[len(columns):], row.message])
        styles.append({1: STATUS_STYLE.get(row.status, "")})
    show_table(headers, rows, title=title, styles=styles, right=[len(columns) + 2], folding=len(headers) - 1)
    if view.folded:
        n = sum(view.folded.values())
        what = (f"{n} more host{'s' if n != 1 else ''} {next(iter(view.folded))}" if len(view.folded) == 1 else
                f"{n} more hosts: " + ", ".join(f"{k} {s}" for s, k in view.folded.items()))
        console.print(f"{what} (--all-rows shows every host)")
    console.print(count_line(results))


def count_line(results: Sequence[HostResult]) -> str:
    """`5 hosts: 4 ok, 1 failed`."""
    from ddops.fleet import counts

    summary = ", ".join(f"{n} {s}" for s, n in counts(results).items())
    return f"{len(results)} host{'s' if len(results) != 1 else ''}: {summary}"
