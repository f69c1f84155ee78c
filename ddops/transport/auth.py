"""Which keys a connection offers, in OpenSSH's order: the ssh-agent's (its copy of the named key first; with
IdentitiesOnly only that copy), then the identity file, whose passphrase is asked once per run where a terminal can
answer."""

from __future__ import annotations

import base64
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass

import paramiko
from paramiko.auth_strategy import AuthFailure, AuthStrategy, InMemoryPrivateKey

from ddops.errors import InventoryError, UsageError
from ddops.inventory import Host, missing_identity_file

# What ssh offers when no IdentityFile is set (those that exist), after the agent's keys.
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")
PASSPHRASE_TRIES = 3  # as ssh asks

# Asked with a prompt, answers the passphrase; None (or an empty answer) gives up.
PassphrasePrompt = Callable[[str], "str | None"]


@dataclass(frozen=True, slots=True)
class KeyFile:
    """An identity file as this run uses it: its public key, and the private key where it could be read."""

    path: str  # as the inventory or ssh_config names it
    public_blob: bytes | None  # None: unknown (an encrypted PEM key without its .pub beside it)
    key: paramiko.PKey | None  # None: encrypted and not unlocked (the agent's copy signs instead)
    encrypted: bool = False
    problem: str | None = None  # why paramiko cannot read it (not a key, an unknown format)


def public_blob_of(path: str) -> bytes | None:
    """The public key of a private key file without decrypting it: from `path.pub`, or the OpenSSH format's header."""
    with suppress(OSError, IndexError, ValueError):
        with open(path + ".pub", encoding="ascii", errors="replace") as fh:
            return base64.b64decode(fh.read().split()[1])
    try:
        return _openssh_header(_read(path))[1]
    except (OSError, ValueError):
        return None


def is_encrypted(text: bytes) -> bool:
    """Whether a private key file needs a passphrase (OpenSSH format: its cipher; PEM: its headers)."""
    if b"BEGIN OPENSSH PRIVATE KEY" in text:
        try:
            return _openssh_header(text)[0] != b"none"
        except ValueError:
            return False
    return b"ENCRYPTED" in text.split(b"-----END", 1)[0]


def too_open(path: str) -> int | None:
    """The mode of a key file of ours that others may access (OpenSSH refuses it: UNPROTECTED PRIVATE KEY FILE)."""
    st = os.stat(path)
    return st.st_mode & 0o777 if st.st_uid == os.getuid() and st.st_mode & 0o077 else None


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(1 << 20)


def _openssh_header(text: bytes) -> tuple[bytes, bytes]:
    """(cipher name, public key blob) of an `openssh-key-v1` file, both stored unencrypted."""
    begin = b"-----BEGIN OPENSSH PRIVATE KEY-----"
    if begin not in text:
        raise ValueError("not an OpenSSH private key")
    body = text.split(begin, 1)[1].split(b"-----END", 1)[0]
    try:
        data = base64.b64decode(b"".join(body.split()))
    except (ValueError, TypeError):
        raise ValueError("not base64") from None
    magic = b"openssh-key-v1\0"
    if not data.startswith(magic):
        raise ValueError("not an openssh-key-v1 file")
    offset, fields = len(magic), []
    for _ in range(3):  # cipher, kdf name, kdf options
        value, offset = _string(data, offset)
        fields.append(value)
    if struct.unpack(">I", data[offset:offset + 4])[0] < 1:
        raise ValueError("no key in the file")
    blob, _ = _string(data, offset + 4)
    return fields[0], blob


def _string(data: bytes, offset: int) -> tuple[bytes, int]:
    if offset + 4 > len(data):
        raise ValueError("truncated")
    (size,) = struct.unpack(">I", data[offset:offset + 4])
    end = offset + 4 + size
    if end > len(data):
        raise ValueError("truncated")
    return data[offset + 4:end], end


class KeyRing:
    """The run's keys: the ssh-agent's (asked once), and each identity file read (and unlocked) once."""

    def __init__(self, *, ask_passphrase: PassphrasePrompt | None = None) -> None:
        self.ask_passphrase = ask_passphrase
        self._agent: paramiko.Agent | None = None
        self._agent_keys: tuple[paramiko.AgentKey, ...] | None = None
        self._files: dict[str, KeyFile | None] = {}
        self._lock = threading.RLock()  # one prompt at a time; every other thread waits for its answer

    def agent_keys(self) -> tuple[paramiko.AgentKey, ...]:
        """The keys $SSH_AUTH_SOCK's agent holds (none without an agent)."""
        with self._lock:
            if self._agent_keys is None:
                self._agent_keys = ()
                self._agent = _open_agent()
                if self._agent is not None:
                    self._agent_keys = tuple(self._agent.get_keys())
            return self._agent_keys

    def prepare(self, hosts: Iterable[Host]) -> None:
        """Read every identity file these hosts name, before any connection: a missing file is an inventory error,
        an encrypted one the agent lacks is unlocked now (one prompt per file), or refused in one line."""
        for host in hosts:
            self.identity_files(host)

    def identity_files(self, host: Host) -> list[KeyFile]:
        """The host's identity files as this run reads them (the defaults that exist, where it names none)."""
        if host.identity_file:
            return [self._named(host)]
        found = []
        for path in DEFAULT_IDENTITIES:
            if os.path.exists(os.path.expanduser(path)):
                key = self._key_file(path, optional=True)
                if key is not None:
                    found.append(key)
        return found

    def _named(self, host: Host) -> KeyFile:
        missing = missing_identity_file(host)
        if missing:
            raise InventoryError(missing)
        key = self._key_file(host.identity_file or "", optional=False)
        assert key is not None
        return key

    def _key_file(self, path: str, *, optional: bool) -> KeyFile | None:
        with self._lock:
            if path not in self._files:
                self._files[path] = self._read_key_file(path, optional=optional)
            return self._files[path]

    def _read_key_file(self, path: str, *, optional: bool) -> KeyFile | None:
        expanded = os.path.expanduser(path)
        try:
            text = _read(expanded)
            mode = too_open(expanded)
        except OSError as exc:
            if optional:
                return None
            raise UsageError(f"identity_file {path} cannot be read: {exc.strerror or exc}") from None
        blob = public_blob_of(expanded)
        if mode is not None:  # not read, as OpenSSH does not (the agent's copy may still sign)
            return KeyFile(path, blob, None, problem=f"UNPROTECTED PRIVATE KEY FILE: permissions {mode:04o} are too "
                                                    f"open: others may read it, and ddops, as OpenSSH, ignores such "
                                                    f"a key: chmod 600 {path}")
        if not is_encrypted(text):
            try:
                return KeyFile(path, blob, paramiko.PKey.from_path(expanded))
            except (paramiko.SSHException, ValueError, TypeError, OSError) as exc:
                # Not a key paramiko reads: that host fails alone (the run's other hosts go on).
                return KeyFile(path, blob, None, problem=str(exc) or type(exc).__name__)
        if blob is not None and any(k.asbytes() == blob for k in self.agent_keys()):
            return KeyFile(path, blob, None, encrypted=True)  # the agent's copy signs: no passphrase needed
        if self.ask_passphrase is None:
            if optional or (blob is None and self.agent_keys()):
                # Which agent key is its copy cannot be told (a PEM key without its .pub): the agent's keys are
                # offered and the failure, if any, says this file was not.
                return KeyFile(path, blob, None, encrypted=True)
            raise UsageError(f"identity_file {path} is encrypted and ssh-agent holds no copy of it: load it with "
                             f"`ssh-add {path}` (or run on a terminal, or with --ask-key-passphrase, to be asked "
                             "its passphrase)")
        for _ in range(PASSPHRASE_TRIES):
            answer = self.ask_passphrase(f"Enter passphrase for key '{path}': ")
            if not answer:
                break
            try:
                # cryptography takes the password as bytes (paramiko's annotation says str)
                key = paramiko.PKey.from_path(expanded, answer.encode())  # type: ignore[arg-type]
            except (paramiko.SSHException, ValueError, TypeError):
                continue
            return KeyFile(path, key.asbytes(), key, encrypted=True)
        raise UsageError(f"identity_file {path}: no correct passphrase given (or load it with `ssh-add {path}`)")

    def strategy(self, host: Host) -> OpenSshOrder:
        """The keys to offer `host`, with an agent connection of its own (one agent socket carries one request
        at a time: connections authenticating at once must not share it). Close it after connecting."""
        files = self.identity_files(host)
        agent = _open_agent() if self.agent_keys() else None
        return OpenSshOrder(host, tuple(agent.get_keys()) if agent is not None else (), files, agent)

    def close(self) -> None:
        with self._lock:
            if self._agent is not None:
                self._agent.close()
            self._agent, self._agent_keys = None, None


def _open_agent() -> paramiko.Agent | None:
    """A connection to $SSH_AUTH_SOCK's agent; None without one (or one that does not answer)."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return None
    try:
        return paramiko.Agent()
    except (paramiko.SSHException, OSError):
        return None


class OpenSshOrder(AuthStrategy):
    """The agent's copy of each identity file first, then the agent's other keys (not with identities_only), then the
    files it lacks."""

    def __init__(self, host: Host, agent_keys: tuple[paramiko.AgentKey, ...], files: list[KeyFile],
                 agent: paramiko.Agent | None = None) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())  # the inventory already applied the user's ssh_config
        self.host, self.agent_keys, self.files, self._agent = host, agent_keys, files, agent

    def close(self) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    def offers(self) -> list[tuple[str, paramiko.PKey]]:
        """(what it is, in the user's terms; the key) in the order they are offered."""
        named = {f.public_blob: f for f in self.files if f.public_blob is not None}
        first = [k for k in self.agent_keys if k.asbytes() in named]
        rest = [k for k in self.agent_keys if k.asbytes() not in named]
        offered: list[tuple[str, paramiko.PKey]] = [(f"ssh-agent's copy of {named[k.asbytes()].path}", k)
                                                    for k in first]
        if not self.host.identities_only:  # IdentitiesOnly: the agent's other keys stay unoffered, as with ssh
            offered += [(f"ssh-agent key {k.get_name()} {k.fingerprint}", k) for k in rest]
        in_agent = {k.asbytes() for k in self.agent_keys}
        offered += [(f"identity_file {f.path}", f.key) for f in self.files
                    if f.key is not None and f.key.asbytes() not in in_agent]
        return offered

    def get_sources(self) -> Iterator[InMemoryPrivateKey]:
        for _, key in self.offers():
            yield InMemoryPrivateKey(self.host.user, key)

    def failure(self, exc: BaseException) -> str:
        """One line: what was tried for this host, and what to set (the host itself is the error's to name)."""
        host = self.host
        who = f"{host.user}@{host.address}"
        tried = [what for what, _ in self.offers()]
        skipped = [f"identity_file {f.path} (encrypted, not in ssh-agent: `ssh-add {f.path}`)" for f in self.files
                   if f.key is None and f.encrypted and f.public_blob not in {k.asbytes() for k in self.agent_keys}]
        unusable = [f"identity_file {f.path} (not a usable private key)" for f in self.files if f.problem]
        if not tried:
            agent = ("identities_only: no key of the ssh-agent's is an identity_file's" if host.identities_only
                     and self.agent_keys else "ssh-agent holds no key" if os.environ.get("SSH_AUTH_SOCK")
                     else "no ssh-agent ($SSH_AUTH_SOCK unset)")
            files = ", ".join(skipped + unusable) or (
                "no identity_file set" if not host.identity_file else f"identity_file {host.identity_file}")
            return (f"no authentication method for {who}: {agent}, {files}; set `identity_file:` in "
                    "the inventory (or IdentityFile in ~/.ssh/config), or load a key with `ssh-add`")
        detail = "; not tried: " + ", ".join(skipped + unusable) if skipped or unusable else ""
        reason = "" if isinstance(exc, AuthFailure) else f" ({exc})"
        return f"authentication failed for {who}: the host accepted none of {', '.join(tried)}{detail}{reason}"
