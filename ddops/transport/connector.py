"""Opening Sessions: host keys checked, identity read once, TCP tuned, ProxyJump chains through shared hop sessions."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import paramiko

from ddops.errors import HostKeyError, TransportError
from ddops.inventory import Host
from ddops.sshconfig import jump_hops, split_hop
from ddops.transport.auth import KeyRing, OpenSshOrder, PassphrasePrompt
from ddops.transport.hostkeys import (HostKeyPolicy, KnownHosts, host_key_name, known_hosts_name, revoked_message,
                                      system_known_hosts)
from ddops.transport.local import LocalSession
from ddops.transport.resident import ResidentBook
from ddops.transport.session import Session
from ddops.transport.sockets import tcp_connect


class Connector:
    """Opens Sessions: verifies host keys, honours ProxyJump chains through inventory hosts, sets TCP_NODELAY."""

    def __init__(self, known_hosts: str | os.PathLike[str], *, accept_new: bool = False,
                 jump_hosts: Iterable[Host] = (), connect_timeout: float | None = None,
                 residents: ResidentBook | None = None,
                 system_known_hosts_file: str | os.PathLike[str] | None = None,
                 ask_passphrase: PassphrasePrompt | None = None) -> None:
        self.known_hosts = Path(os.path.expanduser(str(known_hosts)))
        # Read after the user's file, as OpenSSH does; never written to. Tests pass their own.
        system = Path(system_known_hosts_file) if system_known_hosts_file is not None else system_known_hosts()
        self.system_known_hosts = KnownHosts(system, optional=True)
        self.accept_new = accept_new
        self.connect_timeout = connect_timeout
        self.residents = residents if residents is not None else ResidentBook()
        self._known: dict[Path, KnownHosts] = {self.known_hosts: KnownHosts(self.known_hosts)}
        self.keys = KeyRing(ask_passphrase=ask_passphrase)
        self._keys_lock = threading.Lock()
        self._jump_hosts = {h.name: h for h in jump_hosts}
        # "a" is the session to hop a, "a,b" the one to b reached through a: every host of the run that jumps
        # the same way shares them.
        self._jumps: dict[str, Session] = {}
        self._jump_lock = threading.RLock()  # held while a hop connects, which may connect the hops before it

    def connect(self, host: Host) -> Session | LocalSession:
        if host.local:  # `connection: local`: this machine, the same agent as a local process
            return LocalSession(host)
        return self._connect(host, ())

    def prepare(self, hosts: Iterable[Host]) -> None:
        """Read the identity files of these hosts and of the hops they jump through, before any connection: a missing
        one is an InventoryError, an encrypted one is unlocked now (one prompt per file) or refused in one line."""
        hosts = [h for h in hosts if not h.local]
        hops = [self._hop_host(hop, h) for h in hosts for hop in jump_hops(h.proxy_jump)]
        self.keys.prepare([*hosts, *hops])

    def _connect(self, host: Host, via: tuple[str, ...]) -> Session:
        """A session to `host`; `via` names the hosts whose connection is waiting on this one (loop guard)."""
        started = time.monotonic()
        timeout = self.connect_timeout or host.connect_timeout
        # Keys first: a missing or locked identity file is said before anything connects.
        auth = self.keys.strategy(host)
        try:
            unusable = [f for f in auth.files if f.problem]
            if host.identity_file and unusable and not auth.offers():
                raise TransportError(f"identity_file {host.identity_file} is not a usable private "
                                     f"key: {unusable[0].problem}", host=host.name)
            return self._connect_with(host, via, auth, started, timeout)
        finally:
            auth.close()

    def _connect_with(self, host: Host, via: tuple[str, ...], auth: OpenSshOrder, started: float,
                      timeout: float) -> Session:
        sock = self._open_socket(host, timeout, via)
        client = paramiko.SSHClient()
        name = host_key_name(host)
        known = self._known_hosts(host)
        try:
            entries = known.entries_for(host, name) + self.system_known_hosts.entries_for(host, name)
        except HostKeyError:
            sock.close()
            raise
        for key_type, key in entries.usable():  # under the name paramiko looks up, whatever known_hosts calls it
            client.get_host_keys().add(known_hosts_name(host.address, host.port), key_type, key)
        client.set_missing_host_key_policy(HostKeyPolicy(host, known.path, self.accept_new, entries))
        try:
            client.connect(
                host.address, port=host.port, username=host.user, auth_strategy=auth, sock=sock, timeout=timeout,
                banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
            )
        except paramiko.BadHostKeyException as exc:
            sock.close()
            revoked = entries.revocation(exc.key)
            if revoked is not None:
                raise HostKeyError(revoked_message(exc.hostname, exc.key, revoked), host=host.name) from None
            raise HostKeyError(
                f"host key CHANGED for {exc.hostname} (got {exc.key.get_name()}); refusing to connect. "
                f"If the host was reinstalled, remove the old key with: ssh-keygen -f {known.path} "
                f"-R '{name}'", host=host.name) from None
        except HostKeyError:
            sock.close()
            raise
        except paramiko.AuthenticationException as exc:
            sock.close()
            raise TransportError(auth.failure(exc), host=host.name) from None
        except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
            sock.close()
            raise TransportError(_handshake_failure(host, timeout, exc), host=host.name) from None
        transport = client.get_transport()
        assert transport is not None  # connect() returned: the transport is up
        transport.set_keepalive(15)
        return Session(host, client, time.monotonic() - started, self.residents)

    def _known_hosts(self, host: Host) -> KnownHosts:
        """The host's known_hosts (ssh_config's UserKnownHostsFile for it, else the inventory's), read once per run."""
        path = Path(os.path.expanduser(host.known_hosts)) if host.known_hosts else self.known_hosts
        with self._keys_lock:
            if path not in self._known:
                self._known[path] = KnownHosts(path)
            return self._known[path]

    def _open_socket(self, host: Host, timeout: float, via: tuple[str, ...]) -> Any:
        hops = jump_hops(host.proxy_jump)
        if not hops:
            return tcp_connect(host, timeout)
        jump = self._jump_session(tuple(hops), host, (*via, host.name))
        try:
            if jump.transport is None or not jump.transport.is_active():
                raise paramiko.SSHException("its connection is closed")
            return jump.transport.open_channel(
                "direct-tcpip", (host.address, host.port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.SSHException, OSError) as exc:
            raise TransportError(f"jump host {jump.host.name} cannot reach "
                                 f"{host.address}:{host.port}: {exc or type(exc).__name__}", host=host.name) from None

    def _jump_session(self, hops: tuple[str, ...], for_host: Host, via: tuple[str, ...]) -> Session:
        """The session to the last of `hops`, reached through the ones before it, as OpenSSH's `-J a,b,c` does."""
        key = ",".join(hops)
        with self._jump_lock:
            if key in self._jumps:
                return self._jumps[key]
            hop = self._hop_host(hops[-1], for_host)
            if hop.name in via:
                raise TransportError(f"ProxyJump loop: {' -> '.join((*via, hop.name))}", host=via[0])
            if len(hops) > 1:  # the chain decides how this hop is reached, not the hop's own proxy_jump
                hop = replace(hop, proxy_jump=",".join(hops[:-1]))
            session = self._connect(hop, via)
            self._jumps[key] = session
            return session

    def _hop_host(self, spec: str, for_host: Host) -> Host:
        """A hop as a Host: an inventory host (or ssh_config alias the inventory resolved) by name, with the user and
        port the spec gives; otherwise [user@]address[:port] with the target's identity and timeout."""
        if spec in self._jump_hosts:
            return self._jump_hosts[spec]
        user, name, port = split_hop(spec)
        known = self._jump_hosts.get(name)
        if known is not None:
            return replace(known, name=spec, user=user or known.user, port=port or known.port)
        return Host(name=spec, address=name, port=port or 22, user=user or for_host.user,
                    identity_file=for_host.identity_file, identity_origin=for_host.identity_origin,
                    identities_only=for_host.identities_only, connect_timeout=for_host.connect_timeout)

    def close(self) -> None:
        with self._jump_lock:
            # The last hop of a chain first: its connection runs inside the one to the hop before it.
            for key in sorted(self._jumps, key=lambda k: -k.count(",")):
                self._jumps[key].close()
            self._jumps.clear()
        self.keys.close()
        self.residents.save()


def _handshake_failure(host: Host, timeout: float, exc: BaseException) -> str:
    """One line saying what went wrong while opening the SSH session, in the user's terms."""
    text = str(exc) or type(exc).__name__
    where = f"{host.address}:{host.port}"
    # A listener that never sends the SSH banner makes paramiko give up with one of these.
    if "banner" in text.lower() or text == "No existing session" or isinstance(exc, (EOFError, socket.timeout)):
        return f"{where} accepted the connection but did not speak SSH within {timeout:g}s"
    return f"SSH handshake with {where} failed: {text}"
