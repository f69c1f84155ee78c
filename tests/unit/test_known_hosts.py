"""known_hosts as the transport reads it: once per run, each host's entries parsed only when it connects."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from ddops.errors import HostKeyError
from ddops.inventory import Host
from ddops.transport.hostkeys import KnownHosts

HOST = Host(name="gpu1", address="10.0.0.7", port=2222)
NAME = "[10.0.0.7]:2222"


@pytest.fixture(scope="module")
def public_key(tmp_path_factory) -> str:
    """'ssh-ed25519 AAAA...' of a fresh key."""
    key = tmp_path_factory.mktemp("key") / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return " ".join(Path(f"{key}.pub").read_text().split()[:2])


def keys(path: Path, name: str = NAME) -> list[str]:
    return [key_type for key_type, _ in KnownHosts(path).keys_for(HOST, name)]


def test_plain_listed_and_hashed_names_match_as_in_openssh(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host(NAME)
    for line in (f"{NAME} {public_key}", f"other,{NAME} {public_key}", f"{hashed} {public_key}"):
        path.write_text(line + "\n")
        assert keys(path) == ["ssh-ed25519"], line


def test_other_hosts_entries_are_not_even_parsed(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    path.write_text(f"# comment\n10.0.0.8 ssh-ed25519 not-base64-at-all\n|1|%%%|x {public_key}\n\n"
                    f"{NAME} {public_key}\n10.0.0.7 {public_key}\n")
    assert keys(path) == ["ssh-ed25519"]
    assert keys(path, "[10.0.0.9]:2222") == []


def test_a_missing_file_knows_no_host(tmp_path):
    assert keys(tmp_path / "absent") == []


def test_a_damaged_entry_for_the_host_is_a_host_key_error_naming_file_and_host(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text(f"{NAME} ssh-ed25519 AAAAnot-a-key\n")
    with pytest.raises(HostKeyError, match=rf"gpu1: known_hosts {path} has a bad entry for \[10.0.0.7\]:2222"):
        keys(path)


def test_an_unreadable_file_is_a_host_key_error(tmp_path):
    with pytest.raises(HostKeyError, match="gpu1: cannot read known_hosts"):
        keys(tmp_path)  # a directory
