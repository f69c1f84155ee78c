"""Reading identity files without their passphrase: which are encrypted, and their public key (the agent's copy)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from ddops.errors import InventoryError, UsageError
from ddops.inventory import Host
from ddops.transport.auth import KeyRing, is_encrypted, public_blob_of


def keygen(path: Path, passphrase: str, *args: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path), *args], check=True)
    return path


def test_an_encrypted_openssh_key_gives_its_public_key_without_a_passphrase(tmp_path):
    key = keygen(tmp_path / "k", "secret")
    expected = base64.b64decode(Path(f"{key}.pub").read_text().split()[1])
    Path(f"{key}.pub").unlink()  # read from the private file's own header
    assert is_encrypted(key.read_bytes())
    assert public_blob_of(str(key)) == expected


@pytest.mark.parametrize("text", [b"this is not a key\n", b"-----BEGIN OPENSSH PRIVATE KEY-----\n!!\n-----END"])
def test_a_file_that_is_not_a_key_is_neither_encrypted_nor_has_a_public_key(tmp_path, text):
    path = tmp_path / "junk"
    path.write_bytes(text)
    assert not is_encrypted(text)
    assert public_blob_of(str(path)) is None


def test_an_encrypted_key_without_agent_or_terminal_is_refused_saying_ssh_add(tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = keygen(tmp_path / "k", "secret")
    with pytest.raises(UsageError, match=f"ssh-add {key}"):
        KeyRing().prepare([Host("h", "10.0.0.1", identity_file=str(key))])


def test_a_passphrase_is_asked_once_per_file_for_every_host(tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = keygen(tmp_path / "k", "secret")
    asked = []
    ring = KeyRing(ask_passphrase=lambda prompt: asked.append(prompt) or "secret")
    ring.prepare([Host(f"h{i}", f"10.0.0.{i}", identity_file=str(key)) for i in range(5)])
    assert len(asked) == 1
    assert ring.identity_files(Host("h9", "10.0.0.9", identity_file=str(key)))[0].key is not None


def test_a_missing_key_file_names_the_inventory_line_it_came_from(tmp_path):
    host = Host("h", "10.0.0.1", identity_file=str(tmp_path / "nope"),
                identity_origin="inv.yaml:4: hosts.h.identity_file")
    with pytest.raises(InventoryError, match=r"^inv.yaml:4: hosts.h.identity_file: .*nope does not exist$"):
        KeyRing().prepare([host])


def test_an_encrypted_key_whose_public_half_is_unknown_is_left_to_the_agents_keys(tmp_path, monkeypatch):
    """A PEM key without its .pub: which agent key is its copy cannot be told, so the agent is not refused."""
    import paramiko

    key = tmp_path / "pem"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "secret", "-f", str(key)],
                   check=True)
    Path(f"{key}.pub").unlink()
    assert public_blob_of(str(key)) is None and is_encrypted(key.read_bytes())
    ring = KeyRing()
    monkeypatch.setattr(ring, "agent_keys", lambda: (paramiko.Ed25519Key.from_private_key_file(
        str(keygen(tmp_path / "other", ""))),))
    (found,) = ring.identity_files(Host("h", "10.0.0.1", identity_file=str(key)))
    assert found.encrypted and found.key is None


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_private_key_others_may_read_is_refused_as_openssh_refuses_it(tmp_path, monkeypatch, mode):
    from ddops.errors import TransportError
    from ddops.transport import Connector

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = keygen(tmp_path / "k", "")
    key.chmod(mode)
    host = Host("h", "127.0.0.1", identity_file=str(key))
    [read] = KeyRing().identity_files(host)
    assert read.key is None and f"UNPROTECTED PRIVATE KEY FILE: permissions {mode:04o}" in (read.problem or "")
    with pytest.raises(TransportError) as caught:  # refused before anything connects
        Connector(str(tmp_path / "known_hosts")).connect(host)
    assert f"identity_file {key} is not a usable private key: UNPROTECTED PRIVATE KEY FILE" in str(caught.value)
    assert f"chmod 600 {key}" in str(caught.value)
    key.chmod(0o600)
    assert KeyRing().identity_files(host)[0].key is not None
