"""Reading an inventory: the file (or `-H` hosts) validated with file:line errors, each host resolved through its
groups, ssh_config and the defaults."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddops import settings
from ddops.errors import InventoryError, UsageError
from ddops.inventory.schema import (BUILTIN_DEFAULTS, DEFAULT_INVENTORY, DEFAULT_KNOWN_HOSTS, DEFAULT_SSH_CONFIG,
                                    GROUP_KEYS, HOST_SCHEMA, SSH_ONLY_KEYS, TOP_KEYS, Host, HostKey, Inventory, is_type,
                                    looks_like_playbook_path, valid_name)
from ddops.ownership import UNTRUSTED_PLAYBOOKS, untrusted_in
from ddops.slurm_options import SlurmOptions
from ddops.sshconfig import OpenSshConfig, SshConfig, jump_hops, jump_problem, load_ssh_config, split_hop
from ddops.yamlsrc import YamlDoc, describe, dotted, load_yaml_file, suggest, type_name

ADHOC_SOURCE = "-H"  # an ad-hoc inventory's "file" in its error messages


def inventory_path(explicit: str | None) -> Path:
    """-i PATH, else $DDOPS_INVENTORY, else ./inventory.yaml."""
    return Path(explicit or settings.INVENTORY.value() or DEFAULT_INVENTORY)


def load_inventory(path: str | os.PathLike[str], ssh_config: SshConfig | OpenSshConfig | None = None) -> Inventory:
    """Load and validate an inventory; every error is an InventoryError starting with `file:line:`."""
    doc = load_yaml_file(path, InventoryError)
    return parse_inventory(doc, ssh_config)


def missing_identity_file(host: Host) -> str | None:
    """`inventory.yaml:7: defaults.identity_file: ~/.ssh/gpu does not exist` where the key file a host names is not
    there (what every connecting command refuses before dialling, and `inventory check` too); None otherwise."""
    path = host.identity_file
    if not path or os.path.exists(os.path.expanduser(path)):
        return None
    if host.identity_origin:
        return f"{host.identity_origin}: {path} does not exist"
    return f"{host.name}: identity_file {path} does not exist"


def adhoc_inventory(spec: str, ssh_config: SshConfig | OpenSshConfig | None = None) -> Inventory:
    """`-H user@host:port,...` as an inventory of those hosts: ~/.ssh/config and the built-in defaults fill in the
    rest, host keys are checked against ~/.ssh/known_hosts as always. Each host is named by its address."""
    hosts: dict[str, dict[str, Any]] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        user, address, port = split_hop(part)
        port_text = part.rpartition(":")[2] if ":" in part.rpartition("@")[2].rpartition("]")[2] else ""
        if not address or any(c.isspace() for c in part) or (port_text and port is None):
            raise UsageError(f"-H {part}: not a host ([user@]host[:port], comma-separated)")
        if port is not None and not 0 < port < 65536:  # `:0` was port 22
            raise UsageError(f"-H {part}: port {port} is out of range 1-65535")
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in address)
        if name in hosts:
            name = f"{name}-{port or 22}"
        if name in hosts:
            raise UsageError(f"-H {part}: named twice")
        hosts[name] = {"address": address, **({"user": user} if user else {}),
                       **({"port": port} if port is not None else {})}
    if not hosts:
        raise UsageError("-H: no host given (expected [user@]host[:port], comma-separated)")
    return parse_inventory(YamlDoc(ADHOC_SOURCE, {"hosts": hosts}), ssh_config)


@dataclass(frozen=True, slots=True)
class _Sources:
    """What a host's settings are resolved from besides its own: the file, its defaults and groups, ssh_config."""

    doc: YamlDoc
    defaults: Mapping[str, Any]
    groups: Mapping[str, Mapping[str, Any]]
    ssh_config: SshConfig | OpenSshConfig
    known_hosts_from_config: bool  # the inventory names no known_hosts: ssh_config's UserKnownHostsFile counts

    def err(self, keypath: tuple, message: str) -> InventoryError:
        return _err(self.doc, keypath, message)

    def origin(self, key: str, name: str, values: Mapping[str, Any], groups: list) -> str:
        """`file:line: key.path` of the setting a host's `key` came from (its own, a group's, the defaults', or the
        host's line when ssh_config set it)."""
        setter = next((g for g in groups if key in (self.groups.get(g) or {})), None)
        if key in values:
            keypath: tuple = ("hosts", name, key)
        elif setter is not None:
            keypath = ("groups", setter, key)
        elif key in self.defaults:
            keypath = ("defaults", key)
        else:
            return f"{self.doc.where(('hosts', name))}: hosts.{name}: {key} (from ssh_config)"
        return f"{self.doc.where(keypath)}: {dotted(keypath)}"


def parse_inventory(doc: YamlDoc, ssh_config: SshConfig | OpenSshConfig | None = None) -> Inventory:
    """Validate a parsed inventory and resolve its hosts; every error is an InventoryError at its file:line."""
    data = _top_level(doc)
    if ssh_config is None:
        ssh_config = load_ssh_config(data.get("ssh_config", DEFAULT_SSH_CONFIG))
    sources = _Sources(doc, _checked_defaults(doc, data), _checked_groups(doc, data), ssh_config,
                       known_hosts_from_config="known_hosts" not in data)
    folder = Path(doc.path).resolve().parent
    patches = _patches(doc, data, folder)
    bench = _bench(doc, data, folder)
    playbook_dirs = _playbook_dirs(doc, data, folder)
    hosts = _hosts(sources, data["hosts"])
    return Inventory(
        path=doc.path,
        hosts=hosts,
        known_hosts=data.get("known_hosts", DEFAULT_KNOWN_HOSTS),
        patches=patches,
        ssh_config=data.get("ssh_config", DEFAULT_SSH_CONFIG),
        jump_hosts=_jump_hosts(sources, hosts, data["hosts"]),
        playbook_dirs=playbook_dirs,
        patches_where=tuple(doc.where(("patches", i)) for i in range(len(patches))),
        bench=bench,
        bench_where=doc.where(("bench",)) if bench else "",
    )


def _top_level(doc: YamlDoc) -> dict:
    data = doc.data
    if data is None:
        raise InventoryError(f"{doc.path}:1: the inventory is empty (expected a mapping with `hosts:`)")
    _expect_mapping(doc, (), data, TOP_KEYS)
    if "hosts" not in data:
        raise InventoryError(f"{doc.path}:1: missing `hosts:` (a mapping of host name to settings)")
    if data.get("example"):
        raise InventoryError(f"{doc.where(('example',))}: example: this is ddops' example inventory, its hosts are "
                             "not yours: copy it, put your hosts in and delete this line (or start from `ddops "
                             "inventory init`), and pass it with -i FILE")
    return data


def _checked_defaults(doc: YamlDoc, data: dict) -> dict:
    defaults = data.get("defaults") or {}
    _check_host_values(doc, ("defaults",), defaults, HOST_SCHEMA)
    return defaults


def _checked_groups(doc: YamlDoc, data: dict) -> dict:
    group_settings = data.get("groups") or {}
    for gname, gvalues in group_settings.items():
        if not isinstance(gvalues, dict):
            raise _err(doc, ("groups", gname), f"must be a mapping, not {describe(gvalues)}")
        _check_host_values(doc, ("groups", gname), gvalues, GROUP_KEYS)
    return group_settings


def _patches(doc: YamlDoc, data: dict, folder: Path) -> tuple[str, ...]:
    patches = data.get("patches") or []
    for i, p in enumerate(patches):
        if not isinstance(p, str) or not p:
            raise _err(doc, ("patches", i), f"must be a playbook name, not {describe(p)}")
    # A path in `patches:` is read against the inventory's folder, not the working directory.
    return tuple(str(folder / Path(p).expanduser()) if looks_like_playbook_path(p) else p for p in patches)


def _bench(doc: YamlDoc, data: dict, folder: Path) -> str | None:
    bench = data.get("bench")
    if bench is not None and not bench:
        raise _err(doc, ("bench",), "must name a bench plan")
    if bench and looks_like_playbook_path(bench):
        bench = str(folder / Path(bench).expanduser())
    return bench or None


def _playbook_dirs(doc: YamlDoc, data: dict, folder: Path) -> tuple[str, ...]:
    """The folders searched for playbooks and bench plans before the built-ins, absolute (relative ones are read
    against the inventory's folder, so that cron and CI find them from anywhere), each refused where another user
    could change it or a playbook in it."""
    found = []
    for i, d in enumerate(data.get("playbook_dirs") or []):
        if not isinstance(d, str) or not d:
            raise _err(doc, ("playbook_dirs", i), f"must be a folder path, not {describe(d)}")
        path = (folder / Path(d).expanduser()).resolve()
        if not path.is_dir():
            raise _err(doc, ("playbook_dirs", i), f"'{d}' is not a folder (read against {folder})")
        untrusted = untrusted_in(path)
        if untrusted:
            raise _err(doc, ("playbook_dirs", i), f"{untrusted}: {UNTRUSTED_PLAYBOOKS}")
        found.append(str(path))
    return tuple(found)


def _hosts(sources: _Sources, raw_hosts: Any) -> tuple[Host, ...]:
    if not isinstance(raw_hosts, dict) or not raw_hosts:
        raise sources.err(("hosts",), "must be a non-empty mapping of host name to settings")
    # Every host's name goes through ssh_config (its ProxyJump hops too, below): resolve them all at once.
    sources.ssh_config.prefetch(str(v.get("address", n)) if isinstance(v, dict) else str(n)
                                for n, v in raw_hosts.items())
    hosts: list[Host] = []
    for name, values in raw_hosts.items():
        keypath = ("hosts", name)
        if not isinstance(name, str) or not valid_name(name):
            raise sources.err(keypath, "host names use letters, digits, '.', '_' and '-' only")
        if not name.strip("."):  # a host's files land in results/<run>/<host>/: '..' would be results/ itself
            raise sources.err(keypath, f"'{name}' is not a host name (it names a directory: use letters or digits)")
        values = values if values is not None else {}
        if not isinstance(values, dict):
            raise sources.err(keypath, f"must be a mapping, not {describe(values)}")
        _check_host_values(sources.doc, keypath, values, HOST_SCHEMA)
        host = _resolve_host(name, values, sources)
        _check_one_machine_per_host(sources, host, hosts)
        hosts.append(host)
    return tuple(hosts)


def _check_one_machine_per_host(sources: _Sources, host: Host, earlier: list[Host]) -> None:
    """One machine per host: a local repo, or an address:port as seen from the jump it is reached through (10.0.0.5
    behind bastion-a is not 10.0.0.5 behind bastion-b), and never two such behind one known_hosts name."""
    keypath = ("hosts", host.name)
    if host.local:
        twin = next((o for o in earlier if o.local and o.repo == host.repo), None)
        if twin is not None:
            raise sources.err(keypath, f"same repo {host.repo} on this machine as host '{twin.name}'")
        return
    at_address = [o for o in earlier if not o.local and (o.address, o.port) == (host.address, host.port)]
    twin = next((o for o in at_address if _jump_path(o.proxy_jump) == _jump_path(host.proxy_jump)), None)
    if twin is not None:
        behind = f" behind {host.proxy_jump}" if host.proxy_jump else ""
        raise sources.err(keypath, f"same address {host.address}:{host.port}{behind} as host '{twin.name}'")
    twin = next((o for o in at_address if (o.host_key_alias or None) == (host.host_key_alias or None)), None)
    if twin is not None:
        raise sources.err(keypath, f"same address {host.address}:{host.port} as host '{twin.name}' behind another "
                                   "jump: give each a `host_key_alias` (their host keys would share one known_hosts "
                                   "entry)")


def _jump_hosts(sources: _Sources, hosts: tuple[Host, ...], raw_hosts: dict) -> tuple[Host, ...]:
    """The ProxyJump hops that are ssh_config aliases rather than inventory hosts, resolved like hosts; a hop that
    is neither (nor an IP address) is an error at the proxy_jump that names it."""
    names = {h.name for h in hosts}
    hop_hosts: dict[str, Host] = {}
    pending = [(h, h) for h in hosts]  # (host whose proxy_jump is read, inventory host it was reached from)
    while pending:
        h, origin = pending.pop(0)
        for hop in _jump_hops(h.proxy_jump):
            if hop in names or hop in hop_hosts or _looks_like_address(hop):
                pass
            elif sources.ssh_config.knows(hop):  # an ssh_config alias: resolved as a host with the defaults
                hop_hosts[hop] = _resolve_host(hop, {}, sources)
                pending.append((hop_hosts[hop], origin))
            else:
                raw = raw_hosts[origin.name] or {}
                where = ("hosts", origin.name, "proxy_jump") if "proxy_jump" in raw else ("defaults", "proxy_jump")
                raise sources.err(where, f"'{hop}' is neither a host in this inventory nor an ssh_config alias")
            if hop == h.name and h is origin:
                raise sources.err(("hosts", h.name, "proxy_jump"), "a host cannot jump through itself")
    return tuple(hop_hosts.values())


def _resolve_host(name: str, values: Mapping[str, Any], sources: _Sources) -> Host:
    """A host's settings, by precedence: its own > its groups (in order) > ssh_config > defaults > built-ins."""
    defaults, group_settings = sources.defaults, sources.groups
    groups = list((values["groups"] or []) if "groups" in values else (defaults.get("groups") or []))
    for g in groups:
        if g == name:
            raise sources.err(("hosts", name, "groups"), f"group '{g}' has the same name as a host")
    _check_local(sources, name, values, groups)
    merged: dict[str, Any] = dict(BUILTIN_DEFAULTS)
    merged.update({k: v for k, v in defaults.items() if k != "groups"})
    from_config = sources.ssh_config.lookup(values.get("address", name))
    for key in ("user", "port", "identity_file", "proxy_jump", "host_key_alias", "identities_only"):
        if key in from_config and key not in values and not any(key in (group_settings.get(g) or {}) for g in groups):
            merged[key] = _from_ssh_config(key, from_config[key])
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
    problem = jump_problem(merged["proxy_jump"]) if merged.get("proxy_jump") else None
    if problem:  # said here, with the line that set it, rather than by ssh later
        raise InventoryError(f"{sources.origin('proxy_jump', name, values, groups)}: {problem}")
    merged["address"] = from_config.get("hostname", values.get("address", name))
    if isinstance(merged.get("port"), str):
        raise sources.err(("hosts", name), f"ssh_config gives port '{merged['port']}', which is not a number")
    fields = {key: _field_value(spec, merged.get(key)) for key, spec in HOST_SCHEMA.items()
              if key not in ("groups", "slurm")}
    return Host(
        name=name,
        **fields,
        groups=tuple(groups),
        # Precedence as for the other keys: the inventory's own `known_hosts` beats ssh_config's.
        known_hosts=from_config.get("known_hosts") if sources.known_hosts_from_config else None,
        slurm=SlurmOptions.from_mapping(merged["slurm"]) if merged.get("executor") == "slurm" else None,
        identity_origin=sources.origin("identity_file", name, values, groups),
    )


def _from_ssh_config(key: str, value: str) -> Any:
    """An ssh_config value as the inventory's key holds it (a port a number where it is one, yes/no a bool)."""
    if key == "port" and value.isdigit():
        return int(value)
    return value == "yes" if key == "identities_only" else value


def _check_local(sources: _Sources, name: str, values: Mapping[str, Any], groups: list) -> None:
    """A `connection: local` host runs here, as the user running ddops, without SSH: a key only SSH reads (user,
    address, port, proxy_jump), set on the host itself or beside the `connection: local` that makes it local, would be
    ignored (`user: nobody` ran as root), so it is refused there."""
    layers = [(("hosts", name), values), *((("groups", g), sources.groups.get(g) or {}) for g in groups),
              (("defaults",), sources.defaults)]
    deciding = next(((keypath, layer) for keypath, layer in layers if "connection" in layer), None)
    if deciding is None or deciding[1]["connection"] != "local":
        return
    for keypath, layer in dict([layers[0], deciding]).items():
        key = next((k for k in SSH_ONLY_KEYS if k in layer), None)
        if key is not None:
            raise sources.err(keypath + (key,), "does not apply to a `connection: local` host (it runs on this "
                                                "machine as the user running ddops, without SSH): remove it, or use "
                                                "connection: ssh")


def _field_value(spec: HostKey, value: Any) -> Any:
    value = spec.default if value is None else value
    return spec.convert(value) if spec.convert is not None and value is not None else value


def _expect_mapping(doc: YamlDoc, keypath: tuple, data: Any, allowed: Mapping[str, Any]) -> None:
    if not isinstance(data, dict):
        raise _err(doc, keypath, f"must be a mapping, not {describe(data)}")
    for key, value in data.items():
        child = keypath + (key,)
        if key not in allowed:
            raise _err(doc, child, f"unknown key{suggest(key, allowed)}")
        expected = allowed[key]
        if value is None and key in ("groups", "defaults", "patches"):
            continue
        if not is_type(value, expected):
            raise _err(doc, child, f"must be {type_name(expected)}, not {describe(value)}")


def _check_host_values(doc: YamlDoc, keypath: tuple, values: Any, schema: Mapping[str, HostKey]) -> None:
    """The first problem of a host's (or defaults', or a group's) settings, as an InventoryError at its line."""
    if not isinstance(values, dict):
        raise _err(doc, keypath, f"must be a mapping, not {describe(values)}")
    for key, value in values.items():
        if key not in schema:
            raise _err(doc, keypath + (key,), f"unknown key{suggest(key, schema)}")
        for sub, message in schema[key].problems(value):
            raise _err(doc, keypath + (key,) + sub, message)


def _err(doc: YamlDoc, keypath: tuple, message: str) -> InventoryError:
    return InventoryError(f"{doc.where(keypath)}: {dotted(keypath)}: {message}")


def _jump_path(proxy_jump: str | None) -> str:
    """A ProxyJump chain as one comparable value (`a, b` and `a,b` are one path)."""
    return ",".join(jump_hops(proxy_jump))


def _jump_hops(proxy_jump: str | None) -> list[str]:
    """The host names of a ProxyJump chain's hops (without user@ and :port)."""
    return [split_hop(hop)[1] for hop in jump_hops(proxy_jump)]


def _looks_like_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False
