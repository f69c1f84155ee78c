"""known_hosts as the transport reads it: once per run, each host's entries parsed only when it connects."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import paramiko
import pytest

from ddops.errors import HostKeyError
from ddops.inventory import Host
from ddops.transport.hostkeys import HostKeyPolicy, KnownHosts, append_known_host, names_match

HOST = Host(name="gpu1", address="10.0.0.7", port=2222)
NAME = "[10.0.0.7]:2222"


@pytest.fixture(scope="module")
def public_key(tmp_path_factory) -> str:
    """'ssh-ed25519 AAAA...' of a fresh key."""
    key = tmp_path_factory.mktemp("key") / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return " ".join(Path(f"{key}.pub").read_text().split()[:2])


def keys(path: Path, name: str = NAME) -> list[str]:
    return [key_type for key_type, _ in KnownHosts(path).entries_for(HOST, name).trusted]


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


def parsed_key(public_key: str) -> paramiko.PKey:
    kind, blob = public_key.split()
    return paramiko.PKey.from_type_string(kind, base64.b64decode(blob))


def test_a_revoked_key_is_not_usable_even_where_a_plain_line_lists_it(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    path.write_text(f"{NAME} {public_key}\n@revoked * {public_key}\n")
    entries = KnownHosts(path).entries_for(HOST, NAME)
    assert [kind for kind, _ in entries.trusted] == ["ssh-ed25519"]
    assert entries.usable() == []
    assert entries.revocation(parsed_key(public_key)) == f"{path}:2"


def test_wildcards_and_negations_match_as_in_openssh():
    assert names_match("*", NAME) and names_match("[10.0.0.?]:2222", NAME) and names_match("[10.0.0.7]:*", NAME)
    assert names_match("10.0.0.*", "10.0.0.7") and not names_match("10.0.0.*", NAME)
    assert not names_match("*,![10.0.0.7]:2222", NAME) and names_match("*,![10.0.0.8]:2222", NAME)
    assert names_match("GPU1.Example", "gpu1.example")  # host names are matched without case, as ssh does


def test_cert_authority_lines_are_reported_for_the_hosts_they_cover(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    path.write_text(f"@cert-authority [10.0.0.*]:2222 {public_key}\n@cert-authority other {public_key}\n")
    assert KnownHosts(path).entries_for(HOST, NAME).authorities == (f"{path}:1",)
    assert KnownHosts(path).entries_for(HOST, "other").authorities == (f"{path}:2",)


def test_an_unknown_marker_on_the_hosts_line_is_a_host_key_error(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    path.write_text(f"@revokd {NAME} {public_key}\n")
    with pytest.raises(HostKeyError, match=rf"gpu1: known_hosts {path}:1: unknown marker @revokd"):
        KnownHosts(path).entries_for(HOST, NAME)


def test_an_unreadable_system_file_counts_as_empty(tmp_path):
    assert KnownHosts(tmp_path, optional=True).entries_for(HOST, NAME).usable() == []


def test_accept_new_never_records_a_revoked_key(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    path.write_text(f"@revoked {NAME} {public_key}\n")
    policy = HostKeyPolicy(HOST, path, accept_new=True, entries=KnownHosts(path).entries_for(HOST, NAME))
    with pytest.raises(HostKeyError, match=rf"gpu1: host key ssh-ed25519 .* is REVOKED \({path}:1\)"):
        policy.missing_host_key(paramiko.SSHClient(), NAME, parsed_key(public_key))
    assert path.read_text() == f"@revoked {NAME} {public_key}\n"


def test_a_host_a_certificate_authority_vouches_for_is_refused_with_what_to_do(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    path.write_text(f"@cert-authority * {public_key}\n")
    policy = HostKeyPolicy(HOST, path, accept_new=True, entries=KnownHosts(path).entries_for(HOST, NAME))
    with pytest.raises(HostKeyError, match=rf"{path}:1 trusts a certificate authority .* cannot check host "
                                           rf"certificates.*ssh-keyscan -p 2222 10.0.0.7"):
        policy.missing_host_key(paramiko.SSHClient(), NAME, parsed_key(public_key))
    assert len(path.read_text().splitlines()) == 1


def test_recording_a_key_after_a_last_line_without_newline_keeps_that_line_whole(tmp_path, public_key):
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.8 {public_key}")  # edited by hand, no final newline
    append_known_host(path, NAME, parsed_key(public_key))
    assert path.read_text() == f"10.0.0.8 {public_key}\n{NAME} {public_key}\n"
    assert keys(path, "10.0.0.8") == keys(path) == ["ssh-ed25519"]


def test_a_host_finds_its_entries_among_thousands_in_file_order_with_patterns_still_tried(tmp_path, public_key,
                                                                                        monkeypatch):
    from ddops.transport import hostkeys

    path = tmp_path / "known_hosts"
    others = [f"10.1.{i // 250}.{i % 250} {public_key}" for i in range(5000)]
    revoked = f"@revoked {NAME.upper()} {public_key}"  # names match without regard to case
    path.write_text("\n".join([f"10.0.0.* {public_key}", *others, f"{NAME} {public_key}", revoked,
                               f"*,!{NAME} {public_key}"]) + "\n")
    known = KnownHosts(path)
    seen = []
    matcher = hostkeys.names_match

    def counting(patterns: str, name: str) -> bool:
        seen.append(patterns)
        return matcher(patterns, name)

    monkeypatch.setattr(hostkeys, "names_match", counting)
    entries = known.entries_for(HOST, NAME)
    monkeypatch.undo()
    # Its own two lines and the two pattern lines, in file order; none of the 5000 other hosts' lines.
    assert seen == ["10.0.0.*", NAME, NAME.upper(), f"*,!{NAME}"]
    assert [k for k, _ in entries.trusted] == ["ssh-ed25519"] and entries.revoked[0][1] == f"{path}:5003"
    assert [k for k, _ in known.entries_for(HOST, "10.1.3.7").trusted] == ["ssh-ed25519"] * 2  # its line and `*`
