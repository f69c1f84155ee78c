"""Hosts and groups: the inventory file, validated with file:line errors, and host selection."""

from __future__ import annotations

import fnmatch
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ddops.slurm_options import EXECUTORS, SLURM_KEYS, SlurmOptions, slurm_option_problems
from ddops.errors import InventoryError, UsageError
from ddops.sshconfig import OpenSshConfig, SshConfig, jump_hops, load_ssh_config, split_hop
from ddops.yamlsrc import YamlDoc, describe, dotted, load_yaml_file, suggest, type_name

DEFAULT_INVENTORY = "inventory.yaml"
DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYNC_MODES = ("auto", "remote", "push")

# Every key a host may carry (and so `defaults` and `groups.<g>` too), with its type.
HOST_KEYS: dict[str, type | tuple[type, ...]] = {
    "address": str,
    "port": int,
    "user": str,
    "identity_file": str,
    "proxy_jump": str,
    "repo": str,
    "python": str,
    "groups": list,
    "vars": dict,
    "repo_url": str,
    "commit": str,
    "sync": str,
    "connect_timeout": (int, float),
    "command_timeout": (int, float),
    "agent_linger": (int, float),
    # Slurm as the bench executor (ddops/bench/slurm.py): the host is then the cluster's login node.
    "executor": str,
    "slurm": dict,
}
TOP_KEYS: dict[str, type | tuple[type, ...]] = {
    "defaults": dict,
    "known_hosts": str,
    "ssh_config": str,
    "patches": list,
    "playbook_dirs": list,
    "groups": dict,
    "hosts": dict,
}
BUILTIN_DEFAULTS: dict[str, Any] = {
    "port": 22,
    "user": "root",
    "repo": "/root/ddtree",
    "python": "python3",
    "sync": "auto",
    "connect_timeout": 10.0,
    "command_timeout": 120.0,
    "agent_linger": 300.0,
}


@dataclass(frozen=True, slots=True)
class Host:
    """One SSH-reachable host, with every setting resolved."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    proxy_jump: str | None = None
    repo: str = "/root/ddtree"
    python: str = "python3"
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    repo_url: str | None = None
    commit: str | None = None
    sync: str = "auto"
    connect_timeout: float = 10.0
    command_timeout: float = 120.0
    # Seconds the host's agent stays on after a session to serve the next command without starting Python
    # (remote/README.md, "The resident agent"); 0: never.
    agent_linger: float = 300.0
    # The host's UserKnownHostsFile from ssh_config, where the inventory names no known_hosts; None: the inventory's.
    known_hosts: str | None = None
    # How `ddops bench` runs the plan here: `bare` (detached processes on this host) or `slurm` (one job array).
    executor: str = "bare"
    slurm: SlurmOptions | None = None

    @property
    def label(self) -> str:
        """`name (address)` or just the name when they are the same."""
        return self.name if self.name == self.address else f"{self.name} ({self.address})"


@dataclass(frozen=True, slots=True)
class Inventory:
    path: str
    hosts: tuple[Host, ...]
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    patches: tuple[str, ...] = ()
    ssh_config: str = DEFAULT_SSH_CONFIG
    # ProxyJump hops that are ssh_config aliases rather than inventory hosts, resolved like hosts (for the Connector).
    jump_hosts: tuple[Host, ...] = ()
    # Folders searched for playbooks and bench plans before the built-ins, absolute (relative ones are read against
    # the inventory's folder, so that cron and CI find them from anywhere).
    playbook_dirs: tuple[str, ...] = ()
    # `file:line` of each `patches:` entry, for errors about the playbook it names.
    patches_where: tuple[str, ...] = field(default=(), compare=False)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @property
    def groups(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for h in self.hosts:
            for g in h.groups:
                seen.setdefault(g)
        return tuple(seen)


def looks_like_playbook_path(name: str) -> bool:
    """A playbook or plan given as a path (`./mine.yaml`, `dir/x`) rather than a name looked up in folders."""
    return "/" in name or name.endswith((".yaml", ".yml")) or name.startswith((".", "~"))


def inventory_path(explicit: str | None) -> Path:
    """-i PATH, else $DDOPS_INVENTORY, else ./inventory.yaml."""
    return Path(explicit or os.environ.get("DDOPS_INVENTORY") or DEFAULT_INVENTORY)


def load_inventory(path: str | os.PathLike[str], ssh_config: SshConfig | OpenSshConfig | None = None) -> Inventory:
    """Load and validate an inventory; every error is an InventoryError starting with `file:line:`."""
    doc = load_yaml_file(path, InventoryError)
    return parse_inventory(doc, ssh_config)


def parse_inventory(doc: YamlDoc, ssh_config: SshConfig | OpenSshConfig | None = None) -> Inventory:
    data = doc.data
    if data is None:
        raise InventoryError(f"{doc.path}:1: the inventory is empty (expected a mapping with `hosts:`)")
    _expect_mapping(doc, (), data, TOP_KEYS)
    if "hosts" not in data:
        raise InventoryError(f"{doc.path}:1: missing `hosts:` (a mapping of host name to settings)")
    if ssh_config is None:
        ssh_config = load_ssh_config(data.get("ssh_config", DEFAULT_SSH_CONFIG))

    defaults = data.get("defaults") or {}
    _expect_mapping(doc, ("defaults",), defaults, HOST_KEYS)
    _check_host_values(doc, ("defaults",), defaults)

    group_settings = data.get("groups") or {}
    for gname, gvalues in group_settings.items():
        if not isinstance(gvalues, dict):
            raise _err(doc, ("groups", gname), f"must be a mapping, not {describe(gvalues)}")
        keys = {k: v for k, v in HOST_KEYS.items() if k not in ("groups", "address")}
        _expect_mapping(doc, ("groups", gname), gvalues, keys)
        _check_host_values(doc, ("groups", gname), gvalues)

    folder = Path(doc.path).resolve().parent
    patches = data.get("patches") or []
    for i, p in enumerate(patches):
        if not isinstance(p, str) or not p:
            raise _err(doc, ("patches", i), f"must be a playbook name, not {describe(p)}")
    # A path in `patches:` is read against the inventory's folder, not the working directory.
    patches = [str(folder / Path(p).expanduser()) if looks_like_playbook_path(p) else p for p in patches]
    playbook_dirs = data.get("playbook_dirs") or []
    for i, d in enumerate(playbook_dirs):
        if not isinstance(d, str) or not d:
            raise _err(doc, ("playbook_dirs", i), f"must be a folder path, not {describe(d)}")
        if not (folder / Path(d).expanduser()).is_dir():
            raise _err(doc, ("playbook_dirs", i), f"'{d}' is not a folder (read against {folder})")

    raw_hosts = data["hosts"]
    if not isinstance(raw_hosts, dict) or not raw_hosts:
        raise _err(doc, ("hosts",), "must be a non-empty mapping of host name to settings")

    # Every host's name goes through ssh_config (its ProxyJump hops too, below): resolve them all at once.
    ssh_config.prefetch(str(v.get("address", n)) if isinstance(v, dict) else str(n) for n, v in raw_hosts.items())
    hosts: list[Host] = []
    addresses: dict[tuple[str, int], str] = {}
    for name, values in raw_hosts.items():
        keypath = ("hosts", name)
        if not isinstance(name, str) or not _valid_name(name):
            raise _err(doc, keypath, "host names use letters, digits, '.', '_' and '-' only")
        if not name.strip("."):  # a host's files land in results/<run>/<host>/: '..' would be results/ itself
            raise _err(doc, keypath, f"'{name}' is not a host name (it names a directory: use letters or digits)")
        values = values if values is not None else {}
        if not isinstance(values, dict):
            raise _err(doc, keypath, f"must be a mapping, not {describe(values)}")
        _expect_mapping(doc, keypath, values, HOST_KEYS)
        _check_host_values(doc, keypath, values)
        host = _resolve_host(name, values, defaults, group_settings, ssh_config, doc,
                             known_hosts_from_config="known_hosts" not in data)
        key = (host.address, host.port)
        if key in addresses:
            raise _err(doc, keypath, f"same address {host.address}:{host.port} as host '{addresses[key]}'")
        addresses[key] = name
        hosts.append(host)

    names = {h.name for h in hosts}
    hop_hosts: dict[str, Host] = {}
    pending = [(h, h) for h in hosts]  # (host whose proxy_jump is read, inventory host it was reached from)
    while pending:
        h, origin = pending.pop(0)
        for hop in _jump_hops(h.proxy_jump):
            if hop in names or hop in hop_hosts or _looks_like_address(hop):
                pass
            elif ssh_config.knows(hop):  # an ssh_config alias: resolved as a host with the inventory's defaults
                hop_hosts[hop] = _resolve_host(hop, {}, defaults, group_settings, ssh_config, doc,
                                               known_hosts_from_config="known_hosts" not in data)
                pending.append((hop_hosts[hop], origin))
            else:
                raw = raw_hosts[origin.name] or {}
                where = ("hosts", origin.name, "proxy_jump") if "proxy_jump" in raw else ("defaults", "proxy_jump")
                raise _err(doc, where, f"'{hop}' is neither a host in this inventory nor an ssh_config alias")
            if hop == h.name and h is origin:
                raise _err(doc, ("hosts", h.name, "proxy_jump"), "a host cannot jump through itself")

    return Inventory(
        path=doc.path,
        hosts=tuple(hosts),
        known_hosts=data.get("known_hosts", DEFAULT_KNOWN_HOSTS),
        patches=tuple(patches),
        ssh_config=data.get("ssh_config", DEFAULT_SSH_CONFIG),
        jump_hosts=tuple(hop_hosts.values()),
        playbook_dirs=tuple(str(folder / Path(d).expanduser()) for d in playbook_dirs),
        patches_where=tuple(doc.where(("patches", i)) for i in range(len(patches))),
    )


def _resolve_host(name: str, values: dict, defaults: dict, group_settings: dict,
                  ssh_config: SshConfig | OpenSshConfig, doc: YamlDoc, *,
                  known_hosts_from_config: bool = True) -> Host:
    groups = list(values.get("groups", defaults.get("groups", [])))
    for g in groups:
        if g == name:
            raise _err(doc, ("hosts", name, "groups"), f"group '{g}' has the same name as a host")
    # Precedence: host > its groups (in order) > ssh_config > defaults > built-in defaults.
    merged: dict[str, Any] = dict(BUILTIN_DEFAULTS)
    merged.update({k: v for k, v in defaults.items() if k != "groups"})
    address = values.get("address", name)
    from_config = ssh_config.lookup(address)
    if "hostname" in from_config:
        address_resolved = from_config["hostname"]
    else:
        address_resolved = address
    for key in ("user", "port", "identity_file", "proxy_jump"):
        if key in from_config and key not in values and not any(key in (group_settings.get(g) or {}) for g in groups):
            merged[key] = int(from_config[key]) if key == "port" and from_config[key].isdigit() else from_config[key]
    for g in reversed(groups):
        merged.update(group_settings.get(g) or {})
    merged.update({k: v for k, v in values.items() if k != "groups"})
    # `slurm:` merges key by key (a host may change only the partition its group sets).
    merged["slurm"] = {**(defaults.get("slurm") or {}),
                       **{k: v for g in reversed(groups) for k, v in ((group_settings.get(g) or {}).get("slurm")
                                                                       or {}).items()},
                       **(values.get("slurm") or {})}
    if merged.get("proxy_jump") in ("none", ""):
        merged["proxy_jump"] = None
    merged["address"] = address_resolved
    if isinstance(merged.get("port"), str):
        raise _err(doc, ("hosts", name), f"ssh_config gives port '{merged['port']}', which is not a number")
    return Host(
        name=name,
        address=merged["address"],
        port=int(merged["port"]),
        user=merged["user"],
        identity_file=merged.get("identity_file"),
        proxy_jump=merged.get("proxy_jump"),
        repo=merged["repo"],
        python=merged["python"],
        groups=tuple(groups),
        vars=dict(merged.get("vars") or {}),
        repo_url=merged.get("repo_url"),
        commit=merged.get("commit"),
        sync=merged["sync"],
        connect_timeout=float(merged["connect_timeout"]),
        command_timeout=float(merged["command_timeout"]),
        agent_linger=float(merged["agent_linger"]),
        # Precedence as for the other keys: the inventory's own `known_hosts` beats ssh_config's.
        known_hosts=from_config.get("known_hosts") if known_hosts_from_config else None,
        executor=merged.get("executor") or "bare",
        slurm=SlurmOptions.from_mapping(merged["slurm"]) if merged.get("executor") == "slurm" else None,
    )


def _expect_mapping(doc: YamlDoc, keypath: tuple, data: Any, allowed: Mapping[str, Any]) -> None:
    if not isinstance(data, dict):
        raise _err(doc, keypath, f"must be a mapping, not {describe(data)}")
    for key, value in data.items():
        child = keypath + (key,)
        if key not in allowed:
            raise _err(doc, child, f"unknown key{suggest(key, allowed)}")
        expected = allowed[key]
        if value is None and key in ("groups", "vars", "defaults", "patches", "slurm"):
            continue
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, (int, float)))
        if not ok:
            raise _err(doc, child, f"must be {type_name(expected)}, not {describe(value)}")


def _check_host_values(doc: YamlDoc, keypath: tuple, values: dict) -> None:
    if "port" in values and not 0 < values["port"] < 65536:
        raise _err(doc, keypath + ("port",), f"port {values['port']} is out of range 1-65535")
    for key in ("connect_timeout", "command_timeout"):
        if key in values and values[key] <= 0:
            raise _err(doc, keypath + (key,), "must be a positive number of seconds")
    if "agent_linger" in values and not 0 <= values["agent_linger"] <= 86400:
        raise _err(doc, keypath + ("agent_linger",), "must be between 0 (never) and 86400 seconds")
    if "sync" in values and values["sync"] not in SYNC_MODES:
        raise _err(doc, keypath + ("sync",), f"must be one of {', '.join(SYNC_MODES)}{suggest(values['sync'], SYNC_MODES)}")
    if "executor" in values and values["executor"] not in EXECUTORS:
        raise _err(doc, keypath + ("executor",),
                   f"must be one of {', '.join(EXECUTORS)}{suggest(values['executor'], EXECUTORS)}")
    if values.get("slurm") is not None:
        _expect_mapping(doc, keypath + ("slurm",), values["slurm"], SLURM_KEYS)
        for sub, message in slurm_option_problems(values["slurm"]):
            raise _err(doc, keypath + ("slurm",) + sub, message)
    if "repo" in values:
        repo = values["repo"]
        if not repo.startswith(("/", "~")):
            raise _err(doc, keypath + ("repo",), "must be an absolute path (or start with ~)")
        if any(ch in repo for ch in "\n\0") or ".." in Path(repo).parts:
            raise _err(doc, keypath + ("repo",), "must not contain newlines, NUL bytes or '..'")
    for key in ("repo_url", "commit"):
        # Both reach git's command line on the controller and the host: '-' would make them options there
        # (`--upload-pack=CMD` runs CMD).
        if key in values and (values[key].startswith("-") or any(ch in values[key] for ch in "\n\0")):
            raise _err(doc, keypath + (key,), "must not start with '-' (git would read it as an option) "
                                              "nor contain newlines or NUL bytes")
    if "address" in values and (not values["address"] or any(c.isspace() for c in values["address"])):
        raise _err(doc, keypath + ("address",), "must be a host name or IP address without spaces")
    for i, g in enumerate(values.get("groups") or []):
        if not isinstance(g, str) or not _valid_name(g):
            raise _err(doc, keypath + ("groups", i), "group names use letters, digits, '.', '_' and '-' only")
    for k in values.get("vars") or {}:
        if not isinstance(k, str):
            raise _err(doc, keypath + ("vars", k), "variable names must be strings")


def _err(doc: YamlDoc, keypath: tuple, message: str) -> InventoryError:
    return InventoryError(f"{doc.where(keypath)}: {dotted(keypath)}: {message}")


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "._-" for c in name)


def _jump_hops(proxy_jump: str | None) -> list[str]:
    """The host names of a ProxyJump chain's hops (without user@ and :port)."""
    return [split_hop(hop)[1] for hop in jump_hops(proxy_jump)]


def _looks_like_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


# --- selection -------------------------------------------------------------------------------------------------


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

