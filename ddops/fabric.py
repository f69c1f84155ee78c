"""Fabric interop: your own Fabric tasks on exactly the hosts ddops manages (`pip install 'ddops[fabric]'`).

    from ddops.fabric import group
    for conn, result in group(limit="h200-*").run("nvidia-smi -L", hide=True).items():
        print(conn.host, result.stdout)

Connections get the inventory's address, port, user, identity file and jump host (as a gateway Connection), and
ddops' host-key policy: keys are checked against the inventory's known_hosts and an unknown key is refused, where
Fabric would add it silently."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddops.inventory import Host, Inventory, Selection, inventory_path, load_inventory, select
from ddops.transport.fabric_interop import RefuseUnknownHostKey, connection, connections, threading_group


def group(*, inventory: Inventory | str | None = None, hosts: Sequence[str] = (), groups: Sequence[str] = (),
          all: bool = False, limit: str | None = None) -> Any:  # noqa: A002 - the CLI's --all
    """A fabric.ThreadingGroup of the selected hosts (every host when nothing is selected)."""
    inv = _inventory(inventory)
    return threading_group(inv, selected(inv, hosts=hosts, groups=groups, all=all, limit=limit))


def selected(inventory: Inventory, *, hosts: Sequence[str] = (), groups: Sequence[str] = (), all: bool = False,
             limit: str | None = None) -> list[Host]:  # noqa: A002
    """The hosts a selection names, as `ddops --host/--group/--all/--limit` would pick them."""
    selection = Selection(hosts=tuple(hosts), groups=tuple(groups), all=all, limit=limit)
    return list(inventory.hosts) if selection.empty else select(inventory, selection)


def _inventory(inventory: Inventory | str | None) -> Inventory:
    return inventory if isinstance(inventory, Inventory) else load_inventory(inventory_path(inventory))


__all__ = ["RefuseUnknownHostKey", "connection", "connections", "group", "selected", "threading_group"]
