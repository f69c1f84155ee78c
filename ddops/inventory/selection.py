"""Host selection: what `--host`, `--group`, `--all` and `--limit` name in an inventory."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from ddops.errors import UsageError
from ddops.inventory.schema import Host, Inventory
from ddops.yamlsrc import suggest


@dataclass(frozen=True, slots=True)
class Selection:
    """What the user asked for on the command line."""

    hosts: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    all: bool = False
    limit: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.hosts or self.groups or self.all or self.limit)


def select(inventory: Inventory, selection: Selection) -> list[Host]:
    """The hosts a selection names, in inventory order; a UsageError when it names none."""
    if selection.empty:
        raise UsageError("no hosts selected: use --host NAME, --group NAME, --all or --limit PATTERN")
    chosen: set[str] = set()
    for wanted in selection.hosts:
        matches = [h.name for h in inventory.hosts if wanted in (h.name, h.address)]
        if not matches:
            hint = suggest(wanted, [h.name for h in inventory.hosts] + [h.address for h in inventory.hosts])
            raise UsageError(f"--host {wanted}: no such host in {inventory.path}{hint}")
        chosen.update(matches)
    for group in selection.groups:
        matches = [h.name for h in inventory.hosts if group in h.groups]
        if not matches:
            raise UsageError(f"--group {group}: no such group in {inventory.path}{suggest(group, inventory.groups)}")
        chosen.update(matches)
    if selection.all or (selection.limit and not (selection.hosts or selection.groups)):
        chosen.update(h.name for h in inventory.hosts)
    picked = [h for h in inventory.hosts if h.name in chosen]
    if selection.limit:
        picked = [h for h in picked if matches_limit(h, selection.limit)]
        if not picked:
            raise UsageError(f"--limit {selection.limit}: matches no selected host in {inventory.path}")
    return picked


def matches_limit(host: Host, pattern: str) -> bool:
    """Ansible-like: comma-separated globs over name, address and groups; `!glob` excludes."""
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    include = [p for p in parts if not p.startswith("!")]
    exclude = [p[1:] for p in parts if p.startswith("!")]
    candidates = (host.name, host.address, *host.groups)

    def hit(glob: str) -> bool:
        return any(fnmatch.fnmatchcase(c, glob) for c in candidates)

    if include and not any(hit(p) for p in include):
        return False
    return not any(hit(p) for p in exclude)

