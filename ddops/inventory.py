"""Hosts and groups: the inventory file, validated with file:line errors, and host selection."""

from __future__ import annotations

import fnmatch
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ddops import settings
from ddops.slurm_options import EXECUTORS, SLURM_KEYS, SlurmOptions, slurm_option_problems
from ddops.errors import InventoryError, UsageError
from ddops.sshconfig import OpenSshConfig, SshConfig, jump_hops, load_ssh_config, split_hop
from ddops.yamlsrc import YamlDoc, describe, dotted, load_yaml_file, suggest, type_name

DEFAULT_INVENTORY = "inventory.yaml"
DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYNC_MODES = ("auto", "remote", "push")

CONNECTIONS = ("ssh", "local")  # `local`: this machine, through a local agent process (no sshd)


def _port(value: int) -> Iterator[tuple[tuple, str]]:
    if not 0 < value < 65536:
        yield (), f"port {value} is out of range 1-65535"


def _positive_seconds(value: float) -> Iterator[tuple[tuple, str]]:
    if value <= 0:
        yield (), "must be a positive number of seconds"


def _linger(value: float) -> Iterator[tuple[tuple, str]]:
    if not 0 <= value <= 86400:
        yield (), "must be between 0 (never) and 86400 seconds"


def _repo(repo: str) -> Iterator[tuple[tuple, str]]:
    if not repo.startswith(("/", "~")):
        yield (), "must be an absolute path (or start with ~)"
    elif any(ch in repo for ch in "\n\0") or ".." in Path(repo).parts:
        yield (), "must not contain newlines, NUL bytes or '..'"


def _git_word(value: str) -> Iterator[tuple[tuple, str]]:
    # repo_url and commit reach git's command line on the controller and the host: '-' would make them options
    # there (`--upload-pack=CMD` runs CMD).
    if value.startswith("-") or any(ch in value for ch in "\n\0"):
        yield (), "must not start with '-' (git would read it as an option) nor contain newlines or NUL bytes"


def _address(value: str) -> Iterator[tuple[tuple, str]]:
    if not value or any(c.isspace() for c in value):
        yield (), "must be a host name or IP address without spaces"


def _group_names(groups: list) -> Iterator[tuple[tuple, str]]:
    for i, g in enumerate(groups):
        if not isinstance(g, str) or not _valid_name(g):
            yield (i,), "group names use letters, digits, '.', '_' and '-' only"


def _var_names(variables: dict) -> Iterator[tuple[tuple, str]]:
    for k in variables:
        if not isinstance(k, str):
            yield (k,), "variable names must be strings"


def _slurm(options: dict) -> Iterator[tuple[tuple, str]]:
    for key, value in options.items():
        if key not in SLURM_KEYS:
            yield (key,), f"unknown key{suggest(key, SLURM_KEYS)}"
        elif not _is_type(value, SLURM_KEYS[key]):
            yield (key,), f"must be {type_name(SLURM_KEYS[key])}, not {describe(value)}"
    yield from slurm_option_problems(options)


@dataclass(frozen=True, slots=True)
class HostKey:
    """One key a host may carry (and so `defaults` and `groups.<g>` too): how it is written, checked and kept."""

    type: type | tuple[type, ...]
    default: Any = None  # what a host gets when nothing sets the key (None: unset)
    choices: tuple[str, ...] = ()
    check: Callable[[Any], Iterator[tuple[tuple, str]]] | None = None  # (key path below the key, problem)
    convert: Callable[[Any], Any] | None = None  # the YAML value as the Host field holds it
    in_groups: bool = True  # a group may set it
    nullable: bool = False  # `key:` with no value means "none" (an empty list or mapping)
    doc: str = ""

    def problems(self, value: Any) -> Iterator[tuple[tuple, str]]:
        """What is wrong with a value of this key, as (key path below it, message)."""
        if value is None and self.nullable:
            return
        if not _is_type(value, self.type):
            yield (), f"must be {type_name(self.type)}, not {describe(value)}"
            return
        if self.choices and value not in self.choices:
            yield (), f"must be one of {', '.join(self.choices)}{suggest(value, self.choices)}"
        if self.check is not None:
            yield from self.check(value)


# The Host schema, one table: the keys the inventory accepts, their defaults and checks, and the Host fields they
# fill (HostKey.convert) all come from here. `Host` below declares the same fields, its defaults read from this table
# (tests/unit/test_inventory.py holds the two together).
HOST_SCHEMA: dict[str, HostKey] = {
    "address": HostKey(str, check=_address, in_groups=False, doc="what to connect to (default: the host's name)"),
    "connection": HostKey(str, "ssh", choices=CONNECTIONS, doc="`local`: this machine, without sshd"),
    "port": HostKey(int, 22, check=_port, convert=int, doc="sshd's port"),
    "user": HostKey(str, "root", doc="the login user (not root: `exec --sudo` for root's commands)"),
    "identity_file": HostKey(str, doc="the private key (the ssh-agent's copy is used first)"),
    "proxy_jump": HostKey(str, doc="`a,b`: hops, as OpenSSH's ProxyJump; `none`: no jump"),
    # Two hosts at one address:port behind different jumps are two machines with two host keys: known_hosts tells
    # them apart by this name, as OpenSSH's HostKeyAlias does.
    "host_key_alias": HostKey(str, check=_address, doc="the host's name in known_hosts, instead of [address]:port"),
    "repo": HostKey(str, "/root/ddtree", check=_repo, doc="the research checkout's path on the host"),
    "python": HostKey(str, "python3", doc="the interpreter the host's ddops agent runs on (Python >= 3.8)"),
    "groups": HostKey(list, (), check=_group_names, convert=tuple, in_groups=False, nullable=True,
                      doc="the groups the host is in (--group NAME selects them)"),
    "vars": HostKey(dict, {}, check=_var_names, convert=dict, nullable=True,
                    doc="values bench plans read ({name} in a plan's command)"),
    "repo_url": HostKey(str, check=_git_word, doc="where `ddops sync` gets the repo from"),
    "commit": HostKey(str, check=_git_word, doc="the commit (or branch, tag) `ddops sync` pins the repo to"),
    "sync": HostKey(str, "auto", choices=SYNC_MODES,
                    doc="push: the controller sends the commit (hosts that cannot reach the forge)"),
    "connect_timeout": HostKey((int, float), 10.0, check=_positive_seconds, convert=float,
                               doc="seconds to wait for SSH"),
    "command_timeout": HostKey((int, float), 120.0, check=_positive_seconds, convert=float,
                               doc="seconds a remote command may take"),
    # Seconds the host's agent stays on after a session to serve the next command without starting Python
    # (remote/README.md, "The resident agent"); 0: never.
    "agent_linger": HostKey((int, float), 300.0, check=_linger, convert=float,
                            doc="seconds the host's agent stays to serve the next command (0: never)"),
    # How `ddops bench` runs the plan here: `bare` (detached processes on this host) or `slurm` (one job array, the
    # host then being the cluster's login node: ddops/bench/slurm.py).
    "executor": HostKey(str, "bare", choices=EXECUTORS,
                        doc="slurm: the host is a cluster's login node, bench runs become one job array"),
    "slurm": HostKey(dict, None, check=_slurm, nullable=True,
                     doc="sbatch options for executor slurm ({partition: gpu, gpus_per_task: 1, ...})"),
}
HOST_KEYS: dict[str, type | tuple[type, ...]] = {k: spec.type for k, spec in HOST_SCHEMA.items()}
GROUP_KEYS = {k: spec for k, spec in HOST_SCHEMA.items() if spec.in_groups}
BUILTIN_DEFAULTS: dict[str, Any] = {k: spec.default for k, spec in HOST_SCHEMA.items() if spec.default is not None}
TOP_KEYS: dict[str, type | tuple[type, ...]] = {
    "defaults": dict,
    "known_hosts": str,
    "ssh_config": str,
    "patches": list,
    "bench": str,
    "playbook_dirs": list,
    "groups": dict,
    "hosts": dict,
}


def _default(key: str) -> Any:
    """Host's default for a schema key (mutable ones as a factory)."""
    value = HOST_SCHEMA[key].default
    return field(default_factory=dict, hash=False, compare=False) if isinstance(value, dict) else value


@dataclass(frozen=True, slots=True)
class Host:
    """One host, with every setting resolved (HOST_SCHEMA says what each means)."""

    name: str
    address: str
    port: int = _default("port")
    user: str = _default("user")
    identity_file: str | None = None
    proxy_jump: str | None = None
    host_key_alias: str | None = None
    repo: str = _default("repo")
    python: str = _default("python")
    groups: tuple[str, ...] = _default("groups")
    vars: Mapping[str, Any] = _default("vars")
    repo_url: str | None = None
    commit: str | None = None
    sync: str = _default("sync")
    connect_timeout: float = _default("connect_timeout")
    command_timeout: float = _default("command_timeout")
    agent_linger: float = _default("agent_linger")
    executor: str = _default("executor")
    slurm: SlurmOptions | None = None
    connection: str = _default("connection")
    # Not inventory keys: where the settings came from.
    # The host's UserKnownHostsFile from ssh_config, where the inventory names no known_hosts; None: the inventory's.
    known_hosts: str | None = None
    # `file:line: key.path` of the identity_file setting, for the error that names a missing key file.
    identity_origin: str | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        """`name (address)` or just the name when they are the same."""
        return self.name if self.name == self.address else f"{self.name} ({self.address})"

    @property
    def local(self) -> bool:
        """This machine (`connection: local`): reached through a local agent process, not SSH."""
        return self.connection == "local"


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
    # The bench plan `ddops bench` runs when none is named (None: it names none and runs nothing), and its file:line.
    bench: str | None = None
    bench_where: str = field(default="", compare=False)

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
    return Path(explicit or settings.INVENTORY.value() or DEFAULT_INVENTORY)


def load_inventory(path: str | os.PathLike[str], ssh_config: SshConfig | OpenSshConfig | None = None) -> Inventory:
    """Load and validate an inventory; every error is an InventoryError starting with `file:line:`."""
    doc = load_yaml_file(path, InventoryError)
    return parse_inventory(doc, ssh_config)


ADHOC_SOURCE = "-H"  # an ad-hoc inventory's "file" in its error messages


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
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in address)
        if name in hosts:
            name = f"{name}-{port or 22}"
        if name in hosts:
            raise UsageError(f"-H {part}: named twice")
        hosts[name] = {"address": address, **({"user": user} if user else {}), **({"port": port} if port else {})}
    if not hosts:
        raise UsageError("-H: no host given (expected [user@]host[:port], comma-separated)")
    return parse_inventory(YamlDoc(ADHOC_SOURCE, {"hosts": hosts}), ssh_config)


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
    _check_host_values(doc, ("defaults",), defaults, HOST_SCHEMA)

    group_settings = data.get("groups") or {}
    for gname, gvalues in group_settings.items():
        if not isinstance(gvalues, dict):
            raise _err(doc, ("groups", gname), f"must be a mapping, not {describe(gvalues)}")
        _check_host_values(doc, ("groups", gname), gvalues, GROUP_KEYS)

    folder = Path(doc.path).resolve().parent
    patches = data.get("patches") or []
    for i, p in enumerate(patches):
        if not isinstance(p, str) or not p:
            raise _err(doc, ("patches", i), f"must be a playbook name, not {describe(p)}")
    # A path in `patches:` is read against the inventory's folder, not the working directory.
    patches = [str(folder / Path(p).expanduser()) if looks_like_playbook_path(p) else p for p in patches]
    bench = data.get("bench")
    if bench is not None and not bench:
        raise _err(doc, ("bench",), "must name a bench plan")
    if bench and looks_like_playbook_path(bench):
        bench = str(folder / Path(bench).expanduser())
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
    addresses: dict[tuple[str, Any], str] = {}
    for name, values in raw_hosts.items():
        keypath = ("hosts", name)
        if not isinstance(name, str) or not _valid_name(name):
            raise _err(doc, keypath, "host names use letters, digits, '.', '_' and '-' only")
        if not name.strip("."):  # a host's files land in results/<run>/<host>/: '..' would be results/ itself
            raise _err(doc, keypath, f"'{name}' is not a host name (it names a directory: use letters or digits)")
        values = values if values is not None else {}
        if not isinstance(values, dict):
            raise _err(doc, keypath, f"must be a mapping, not {describe(values)}")
        _check_host_values(doc, keypath, values, HOST_SCHEMA)
        host = _resolve_host(name, values, defaults, group_settings, ssh_config, doc,
                             known_hosts_from_config="known_hosts" not in data)
        # One machine per key: a local repo, or an address:port as seen from the jump it is reached through
        # (10.0.0.5 behind bastion-a is not 10.0.0.5 behind bastion-b).
        key = ("local", host.repo) if host.local else (host.address, host.port, _jump_path(host.proxy_jump))
        if key in addresses:
            what = (f"same repo {host.repo} on this machine" if host.local
                    else f"same address {host.address}:{host.port}" + (f" behind {host.proxy_jump}" if host.proxy_jump
                                                                       else ""))
            raise _err(doc, keypath, f"{what} as host '{addresses[key]}'")
        twin = next((other for other in hosts if not other.local and (other.address, other.port) ==
                     (host.address, host.port) and (other.host_key_alias or None) == (host.host_key_alias or None)),
                    None)
        if twin is not None:
            raise _err(doc, keypath, f"same address {host.address}:{host.port} as host '{twin.name}' behind another "
                                     "jump: give each a `host_key_alias` (their host keys would share one known_hosts "
                                     "entry)")
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
        bench=bench or None,
        bench_where=doc.where(("bench",)) if bench else "",
    )


def _resolve_host(name: str, values: dict, defaults: dict, group_settings: dict,
                  ssh_config: SshConfig | OpenSshConfig, doc: YamlDoc, *,
                  known_hosts_from_config: bool = True) -> Host:
    groups = list((values["groups"] or []) if "groups" in values else (defaults.get("groups") or []))
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
    for key in ("user", "port", "identity_file", "proxy_jump", "host_key_alias"):
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
    fields = {key: _field_value(spec, merged.get(key)) for key, spec in HOST_SCHEMA.items()
              if key not in ("groups", "slurm")}
    return Host(
        name=name,
        **fields,
        groups=tuple(groups),
        # Precedence as for the other keys: the inventory's own `known_hosts` beats ssh_config's.
        known_hosts=from_config.get("known_hosts") if known_hosts_from_config else None,
        slurm=SlurmOptions.from_mapping(merged["slurm"]) if merged.get("executor") == "slurm" else None,
        identity_origin=_origin(doc, "identity_file", name, values, groups, group_settings, defaults),
    )


def _field_value(spec: HostKey, value: Any) -> Any:
    value = spec.default if value is None else value
    return spec.convert(value) if spec.convert is not None and value is not None else value


def _origin(doc: YamlDoc, key: str, name: str, values: dict, groups: list, group_settings: dict,
            defaults: dict) -> str | None:
    """`file:line: key.path` of the setting a host's `key` came from (its own, a group's, the defaults', or the
    host's line when ssh_config set it)."""
    if key in values:
        keypath: tuple = ("hosts", name, key)
    elif any(key in (group_settings.get(g) or {}) for g in groups):
        keypath = ("groups", next(g for g in groups if key in (group_settings.get(g) or {})), key)
    elif key in defaults:
        keypath = ("defaults", key)
    else:
        return f"{doc.where(('hosts', name))}: hosts.{name}: {key} (from ssh_config)"
    return f"{doc.where(keypath)}: {dotted(keypath)}"


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
        if not _is_type(value, expected):
            raise _err(doc, child, f"must be {type_name(expected)}, not {describe(value)}")


def _is_type(value: Any, expected: type | tuple[type, ...]) -> bool:
    """isinstance, where a bool is not a number (YAML's `yes` is no port)."""
    return isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, (int, float)))


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


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "._-" for c in name)


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

