"""Shell completion of what users type most: host names, groups, playbooks, bench plans and run ids.

Fast and offline: the inventory's YAML is read as written (no ssh_config, no host dialled, nothing validated), the
playbook folders listed, the results folder's run ids read from their names. A file that cannot be read completes
nothing rather than failing the shell."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer

from ddops.grouping import natural_sorted


def _param(ctx: typer.Context | None, name: str) -> Any:
    """A parameter given on the command line so far, on this command or one around it (-i before the command)."""
    current: Any = ctx  # its parents are click's Contexts, typer's base class
    while current is not None:
        value = (current.params or {}).get(name)
        if value:
            return value
        current = current.parent
    return None


def _inventory_data(ctx: typer.Context | None) -> tuple[dict[str, Any], Path]:
    from ddops.errors import DdopsError
    from ddops.inventory import inventory_path
    from ddops.yamlsrc import load_yaml_file

    path = inventory_path(_param(ctx, "inventory"))
    try:
        data = load_yaml_file(path, DdopsError).data
    except DdopsError:
        return {}, path
    return (data if isinstance(data, dict) else {}), path


def _matching(candidates: Iterable[str], incomplete: str) -> list[str]:
    return natural_sorted(dict.fromkeys(c for c in candidates if isinstance(c, str) and c.startswith(incomplete)))


def _host_names(data: dict[str, Any]) -> list[str]:
    hosts = data.get("hosts")
    return [str(name) for name in hosts] if isinstance(hosts, dict) else []


def _group_names(data: dict[str, Any]) -> list[str]:
    named = list(data["groups"]) if isinstance(data.get("groups"), dict) else []
    for values in (data.get("hosts") or {}).values() if isinstance(data.get("hosts"), dict) else ():
        groups = values.get("groups") if isinstance(values, dict) else None
        named += [str(g) for g in groups or () if isinstance(g, (str, int))]
    return [str(g) for g in named]


def hosts(ctx: typer.Context, incomplete: str) -> list[str]:
    """--host: the inventory's host names."""
    return _matching(_host_names(_inventory_data(ctx)[0]), incomplete)


def groups(ctx: typer.Context, incomplete: str) -> list[str]:
    """--group: the groups the inventory defines or its hosts name."""
    return _matching(_group_names(_inventory_data(ctx)[0]), incomplete)


def limit(ctx: typer.Context, incomplete: str) -> list[str]:
    """--limit 'a,!b': host and group names for the pattern after the last comma (a `!` kept)."""
    done, _, last = incomplete.rpartition(",")
    negate = "!" if last.startswith("!") else ""
    data = _inventory_data(ctx)[0]
    head = f"{done}," if done else ""
    return [head + negate + name for name in _matching(_host_names(data) + _group_names(data), last[len(negate):])]


def _search_dirs(ctx: typer.Context | None) -> tuple[Path, ...]:
    """Where bare playbook and plan names are looked up (search_path), from the inventory's `playbook_dirs:` as
    written (read against its folder; the inventory is not loaded)."""
    from ddops.errors import DdopsError
    from ddops.patching.playbook import search_path

    data, path = _inventory_data(ctx)
    listed = data.get("playbook_dirs")
    listed = listed if isinstance(listed, list) else []
    try:
        return search_path([str(path.parent / str(d)) for d in listed])
    except DdopsError:  # a folder search_path refuses: nothing to offer from it
        return ()


def _yaml_files(ctx: typer.Context | None) -> list[Path]:
    found = []
    for folder in _search_dirs(ctx):
        try:
            found += sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
        except OSError:
            continue
    return found


def _top_keys(path: Path) -> set[str]:
    """The keys a YAML file sets at its top level, read from the lines that start with one (no YAML parsed)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return set()
    return {line.split(":", 1)[0] for line in lines if line[:1].isalpha() and ":" in line}


def playbooks(ctx: typer.Context, incomplete: str) -> list[str]:
    """PLAYBOOK: the patch playbooks along the search path (files with `patches:`)."""
    return _matching((p.stem for p in _yaml_files(ctx) if "patches" in _top_keys(p)), incomplete)


def plans(ctx: typer.Context, incomplete: str) -> list[str]:
    """PLAN: the bench plans along the search path (files with `command:`)."""
    return _matching((p.stem for p in _yaml_files(ctx) if "command" in _top_keys(p)), incomplete)


def run_ids(ctx: typer.Context, incomplete: str) -> list[str]:
    """RUN: the runs launched or collected from here, newest first (ids sort by launch time)."""
    from ddops.bench.runs import LAUNCH_RECORD, MANIFEST, results_root

    root = results_root(_param(ctx, "results_dir"))
    try:
        found = [p.name for p in root.iterdir()
                 if p.name.startswith(incomplete) and ((p / LAUNCH_RECORD).is_file() or (p / MANIFEST).is_file())]
    except OSError:
        return []
    return sorted(found, reverse=True)
