"""`ddops testbed up|down|status`: local sshd hosts (mount namespaces or real containers) for tests, demos and CI
dry-runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from ddops import settings
from ddops.cli.options import command
from ddops.cli.render import console, escape, show_table, write_document
from ddops.cli.state import state

testbed_app = typer.Typer(help="Local sshd hosts: mount namespaces (needs root) or podman/docker containers.",
                          no_args_is_help=True)
RootOpt = Annotated[Path | None, typer.Option("--root", help="Where the testbed keeps its state.")]


def register(app: typer.Typer) -> None:
    app.add_typer(testbed_app, name="testbed")


def _root(ctx: typer.Context, root: Path | None) -> Path:
    """--root, else the testbed that `-i FILE` on the command line describes, else $DDOPS_TESTBED_ROOT, else the one
    an exported $DDOPS_INVENTORY describes, else the default one."""
    from ddops.testbed import default_root, root_of_inventory

    if root is not None:
        return root
    inventory = state(ctx).inventory
    if inventory and (_given_on_the_command_line(ctx) or not settings.TESTBED_ROOT.value()):
        return root_of_inventory(inventory)
    return default_root()


def _given_on_the_command_line(ctx: typer.Context) -> bool:
    """Whether -i was typed (before or after the command's name), not taken from an exported DDOPS_INVENTORY."""
    # By name: typer carries its own copy of click, whose ParameterSource is not click's.
    return any(getattr(c.get_parameter_source("inventory"), "name", None) == "COMMANDLINE"
               for c in (ctx, ctx.find_root()))


@command(testbed_app, "up")
def up(
    ctx: typer.Context,
    count: Annotated[int, typer.Option("--hosts", "-n", min=1, max=250, help="How many hosts.")] = 3,
    seed: Annotated[Path | None, typer.Option("--seed", help="Directory copied into every host's repo path, or the "
                                                 "name of an example shipped with ddops (mini-ddtree).")] = None,
    inventory_out: Annotated[Path | None, typer.Option("--inventory-out", help="Also copy the inventory here.")] = None,
    root: RootOpt = None,
    repo_path: Annotated[str, typer.Option("--repo-path", help="The repo path every host sees.")] = "/root/ddtree",
    address_prefix: Annotated[str, typer.Option("--address-prefix", envvar=settings.TESTBED_ADDRESS_PREFIX.name,
                                                help="Hosts get PREFIX2, PREFIX3, ... (on 127.0.0.0/8)")] = "127.0.0.",
    port: Annotated[int, typer.Option("--port", help="sshd port on every host.")] = 2222,
    patch: Annotated[list[str] | None, typer.Option("--patch", help="Playbooks listed under `patches:`.")] = None,
    engine: Annotated[str, typer.Option("--engine", help="namespace (sshd in mount namespaces, needs root), podman, "
                                        "docker, or auto (the first container engine that runs here).")] = "namespace",
    shared_home: Annotated[bool, typer.Option(
        "--shared-home", help="Every host gets the same home directory (its own repo still), as containers with a "
                              "common /root volume.")] = False,
    image: Annotated[str | None, typer.Option("--image", help="Container engines: your own image (with sshd and "
                                                 "python3) instead of the one ddops builds.")] = None,
) -> None:
    """Start N local hosts and write an inventory for them."""
    from ddops import testbed

    tb = testbed.up(count, root=root, seed=seed, repo_path=repo_path,
                    address_prefix=address_prefix, port=port, patches=patch or (), engine=engine,
                    shared_home=shared_home, image=image)
    if inventory_out is not None:
        shutil.copyfile(tb.inventory_path, inventory_out)
    if state(ctx).json:
        write_document(0, {"testbed": {"root": str(tb.root), "engine": tb.engine,
                                                     "inventory": str(inventory_out or tb.inventory_path)},
                                         "hosts": [{"host": h.name, "address": h.address, "port": h.port}
                                                   for h in tb.hosts]})
        return
    what = "namespace" if tb.engine == "namespace" else f"{tb.engine} ({escape(tb.image)})"
    console.print(f"testbed up: {len(tb.hosts)} {what} hosts ({tb.hosts[0].address} .. {tb.hosts[-1].address}, "
                  f"port {port}){', one shared home' if tb.shared_home else ''}")
    console.print(f"inventory: {escape(str(inventory_out or tb.inventory_path))}")


@command(testbed_app, "down")
def down(ctx: typer.Context, root: RootOpt = None) -> None:
    """Stop the hosts this testbed (--root, or the one `-i FILE` describes) started and remove its files (and its
    containers, network, firewall chains)."""
    from ddops import testbed

    where = _root(ctx, root)
    engine = testbed.load_testbed(where).engine
    stopped = testbed.down(where)
    if state(ctx).json:
        write_document(0, {"testbed": {"root": str(where), "engine": engine}, "stopped": len(stopped)})
        return
    what = ("sshd process", "sshd processes") if engine == "namespace" else ("container", "containers")
    console.print(f"testbed down: {escape(str(where))}: stopped {len(stopped)} {what[len(stopped) != 1]}")


@command(testbed_app, "status")
def status(ctx: typer.Context, root: RootOpt = None) -> None:
    """Show each testbed host and whether its sshd is running."""
    from ddops import testbed

    where = _root(ctx, root)
    rows = testbed.status(where)
    code = 0 if all(r["running"] for r in rows) else 1
    if state(ctx).json:
        write_document(code, {"testbed": {"root": str(where)}, "hosts": [
            {"host": r["name"], **{k: v for k, v in r.items() if k != "name"}} for r in rows]})
        raise typer.Exit(code)
    extra = ("container", "state") if "container" in rows[0] else ()
    show_table(["host", "address", "port", "pid", "running", *extra, "dir"],
               [[str(r["name"]), str(r["address"]), str(r["port"]), str(r["pid"] or "-"),
                 "yes" if r["running"] and r["accepting"] else "no", *(str(r[c]) for c in extra), str(r["dir"])]
                for r in rows])
    raise typer.Exit(code)
