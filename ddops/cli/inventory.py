"""`ddops inventory import` (from an Ansible inventory or ssh_config Host blocks) and `ddops inventory init`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ddops.cli.options import command
from ddops.cli.render import console, escape, write_document
from ddops.cli.state import state

OutputOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Where to write it (default: -i, else "
                                                   "./inventory.yaml).", show_default=False)]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing file.")]


def register(app: typer.Typer) -> None:
    from ddops.cli.hosts import inventory_app

    command(inventory_app, "import")(import_inventory)
    command(inventory_app, "init")(init)


def import_inventory(
    ctx: typer.Context,
    ansible: Annotated[Path | None, typer.Option("--ansible", help="An Ansible inventory, INI or YAML.",
                                                    show_default=False)] = None,
    ssh_config: Annotated[list[str] | None, typer.Option(
        "--ssh-config", help="Host aliases to take from ssh_config, as globs ('gpu-*'); repeatable.",
        show_default=False)] = None,
    ssh_config_file: Annotated[Path, typer.Option("--ssh-config-file", help="The ssh_config to read.")] = Path(
        "~/.ssh/config"),
    output: OutputOpt = None, force: ForceOpt = False,
) -> None:
    """Write an inventory from the hosts you already describe: Ansible groups and connection variables, or ssh_config
    Host blocks resolved as `ssh -G` resolves them; whatever has no ddops key is listed."""
    from ddops import inventory_import as imp
    from ddops.errors import InventoryError, UsageError

    if (ansible is None) == (not ssh_config):
        raise UsageError("say what to import: --ansible FILE or --ssh-config 'PATTERN'")
    imported = (imp.import_ansible_file(ansible) if ansible is not None
                else imp.import_ssh_config_file(ssh_config_file, ssh_config or ()))
    if not imported.hosts:
        raise InventoryError(f"{imported.source}: no host to import")
    what = "--ansible" if ansible is not None else "--ssh-config " + " ".join(ssh_config or ())
    header = f"Written by `ddops inventory import {what}` from {imported.source}."
    path = _write_checked(ctx, output, force, imp.render_inventory(imported, header))
    group_names = {g for h in imported.hosts for g in h.groups}
    if state(ctx).json:
        write_document(0, {"written": str(path), "hosts": [h.name for h in imported.hosts],
                           "groups": sorted(group_names), "not_imported": list(imported.not_imported)})
        return
    console.print(f"wrote {escape(str(path))}: {len(imported.hosts)} hosts, {len(group_names)} groups "
                  f"(`ddops -i {escape(str(path))} inventory check` accepts it)")
    for note in imported.not_imported:
        console.print(f"[yellow]not imported:[/] {escape(note)}")


def init(ctx: typer.Context, output: OutputOpt = None, force: ForceOpt = False) -> None:
    """Write a commented starting inventory (every key explained, one example host to replace)."""
    from ddops.inventory_import import starter_inventory

    path = _write_checked(ctx, output, force, starter_inventory())
    if state(ctx).json:
        write_document(0, {"written": str(path)})
        return
    console.print(f"wrote {escape(str(path))}: edit its hosts, then `ddops -i {escape(str(path))} inventory check`")


def _write_checked(ctx: typer.Context, output: Path | None, force: bool, text: str) -> Path:
    """Write text where asked once the inventory loads (never a file `inventory check` would refuse), atomically."""
    from ddops.errors import InventoryError, UsageError
    from ddops.inventory import load_inventory

    path = output or Path(state(ctx).inventory or "inventory.yaml")
    if path.exists() and not force:
        raise UsageError(f"{path} exists: choose another with -o, or replace it with --force")
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(text)
        try:
            load_inventory(temp)
        except InventoryError as exc:
            raise InventoryError(f"the inventory written for {path} does not load: "
                                 f"{str(exc).replace(str(temp), str(path))}") from None
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path
