"""An inventory.yaml from the description a fleet already has: an Ansible inventory (INI or YAML) or ~/.ssh/config
Host blocks, and the commented starting file `ddops inventory init` writes.

Pure where it can be: the Ansible readers take text, the ssh_config reader takes a config resolved by OpenSSH
(ddops.sshconfig). Whatever has no ddops key is reported, never dropped silently. The caller writes the text and
loads it back with load_inventory before it replaces anything."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddops.errors import InventoryError, UsageError
from ddops.inventory import HOST_SCHEMA, SSH_ONLY_KEYS, TOP_KEYS, HostKey
from ddops.sshconfig import OpenSshConfig, SshConfig
from ddops.yamlsrc import YamlDoc

# Ansible's connection variables and the ddops key each one is (ansible_ssh_* are their older spellings).
ANSIBLE_KEYS = {
    "ansible_host": "address", "ansible_ssh_host": "address",
    "ansible_port": "port", "ansible_ssh_port": "port",
    "ansible_user": "user", "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "identity_file", "ansible_private_key_file": "identity_file",
    "ansible_python_interpreter": "python",
}
# Read for a ProxyJump (-J, -o ProxyJump=, or the `ProxyCommand ssh -W %h:%p bastion` idiom); the rest reported.
ANSIBLE_SSH_ARGS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::([0-9]+))?\]")
# Variables whose value is a secret (ansible_ssh_pass, ansible_become_password, a vault token...): named in what is
# reported, their value never shown nor written.
_SECRET = re.compile(r"pass|secret|token|credential|(^|_)key$", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z0-9._-]+")  # a ddops host or group name


@dataclass(slots=True)
class AnsibleGroup:
    """One Ansible group as read: its own hosts (with the vars given on their lines), vars and child groups."""

    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ImportedHost:
    name: str
    settings: Mapping[str, Any]
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Imported:
    """What an import found: hosts, group and default settings in ddops keys, and what it left out (with why)."""

    source: str
    hosts: tuple[ImportedHost, ...]
    groups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    not_imported: tuple[str, ...] = ()
    ssh_config: str | None = None  # the config file to name in the inventory (its ProxyJump aliases live there)


def import_ansible_file(path: Path) -> Imported:
    """An Ansible inventory file, INI or YAML (told apart by suffix, else by its first line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    if _is_yaml(path, text):
        from ddops.yamlsrc import load_yaml_file

        groups = parse_ansible_yaml(load_yaml_file(path, InventoryError))
    else:
        groups = parse_ansible_ini(text, str(path))
    return from_ansible(groups, str(path))


def _is_yaml(path: Path, text: str) -> bool:
    if path.suffix in (".yaml", ".yml", ".json"):
        return True
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith(
        ("#", ";"))), "")
    return first.endswith(":") and not first.startswith("[")


def import_ssh_config_file(config_file: Path, patterns: Iterable[str]) -> Imported:
    """The Host aliases of an ssh_config that match the patterns (globs, comma-separated too)."""
    from ddops.sshconfig import host_aliases, load_ssh_config

    config_path = config_file.expanduser()
    if not config_path.is_file():
        raise UsageError(f"--ssh-config-file {config_file}: no such file")
    default = config_path.resolve() == Path("~/.ssh/config").expanduser().resolve()
    return from_ssh_config(load_ssh_config(config_path), host_aliases(config_path),
                           [p.strip() for pattern in patterns for p in pattern.split(",")],
                           str(config_file), None if default else str(config_path.resolve()))


# --- Ansible, INI -------------------------------------------------------------------------------------------------


def parse_ansible_ini(text: str, path: str) -> dict[str, AnsibleGroup]:
    """An INI inventory's groups (`[g]`, `[g:vars]`, `[g:children]`); host patterns like `gpu[01:16]` expanded."""
    groups: dict[str, AnsibleGroup] = {"all": AnsibleGroup(), "ungrouped": AnsibleGroup()}
    section, kind = "ungrouped", "hosts"
    for number, raw in enumerate(text.split("\n"), start=1):  # lines as an editor numbers them
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        _refuse_control_characters(line, f"{path}:{number}")
        if line.startswith("["):
            if not line.endswith("]"):
                raise InventoryError(f"{path}:{number}: a section header must end with ']'")
            section, _, kind = line[1:-1].strip().partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise InventoryError(f"{path}:{number}: [{section}:{kind}]: the section kinds are :vars and "
                                     f":children")
            groups.setdefault(section, AnsibleGroup())
            continue
        group = groups[section]
        if kind == "children":
            groups.setdefault(line.split()[0], AnsibleGroup())
            group.children.append(line.split()[0])
        elif kind == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise InventoryError(f"{path}:{number}: [{section}:vars] lines are `name=value`")
            group.vars[key.strip()] = _ini_value(value.strip())
        else:
            try:
                words = shlex.split(line, comments=True)
            except ValueError as exc:
                raise InventoryError(f"{path}:{number}: {exc}") from None
            host_vars: dict[str, Any] = {}
            for word in words[1:]:
                key, sep, value = word.partition("=")
                if not sep:
                    raise InventoryError(f"{path}:{number}: '{word}': host variables are `name=value`")
                host_vars[key] = _ini_value(value)
            for name in expand_host_pattern(words[0], f"{path}:{number}"):
                name, port = _split_port(name)
                values = dict(host_vars)
                if port is not None:
                    values.setdefault("ansible_port", port)
                group.hosts.setdefault(name, {}).update(values)
    return groups


def _ini_value(text: str) -> Any:
    """As Ansible reads an INI value: a number where it is one, quotes removed."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    return text


def _split_port(name: str) -> tuple[str, int | None]:
    if name.count(":") == 1 and name.rsplit(":", 1)[1].isdigit():  # `host:2222` (not an IPv6 address)
        host, port = name.rsplit(":", 1)
        return host, int(port)
    return name, None


def expand_host_pattern(pattern: str, where: str) -> list[str]:
    """`gpu[01:03]` -> gpu01, gpu02, gpu03 (leading zeros kept); `[a:c]` letters; `[0:10:5]` a step."""
    match = _RANGE.search(pattern)
    if match is None:
        return [pattern]
    start, end, step = match.group(1), match.group(2), int(match.group(3) or 1)
    head, tail = pattern[:match.start()], pattern[match.end():]
    if start.isdigit() and end.isdigit():
        width = len(start) if start.startswith("0") else 0
        values = [str(i).zfill(width) for i in range(int(start), int(end) + 1, step)]
    elif len(start) == len(end) == 1 and start.isalpha() and end.isalpha():
        values = [chr(c) for c in range(ord(start), ord(end) + 1, step)]
    else:
        raise InventoryError(f"{where}: '{pattern}': a range is [NUMBER:NUMBER] or [letter:letter]")
    if not values:
        raise InventoryError(f"{where}: '{pattern}': the range is empty")
    return [name for value in values for name in expand_host_pattern(head + value + tail, where)]


# --- Ansible, YAML ------------------------------------------------------------------------------------------------


def parse_ansible_yaml(doc: YamlDoc) -> dict[str, AnsibleGroup]:
    """A YAML inventory (`all: {hosts:, vars:, children:}`, any group at the top) as groups."""
    data, path = doc.data, doc.path
    _refuse_control_characters_in(doc, data, ())
    if not isinstance(data, dict):
        raise InventoryError(f"{path}:1: an Ansible YAML inventory is a mapping of group names (`all:`)")
    groups: dict[str, AnsibleGroup] = {"all": AnsibleGroup(), "ungrouped": AnsibleGroup()}

    def read(name: str, body: Any, where: str) -> None:
        group = groups.setdefault(str(name), AnsibleGroup())
        if body is None:
            return
        if not isinstance(body, dict):
            raise InventoryError(f"{path}: {where}: a group is a mapping with hosts:, vars: and children:")
        unknown = set(body) - {"hosts", "vars", "children"}
        if unknown:
            raise InventoryError(f"{path}: {where}: unknown key {sorted(unknown)[0]!r} (a group has hosts:, vars: "
                                 f"and children:)")
        for pattern, host_vars in (body.get("hosts") or {}).items():
            if host_vars is not None and not isinstance(host_vars, dict):
                raise InventoryError(f"{path}: {where}.hosts.{pattern}: host variables are a mapping")
            for host in expand_host_pattern(str(pattern), f"{path}: {where}.hosts"):
                host, port = _split_port(host)
                values = dict(host_vars or {})
                if port is not None:
                    values.setdefault("ansible_port", port)
                group.hosts.setdefault(host, {}).update(values)
        if body.get("vars") is not None and not isinstance(body["vars"], dict):
            raise InventoryError(f"{path}: {where}.vars: a mapping of variables")
        group.vars.update(body.get("vars") or {})
        for child, child_body in (body.get("children") or {}).items():
            group.children.append(str(child))
            read(child, child_body, f"{where}.children.{child}")

    for name, body in data.items():
        read(name, body, str(name))
    return groups


def _refuse_control_characters_in(doc: YamlDoc, node: Any, keypath: tuple) -> None:
    """Every name and string in a YAML document, refused at its line when it holds a control character."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    if isinstance(node, str):
        _refuse_control_characters(node, doc.where(keypath))
    for key, value in items:
        if isinstance(key, str):
            _refuse_control_characters(key, doc.where(keypath + (key,)))
        _refuse_control_characters_in(doc, value, keypath + (key,))


def _refuse_control_characters(text: str, where: str) -> None:
    """An InventoryError at `where` when text holds a character that could end or rewrite a line where ddops writes
    or shows it (a C0 or C1 control but tab, a line or paragraph separator)."""
    bad = next((ch for ch in text if ch != "\t" and unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise InventoryError(f"{where}: a name or value holds a control character ({ascii(bad)[1:-1]}): refused "
                             "(what is imported is written into the inventory one line each); nothing written")


# --- Ansible groups -> ddops --------------------------------------------------------------------------------------


def from_ansible(groups: Mapping[str, AnsibleGroup], source: str) -> Imported:
    """ddops hosts, groups and defaults from Ansible groups; each host's groups most specific first, as ddops' first
    group wins where Ansible's child group beats its parent."""
    notes: list[str] = []
    parents: dict[str, list[str]] = {}
    for name, group in groups.items():
        for child in group.children:
            parents.setdefault(child, []).append(name)

    def ancestry(name: str, seen: tuple[str, ...] = ()) -> list[str]:
        out = []
        for parent in parents.get(name, []):
            if parent in seen or parent in ("all", "ungrouped"):
                continue
            out += [parent, *ancestry(parent, seen + (name,))]
        return out

    usable = {name for name in groups if name not in ("all", "ungrouped") and _NAME.fullmatch(name)}
    for name in groups:
        if name not in usable and name not in ("all", "ungrouped"):
            notes.append(f"group {name}: not imported (ddops group names use letters, digits, '.', '_' and '-')")
    host_groups: dict[str, list[str]] = {}
    host_vars: dict[str, dict[str, Any]] = {}
    for name, group in groups.items():
        for host, values in group.hosts.items():
            found = host_groups.setdefault(host, [])
            if name not in ("all", "ungrouped"):
                for g in [name, *ancestry(name)]:
                    if g not in found and g in usable:
                        found.append(g)
            host_vars.setdefault(host, {}).update(values)

    defaults = _ddops_settings(groups["all"].vars, "group all", notes) if "all" in groups else {}
    group_settings: dict[str, dict[str, Any]] = {}
    for name, group in groups.items():
        if name not in usable or not group.vars:
            continue
        settings = _ddops_settings(group.vars, f"group {name}", notes)
        if "address" in settings:
            notes.append(f"group {name}: ansible_host={settings.pop('address')} (a group has no address)")
        if settings:
            group_settings[name] = settings

    hosts: list[ImportedHost] = []
    for name, values in host_vars.items():
        if not _NAME.fullmatch(name) or not name.strip("."):
            notes.append(f"host {name}: not imported (ddops host names use letters, digits, '.', '_' and '-')")
            continue
        settings = _ddops_settings(values, f"host {name}", notes)
        layers = [settings, *(group_settings.get(g, {}) for g in host_groups.get(name, [])), defaults]
        if next((layer["connection"] for layer in layers if "connection" in layer), "ssh") == "local":
            _drop_ssh_only(settings, f"host {name}", notes)
        hosts.append(ImportedHost(name, settings, tuple(host_groups.get(name, []))))
    return Imported(source, _unique_addresses(hosts, notes), group_settings, defaults, tuple(notes))


def _ddops_settings(values: Mapping[str, Any], who: str, notes: list[str]) -> dict[str, Any]:
    """The ddops keys Ansible variables map onto; a note for each that has none."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if _SECRET.search(str(key)):
            notes.append(f"{who}: {key} (a secret: its value is neither shown nor written; ddops logs in with keys "
                         "and runs sudo without a password)")
        elif key in ANSIBLE_KEYS:
            target = ANSIBLE_KEYS[key]
            if target == "port":
                if isinstance(value, str) and value.isdigit():
                    value = int(value)
                if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
                    notes.append(f"{who}: {key}={value} (not a port number)")
                    continue
            elif not isinstance(value, str) or not value:
                notes.append(f"{who}: {key}={value!r} (not a string)")
                continue
            out[target] = value
        elif key in ("ansible_connection", "connection") and value in ("local", "ssh", "smart", "paramiko"):
            if value == "local":
                out["connection"] = "local"  # this machine (ddops: no sshd, the same agent)
        elif key in ANSIBLE_SSH_ARGS:
            jump, rest = proxy_jump_from_ssh_args(str(value))
            if jump:
                out["proxy_jump"] = jump
            if rest:
                notes.append(f"{who}: {key}: {' '.join(rest)} (no ddops key; ddops reads only a ProxyJump here)")
        else:
            notes.append(f"{who}: {key}={_shown(value)} (no ddops key)")
    if out.get("connection") == "local":
        _drop_ssh_only(out, who, notes)
    return out


def _drop_ssh_only(settings: dict[str, Any], who: str, notes: list[str]) -> None:
    """A `connection: local` host (or the group or defaults that make it one) takes no SSH setting: a note each."""
    for key in SSH_ONLY_KEYS:
        if key in settings:
            notes.append(f"{who}: {key} {json.dumps(settings.pop(key))} (connection: local runs on this machine, "
                         "as the user running ddops)")


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def proxy_jump_from_ssh_args(args: str) -> tuple[str | None, list[str]]:
    """The ProxyJump in ssh arguments (`-J b`, `-o ProxyJump=b`, `-o ProxyCommand="ssh -W %h:%p b"`) and the rest."""
    try:
        words = shlex.split(args)
    except ValueError:
        return None, [args]
    jump, rest, i = None, [], 0
    while i < len(words):
        word = words[i]
        option = None
        if word == "-J" and i + 1 < len(words):
            jump, i = words[i + 1], i + 2
            continue
        if word.startswith("-J") and len(word) > 2:
            jump, i = word[2:], i + 1
            continue
        if word == "-o" and i + 1 < len(words):
            option, i = words[i + 1], i + 2
        elif word.startswith("-o") and len(word) > 2:
            option, i = word[2:], i + 1
        else:
            rest.append(word)
            i += 1
            continue
        key, _, value = option.replace("=", " ", 1).partition(" ")
        if key.lower() == "proxyjump":
            jump = value.strip()
        elif key.lower() == "proxycommand" and _jump_from_proxy_command(value):
            jump = _jump_from_proxy_command(value)
        else:
            rest += ["-o", option]
    return jump, rest


def _jump_from_proxy_command(command: str) -> str | None:
    """`ssh -W %h:%p [-q] [-p PORT] [user@]bastion` is a ProxyJump; any other command is not."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or words[0] not in ("ssh", "/usr/bin/ssh") or "-W" not in words:
        return None
    port, target, i = None, None, 1
    while i < len(words):
        word = words[i]
        if word in ("-W", "-p", "-l"):
            if word == "-p" and i + 1 < len(words):
                port = words[i + 1]
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            target, i = word, i + 1
    if target is None:
        return None
    return f"{target}:{port}" if port else target


def _unique_addresses(hosts: list[ImportedHost], notes: list[str]) -> tuple[ImportedHost, ...]:
    """One host per address:port (ddops refuses two); an Ansible alias of a host already listed is reported."""
    seen: dict[tuple[str, Any], str] = {}
    out = []
    for host in hosts:
        key = (str(host.settings.get("address", host.name)), host.settings.get("port"))
        if key in seen:
            notes.append(f"host {host.name}: not imported (same address as {seen[key]})")
            continue
        seen[key] = host.name
        out.append(host)
    return tuple(out)


# --- ssh_config ---------------------------------------------------------------------------------------------------


def from_ssh_config(config: SshConfig | OpenSshConfig, aliases: Iterable[str], patterns: Iterable[str],
                    source: str, config_path: str | None) -> Imported:
    """Hosts from the config's Host aliases that match patterns, each resolved as `ssh -G` resolves it."""
    wanted = [p for p in patterns if p]
    chosen = [a for a in aliases if any(fnmatch.fnmatchcase(a, p) for p in wanted)]
    if not chosen:
        raise InventoryError(f"{source}: no Host block matches {' '.join(wanted)} (its hosts: "
                             f"{', '.join(sorted(aliases)) or 'none'})")
    config.prefetch(chosen)
    notes: list[str] = []
    hosts = []
    for alias in chosen:
        if not _NAME.fullmatch(alias):
            notes.append(f"host {alias}: not imported (ddops host names use letters, digits, '.', '_' and '-')")
            continue
        found = config.lookup(alias)
        for key, value in found.items():
            _refuse_control_characters(value, f"{source}: Host {alias}: {key}")
        settings: dict[str, Any] = {"address": found.get("hostname", alias)}
        if "port" in found:
            settings["port"] = int(found["port"]) if found["port"].isdigit() else found["port"]
        for key in ("user", "identity_file", "proxy_jump"):
            if key in found:
                settings[key] = found[key]
        if "known_hosts" in found:
            notes.append(f"host {alias}: UserKnownHostsFile {found['known_hosts']} (ddops reads it from the "
                         f"ssh_config the inventory names)")
        hosts.append(ImportedHost(alias, settings))
    return Imported(source, _unique_addresses(hosts, notes), not_imported=tuple(notes), ssh_config=config_path)


# --- writing ------------------------------------------------------------------------------------------------------


def render_inventory(imported: Imported, header: str) -> str:
    """The inventory.yaml text: flow mappings per host (as `testbed up` writes them), what was left out as comments.
    Every imported name and value is written as a JSON string (a YAML one too), so none can end its line and add a
    key; a comment is one line whatever its note holds."""
    lines = [_comment(line) for line in header.splitlines()]
    if imported.not_imported:
        lines.append("# Not imported (no ddops key; set them by hand where they matter):")
        lines += [_comment(f"  {note}") for note in imported.not_imported]
    lines.append("defaults:")
    for key, value in imported.defaults.items():
        lines.append(f"  {key}: {json.dumps(value)}")
    if "repo" not in imported.defaults:
        lines.append("  # repo: /root/ddtree   # where the research checkout is on every host (the default)")
    if imported.ssh_config:
        lines.append(f"ssh_config: {json.dumps(imported.ssh_config)}")
    if imported.groups:
        lines.append("groups:")
        for name, settings in imported.groups.items():
            lines.append(f"  {json.dumps(name)}: {_flow(settings)}")
    lines.append("hosts:")
    for host in imported.hosts:
        settings = dict(host.settings)
        if host.groups:
            settings["groups"] = list(host.groups)
        lines.append(f"  {json.dumps(host.name)}: {_flow(settings)}")
    return "\n".join(lines) + "\n"


def _flow(settings: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in settings.items()) + "}"


def _comment(text: str) -> str:
    """`# text` on one line: what could end it (YAML breaks lines at \\x85 and U+2028 too) is written escaped."""
    return f"# {text if text.isprintable() else json.dumps(text)[1:-1]}".rstrip()


# What `ddops inventory init` writes: every key commented (a host's from HOST_SCHEMA), one example host so that
# `inventory check` passes.
TOP_NOTES = {
    "defaults": "settings every host gets unless its groups or itself say otherwise",
    "known_hosts": "host keys are checked against this file (--accept-new records unknown ones)",
    "ssh_config": "read as `ssh -G` reads it (default ~/.ssh/config)",
    "patches": "playbooks `ddops patch` applies when none is named (names, or paths next to this file)",
    "bench": "the bench plan `ddops bench --all` runs when none is named (none: it runs nothing)",
    "playbook_dirs": "your own playbooks and bench plans (folders next to this file), searched before the built-ins",
    "groups": "settings per group",
    "hosts": "every host by name",
}


def _key_doc(spec: HostKey) -> str:
    """What a key means, its choices and its default, as the starter file's comment."""
    parts = [spec.doc] if spec.doc else []
    if spec.choices:
        parts.append(" | ".join(spec.choices))
    if spec.default not in (None, (), {}):
        parts.append(f"default {spec.default}")
    return "; ".join(parts)


def starter_inventory() -> str:
    """The commented starting inventory; every key a host and the file may carry is named in it."""
    width = max(len(k) for k in HOST_SCHEMA) + 2
    host_keys = "\n".join(f"#   {k + ':':<{width}} {_key_doc(spec)}".rstrip() for k, spec in HOST_SCHEMA.items())
    top_keys = "\n".join(f"#   {k + ':':<15} {TOP_NOTES.get(k, '')}".rstrip() for k in TOP_KEYS)
    return f"""# ddops inventory (written by `ddops inventory init`; check it with `ddops inventory check`).
# Top-level keys:
{top_keys}
# Keys of a host (each may also sit in `defaults:` or `groups.<name>:`; precedence: host > groups > ssh_config >
# defaults):
{host_keys}
# `ddops inventory import --ansible FILE` or `--ssh-config 'gpu-*'` writes one from what you already have.
defaults:
  user: root
  port: 22
  repo: /root/ddtree
  # identity_file: ~/.ssh/id_ed25519
known_hosts: ~/.ssh/known_hosts
# playbook_dirs: [playbooks]
patches: [hybrid-cache]
# groups:
#   h200: {{user: ubuntu}}
hosts:
  # Replace this example with your hosts:
  gpu-1: {{address: 192.0.2.10, groups: [h200]}}
  # gpu-2: {{address: 192.0.2.11, port: 2222, proxy_jump: bastion, groups: [h200]}}
  # login: {{address: login.cluster.example, executor: slurm, slurm: {{partition: gpu}}}}
"""
