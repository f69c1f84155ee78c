"""A command over the selected hosts, from choosing them to its exit code (OnHosts), and its Ctrl-C."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from ddops.cli.render import FleetProgress, emit_json, hinted, recap
from ddops.cli.state import AppState, state

if TYPE_CHECKING:
    from ddops.fleet import HostResult
    from ddops.inventory import Host, Inventory

# ddops.fleet (and the inventory and YAML it imports) loads only when a command runs on hosts: `ddops --help` and
# the testbed commands start faster without it.


class OnHosts:
    """One command over the selected hosts: the inventory and hosts chosen once, the fleet run with its progress
    view and Ctrl-C handling, then one JSON document or the rendered recap, then the exit code."""

    def __init__(self, ctx: typer.Context, selection: Any, *, everywhere_when_empty: bool = False,
                 hosts: Sequence[Host] | None = None) -> None:
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

    def run(self, task: Callable, *, title: str | None = None, progress: bool = True) -> list[HostResult]:
        """The task over the hosts: a progress view unless `progress` is off (or --json); the first Ctrl-C stops
        starting hosts (tasks that can be cancelled watch `self.interrupt.event`), a second abandons."""
        with ctrl_c(self.interrupt):
            return fleet_run(self.state, self.inventory, self.hosts, task, title=title or self.state.command,
                             progress=progress, interrupt=self.interrupt)

    def finish(self, results: Sequence[HostResult], extra: dict[str, Any] | None = None, *,
               render: Callable[[Sequence[HostResult]], None] | None = None, exit_code_on_change: bool = False,
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


def fleet_run(st: AppState, inventory: Inventory, hosts: list[Host], task: Callable, *, title: str,
              progress: bool = True, interrupt: Any = None) -> list[HostResult]:
    """Run a task over hosts with a progress view (rich on a TTY, plain lines otherwise, silent for --json); each
    host's next-step hints with the -i this run was given."""
    from dataclasses import replace

    from ddops.fleet import DEFAULT_FORKS, run_fleet

    connector = st.connector(inventory)
    view = FleetProgress(title, [h.name for h in hosts], enabled=progress and not st.json)
    try:
        connector.prepare(hosts)  # key files read and unlocked before the progress view starts and anything connects
        with view:
            results = run_fleet(hosts, task, connector.connect, forks=st.forks or DEFAULT_FORKS,
                                on_event=view.event, interrupt=interrupt)
    finally:
        connector.close()
    return [replace(r, message=hinted(r.message)) for r in results]
