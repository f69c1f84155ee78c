"""Fabric Connections built from the ddops inventory, with ddops' host-key policy (see ddops.fabric).

Here rather than in ddops/fabric.py because paramiko (which Fabric wraps) is imported only under ddops/transport/."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ddops.errors import HostKeyError, UsageError
from ddops.inventory import Host, Inventory
from ddops.transport.hostkeys import (HostKeyEntries, KnownHosts, host_key_name, known_hosts_name, revoked_message,
                                      system_known_hosts)

try:
    import fabric
    import paramiko
except ImportError as exc:  # fabric is an optional extra: say how to get it
    raise ImportError(f"ddops.fabric needs Fabric: pip install 'ddops[fabric]' ({exc})") from exc


class RefuseUnknownHostKey(paramiko.MissingHostKeyPolicy):
    """ddops' policy in Fabric: a key not in the inventory's known_hosts is refused, never added (Fabric's default
    is paramiko's AutoAddPolicy). A changed key is refused by paramiko itself (BadHostKeyException)."""

    def __init__(self, host: Host, known_hosts: str, entries: HostKeyEntries = HostKeyEntries()) -> None:
        self.host, self.known_hosts, self.entries = host, known_hosts, entries

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        revoked = self.entries.revocation(key)
        if revoked is not None:
            raise HostKeyError(revoked_message(hostname, key, revoked), host=self.host.name)
        raise HostKeyError(f"unknown host key {key.get_name()} {key.fingerprint} for {hostname} "
                           f"(not in {self.known_hosts}); check it, then record it with "
                           f"`ddops --accept-new ping --host {self.host.name}`", host=self.host.name)


def connection(inventory: Inventory, host: Host, *, config: Any = None) -> Any:
    """A fabric.Connection to one inventory host: its address, port, user, identity and jump host, and
    host keys checked against the inventory's known_hosts only."""
    known_hosts = os.path.expanduser(str(inventory.known_hosts))
    if config is None:
        # An empty SSH config: the inventory has already applied ~/.ssh/config (or the file it names), and
        # Fabric reading it again could pick a different user, port or proxy for the same host.
        config = fabric.Config(ssh_config=paramiko.SSHConfig())
    gateway: Any = False  # False, not None: None lets Fabric look a ProxyJump up in its own SSH config
    if host.proxy_jump:
        # A gateway Connection of its own per host: a ThreadingGroup opens its members in parallel, and Fabric
        # would open one shared gateway from several threads at once.
        gateway = connection(inventory, _jump_host(inventory, host), config=config)
    identity = os.path.expanduser(host.identity_file) if host.identity_file else None
    conn = fabric.Connection(
        host.address, user=host.user, port=host.port, config=config, gateway=gateway,
        connect_timeout=max(1, round(host.connect_timeout)),
        connect_kwargs={"key_filename": [identity] if identity else None, "look_for_keys": identity is None},
    )
    # ddops' reading of known_hosts (paramiko's skips @revoked lines, so a revoked key listed plainly was trusted).
    name = host_key_name(host)
    entries = (KnownHosts(Path(known_hosts)).entries_for(host, name)
               + KnownHosts(system_known_hosts(), optional=True).entries_for(host, name))
    keys = conn.client.get_host_keys()
    for key_type, key in entries.usable():  # under the name paramiko looks up, whatever known_hosts calls it
        keys.add(known_hosts_name(host.address, host.port), key_type, key)
    conn.client.set_missing_host_key_policy(RefuseUnknownHostKey(host, known_hosts, entries))
    return conn


def connections(inventory: Inventory, hosts: Iterable[Host]) -> list[Any]:
    config = fabric.Config(ssh_config=paramiko.SSHConfig())
    return [connection(inventory, h, config=config) for h in hosts]


def threading_group(inventory: Inventory, hosts: Sequence[Host]) -> Any:
    """A fabric.ThreadingGroup of the hosts' Connections (`.run` on all at once, a GroupResult per host)."""
    return fabric.ThreadingGroup.from_connections(connections(inventory, hosts))


def _jump_host(inventory: Inventory, host: Host) -> Host:
    hops = [h.strip() for h in (host.proxy_jump or "").split(",") if h.strip()]
    if len(hops) != 1:
        raise UsageError(f"{host.name}: only one ProxyJump hop is supported, got {host.proxy_jump!r}")
    for candidate in inventory.hosts:
        if candidate.name == hops[0]:
            return candidate
    # [user@]address[:port], as ssh's ProxyJump takes it; the rest as the host itself.
    user, _, rest = hops[0].rpartition("@")
    address, _, port = rest.partition(":")
    return Host(name=hops[0], address=address, port=int(port) if port.isdigit() else 22, user=user or host.user,
                identity_file=host.identity_file, connect_timeout=host.connect_timeout)
