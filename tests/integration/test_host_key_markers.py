"""known_hosts markers and the system-wide file, against real sshd hosts: a revoked key never gets a session."""

from __future__ import annotations

import pytest

from ddops.errors import HostKeyError
from ddops.inventory import load_inventory
from ddops.transport import Connector
from tests.conftest import requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]


def host_line(bed) -> tuple[str, str]:
    """(known_hosts name, 'type base64') of the testbed's one host."""
    name, kind, blob = bed.known_hosts.read_text().split()[:3]
    return name, f"{kind} {blob}"


def test_a_revoked_host_key_is_refused_even_where_a_plain_line_trusts_it(make_testbed):
    bed = make_testbed(1)
    name, key = host_line(bed)
    bed.known_hosts.write_text(f"{name} {key}\n@revoked * {key}\n")
    inv = load_inventory(bed.inventory_path)
    with pytest.raises(HostKeyError, match=rf"host1: host key ssh-ed25519 .* is REVOKED \({bed.known_hosts}:2\)"):
        Connector(inv.known_hosts).connect(inv.hosts[0])


def test_accept_new_does_not_record_a_revoked_key(make_testbed):
    bed = make_testbed(1)
    name, key = host_line(bed)
    bed.known_hosts.write_text(f"@revoked {name} {key}")  # no final newline either
    proc = run_ddops("--accept-new", "ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 1
    assert "is REVOKED" in proc.stdout + proc.stderr
    assert bed.known_hosts.read_text() == f"@revoked {name} {key}"


def test_a_host_vouched_for_by_a_certificate_authority_is_refused_with_a_clear_message(make_testbed):
    bed = make_testbed(1)
    _, key = host_line(bed)
    bed.known_hosts.write_text(f"@cert-authority * {key}\n")
    proc = run_ddops("--accept-new", "ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 1
    assert "trusts a certificate authority" in proc.stdout + proc.stderr
    assert "cannot check host certificates" in proc.stdout + proc.stderr
    assert bed.known_hosts.read_text() == f"@cert-authority * {key}\n"


def test_the_system_known_hosts_is_read_after_the_users(make_testbed, tmp_path):
    bed = make_testbed(1)
    name, key = host_line(bed)
    system = tmp_path / "ssh_known_hosts"
    system.write_text(f"{name} {key}\n")
    bed.known_hosts.write_text("")
    inv = load_inventory(bed.inventory_path)
    with Connector(inv.known_hosts, system_known_hosts_file=system).connect(inv.hosts[0]) as session:
        assert session.run("echo hi").stdout.strip() == "hi"
    # ... and what it revokes is revoked for the user's file too.
    system.write_text(f"@revoked {name} {key}\n")
    bed.known_hosts.write_text(f"{name} {key}\n")
    with pytest.raises(HostKeyError, match=rf"is REVOKED \({system}:1\)"):
        Connector(inv.known_hosts, system_known_hosts_file=system).connect(inv.hosts[0])
    proc = run_ddops("ping", "--all", inventory=bed.inventory_path, env={"DDOPS_SYSTEM_KNOWN_HOSTS": str(system)})
    assert proc.returncode == 1 and "is REVOKED" in proc.stdout + proc.stderr
