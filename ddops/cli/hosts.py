"""`ddops hosts`, `ddops inventory check`, `ddops ping`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from ddops.cli.onhosts import OnHosts
from ddops.cli.options import command
from ddops.cli.render import console, escape, write_document
from ddops.cli.state import state

if TYPE_CHECKING:
    from ddops.fleet import HostResult
    from ddops.inventory import Selection

inventory_app = typer.Typer(help="Inspect and validate the inventory.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    command(app, "hosts")(hosts)
    command(app, "ping")(ping)
    app.add_typer(inventory_app, name="inventory")


def hosts(ctx: typer.Context, selection: Selection) -> None:
    """List the selected hosts (all of them when nothing is selected)."""
    chosen = OnHosts(ctx, selection, everywhere_when_empty=True).hosts
    if state(ctx).json:
        write_document(0, {"hosts": [
            {"host": h.name, "address": h.address, "port": h.port, "user": h.user, "repo": h.repo, "python": h.python,
             "groups": list(h.groups), "proxy_jump": h.proxy_jump} for h in chosen]})
        return
    from ddops.cli.render import show_table
    from ddops.grouping import natural_key

    show_table(["host", "address", "port", "user", "groups", "repo", "via"],
               [[h.name, h.address, str(h.port), h.user, ",".join(h.groups), h.repo, h.proxy_jump or ""]
                for h in sorted(chosen, key=lambda h: natural_key(h.name))])


@command(inventory_app, "check")
def inventory_check(ctx: typer.Context) -> None:
    """Validate the inventory and every playbook its `patches:` names: exit 0 when all is fine, 2 with file:line
    when not."""
    from ddops.errors import InventoryError
    from ddops.inventory import missing_identity_file
    from ddops.patching.playbook import load_inventory_playbooks

    inventory = state(ctx).load_inventory()
    # A key file that is not there: refused here as every connecting command refuses it (local hosts use none).
    for host in (*inventory.hosts, *inventory.jump_hosts):
        missing = None if host.local else missing_identity_file(host)
        if missing:
            raise InventoryError(missing)
    books = load_inventory_playbooks(inventory) if inventory.patches else []
    patches = f"; patches: {', '.join(b.name for b in books)}" if books else ""
    if state(ctx).json:
        write_document(0, {"inventory": {
            "path": inventory.path, "hosts": len(inventory.hosts), "groups": len(inventory.groups),
            "patches": [b.name for b in books]}})
        return
    console.print(f"{escape(inventory.path)}: ok ({len(inventory.hosts)} hosts, "
                  f"{len(inventory.groups)} groups{escape(patches)})")


def ping(ctx: typer.Context, selection: Selection) -> None:
    """Connect to the selected hosts and report OS, python, torch (its CUDA), transformers, each GPU's health, free
    disk, round-trip time and the login shell's cost; past a screenful, hosts with the same facts share a row."""
    run = OnHosts(ctx, selection)
    from ddops.tasks.ping import ping_task

    run.finish(run.run(ping_task), render=_ping_view)


# What ping shows of a host: its facts (alike hosts share a row) and its own measures (shown as a range there).
PING_FACTS = ("os", "python", "torch", "transformers", "gpus", "driver")
PING_MEASURES = ("free disk", "rtt", "shell rc")


def _ping_facts(r: HostResult) -> tuple[str, ...]:
    return r.report.environment if r.report else ("",) * len(PING_FACTS)


def _ping_measures(r: HostResult) -> tuple[float | None, float | None, float | None]:
    if not r.report:
        return None, None, None
    rc = r.report.shell_rc_overhead_s
    return r.report.disk_free_gib, r.report.rtt_s * 1000, None if rc is None else rc * 1000


def _spread(values: Sequence[float | None], unit: str, digits: int) -> str:
    """`46.8 GiB`, or `12.1-48.0 GiB` over a group of hosts."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    low, high = f"{min(known):.{digits}f}", f"{max(known):.{digits}f}"
    return f"{low} {unit}" if low == high else f"{low}-{high} {unit}"


def _ping_view(results: Sequence[HostResult]) -> None:
    """Every host a row up to a screenful (or with --all-rows); past that, hosts whose facts, status and message are
    the same share one row, with their own measures as ranges: every distinct row is shown, none folded away."""
    from ddops.cli.render import STATUS_STYLE, count_line, show_table
    from ddops.cli.state import current_state
    from ddops.fleet import FOLD_OVER
    from ddops.grouping import group_identical, hosts_cell, natural_key

    current = current_state()
    each = len(results) <= FOLD_OVER or bool(current and current.all_rows)
    ordered = sorted(results, key=lambda r: natural_key(r.host))
    key = (lambda r: r.host) if each else (lambda r: (str(r.status), r.message, _ping_facts(r)))
    rows, styles = [], []
    for _, group in group_identical(ordered, key=key):
        first = group[0]
        measures = list(zip(*(_ping_measures(r) for r in group)))
        hosts = hosts_cell([r.host for r in group])
        named = [first.report.hostname if first.report else ""] if each else []
        rows.append([hosts, str(first.status), *named, *_ping_facts(first), _spread(measures[0], "GiB", 1),
                     _spread(measures[1], "ms", 1), _spread(measures[2], "ms", 0), first.message])
        styles.append({1: STATUS_STYLE.get(first.status, "")})
    headers = ["host", "status", *(["hostname"] if each else []), *PING_FACTS, *PING_MEASURES, "message"]
    show_table(headers, rows, title="ddops ping", styles=styles, folding=len(headers) - 1)
    console.print(count_line(results))
