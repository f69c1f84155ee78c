"""`ddops hosts`, `ddops inventory check`, `ddops ping`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

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
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("host", "address", "port", "user", "groups", "repo", "via"):
        table.add_column(col)
    for h in chosen:
        table.add_row(escape(h.name), escape(h.address), str(h.port), escape(h.user), escape(",".join(h.groups)),
                      escape(h.repo), escape(h.proxy_jump or ""))
    console.print(table)


@command(inventory_app, "check")
def inventory_check(ctx: typer.Context) -> None:
    """Validate the inventory and every playbook its `patches:` names: exit 0 when all is fine, 2 with file:line
    when not."""
    from ddops.patching.playbook import load_inventory_playbooks

    from ddops.errors import InventoryError
    from ddops.inventory import missing_identity_file

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
    """Connect to the selected hosts and report hostname, OS, python, GPUs, free disk and round-trip time."""
    run = OnHosts(ctx, selection)
    from ddops.tasks.ping import ping_task

    run.finish(run.run(ping_task), columns=[
        ("hostname", lambda r: str(_facts(r).get("hostname", ""))),
        ("os", lambda r: str(_facts(r).get("os", ""))),
        ("python", lambda r: str(_facts(r).get("python", ""))),
        ("gpus", lambda r: _gpus(_facts(r).get("gpus")) if r.report else ""),
        ("free disk", lambda r: _gib(_facts(r).get("disk_free_bytes"))),
        ("rtt", lambda r: f"{r.report.rtt_s * 1000:.1f} ms" if r.report else ""),
        ("shell rc", lambda r: f"{r.report.shell_rc_overhead_s * 1000:.0f} ms"
         if r.report and r.report.shell_rc_overhead_s is not None else ""),
    ])


def _facts(r: HostResult) -> Mapping[str, Any]:
    """What the host's agent said of it (nothing when ping did not reach it)."""
    return r.report.facts if r.report else {}


def _gpus(gpus: Any) -> str:
    if not gpus:
        return "no GPU"
    names = [g.get("name", "?") if isinstance(g, dict) else str(g) for g in gpus]
    first = names[0]
    return f"{len(names)}x {first}" if all(n == first for n in names) else ", ".join(names)


def _gib(value: Any) -> str:
    return f"{value / 2**30:.1f} GiB" if isinstance(value, (int, float)) else ""
