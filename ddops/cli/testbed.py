"""`ddops testbed up|down|status`: local container-like sshd hosts for tests, demos and CI dry-runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ddops.cli.common import console, escape

testbed_app = typer.Typer(help="Local sshd hosts in their own mount namespaces (needs root).", no_args_is_help=True)
RootOpt = Annotated[Path, typer.Option("--root", help="Where the testbed keeps its state.")]


def register(app: typer.Typer) -> None:
    app.add_typer(testbed_app, name="testbed")


def _default_root() -> Path:
    from ddops.testbed import DEFAULT_ROOT

    return DEFAULT_ROOT


@testbed_app.command("up")
def up(
    ctx: typer.Context,
    count: Annotated[int, typer.Option("--hosts", "-n", min=1, max=250, help="How many hosts.")] = 3,
    seed: Annotated[Optional[Path], typer.Option("--seed", help="Directory copied into every host's repo path.")] = None,
    inventory_out: Annotated[Optional[Path], typer.Option("--inventory-out", help="Also copy the inventory here.")] = None,
    root: Annotated[Optional[Path], typer.Option("--root", help="Where the testbed keeps its state.")] = None,
    repo_path: Annotated[str, typer.Option("--repo-path", help="The repo path every host sees.")] = "/root/ddtree",
    address_prefix: Annotated[str, typer.Option("--address-prefix", help="Hosts get PREFIX2, PREFIX3, ...")] = "127.0.0.",
    port: Annotated[int, typer.Option("--port", help="sshd port on every host.")] = 2222,
    patch: Annotated[Optional[list[str]], typer.Option("--patch", help="Playbooks listed under `patches:`.")] = None,
) -> None:
    """Start N local hosts and write an inventory for them."""
    from ddops import testbed

    tb = testbed.up(count, root=root or _default_root(), seed=seed, repo_path=repo_path,
                    address_prefix=address_prefix, port=port, patches=patch or ())
    if inventory_out is not None:
        shutil.copyfile(tb.inventory_path, inventory_out)
    console.print(f"testbed up: {len(tb.hosts)} hosts ({tb.hosts[0].address} .. {tb.hosts[-1].address}, port {port})")
    console.print(f"inventory: {escape(str(inventory_out or tb.inventory_path))}")


@testbed_app.command("down")
def down(ctx: typer.Context, root: Annotated[Optional[Path], typer.Option("--root")] = None) -> None:
    """Stop the hosts this testbed started (by PID) and remove its files."""
    from ddops import testbed

    stopped = testbed.down(root or _default_root())
    console.print(f"testbed down: stopped {len(stopped)} sshd process{'es' if len(stopped) != 1 else ''}")


@testbed_app.command("status")
def status(ctx: typer.Context, root: Annotated[Optional[Path], typer.Option("--root")] = None) -> None:
    """Show each testbed host and whether its sshd is running."""
    from ddops import testbed

    rows = testbed.status(root or _default_root())
    table = Table(header_style="bold")
    for col in ("host", "address", "port", "pid", "running", "dir"):
        table.add_column(col)
    for r in rows:
        table.add_row(escape(str(r["name"])), str(r["address"]), str(r["port"]), str(r["pid"] or "-"),
                      "yes" if r["running"] and r["accepting"] else "no", escape(str(r["dir"])))
    console.print(table)
    if not all(r["running"] for r in rows):
        raise typer.Exit(1)
