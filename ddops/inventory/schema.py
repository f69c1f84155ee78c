"""The inventory's values: the Host schema (one table of keys, defaults and checks), `Host` and `Inventory`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddops.slurm_options import EXECUTORS, SLURM_KEYS, SlurmOptions, slurm_option_problems
from ddops.yamlsrc import describe, suggest, type_name

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
        if not isinstance(g, str) or not valid_name(g):
            yield (i,), "group names use letters, digits, '.', '_' and '-' only"


def _var_names(variables: dict) -> Iterator[tuple[tuple, str]]:
    for k in variables:
        if not isinstance(k, str):
            yield (k,), "variable names must be strings"


def _slurm(options: dict) -> Iterator[tuple[tuple, str]]:
    for key, value in options.items():
        if key not in SLURM_KEYS:
            yield (key,), f"unknown key{suggest(key, SLURM_KEYS)}"
        elif not is_type(value, SLURM_KEYS[key]):
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
    ssh_only: bool = False  # meaningless on a `connection: local` host (it runs here, as the user running ddops)
    doc: str = ""

    def problems(self, value: Any) -> Iterator[tuple[tuple, str]]:
        """What is wrong with a value of this key, as (key path below it, message)."""
        if value is None and self.nullable:
            return
        if not is_type(value, self.type):
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
    "address": HostKey(str, check=_address, in_groups=False, ssh_only=True,
                       doc="what to connect to (default: the host's name)"),
    "connection": HostKey(str, "ssh", choices=CONNECTIONS, doc="`local`: this machine, without sshd"),
    "port": HostKey(int, 22, check=_port, convert=int, ssh_only=True, doc="sshd's port"),
    "user": HostKey(str, "root", ssh_only=True, doc="the login user (not root: `exec --sudo` for root's commands)"),
    "identity_file": HostKey(str, doc="the private key (the ssh-agent's copy is used first)"),
    "proxy_jump": HostKey(str, ssh_only=True, doc="`a,b`: hops, as OpenSSH's ProxyJump; `none`: no jump"),
    "identities_only": HostKey(bool, False, doc="offer only identity_file (the ssh-agent's copy of it too), not "
                                                "every key the agent holds, as OpenSSH's IdentitiesOnly"),
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
SSH_ONLY_KEYS = tuple(k for k, spec in HOST_SCHEMA.items() if spec.ssh_only)
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
    # true in the checkout's example inventory: refused until edited, so that a command run there dials no 10.x host
    "example": bool,
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
    identities_only: bool = _default("identities_only")
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
        return tuple(dict.fromkeys(g for h in self.hosts for g in h.groups))


def is_type(value: Any, expected: type | tuple[type, ...]) -> bool:
    """isinstance, where a bool is not a number (YAML's `yes` is no port)."""
    return isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, (int, float)))


def valid_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "._-" for c in name)


def looks_like_playbook_path(name: str) -> bool:
    """A playbook or plan given as a path (`./mine.yaml`, `dir/x`) rather than a name looked up in folders."""
    return "/" in name or name.endswith((".yaml", ".yml")) or name.startswith((".", "~"))
