"""ddops.fabric: a user's Fabric tasks on the inventory's hosts, with ddops' strict host keys."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddops.fabric as fabric_api  # the `fabric` extra, which scripts/setup installs for the tests
from ddops.errors import HostKeyError
from ddops.inventory import load_inventory
from tests.conftest import inventory_with_host2_behind_host1, requires_sshd

pytestmark = [pytest.mark.sshd, requires_sshd]
# in_stream=False: Invoke would otherwise read the test process's stdin, which pytest forbids.


def test_a_fabric_run_through_the_inventory_reaches_every_selected_host(make_testbed):
    bed = make_testbed(3)
    group = fabric_api.group(inventory=str(bed.inventory_path), limit="host1,host3")
    try:
        results = group.run("hostname; id -un", hide=True, in_stream=False)
    finally:
        group.close()
    assert sorted(r.stdout.split()[0] for r in results.values()) == ["host1", "host3"]
    assert {r.stdout.split()[1] for r in results.values()} == {"root"}
    assert {(c.host, c.port) for c in results} == {(h.address, h.port) for h in (bed.hosts[0], bed.hosts[2])}


def test_an_unknown_host_key_is_refused_and_not_recorded(make_testbed):
    bed = make_testbed(1)
    empty = Path(bed.root) / "empty_known_hosts"
    empty.write_text("")
    strict = Path(bed.root) / "strict.yaml"
    strict.write_text(bed.inventory_path.read_text().replace(str(bed.known_hosts), str(empty)))
    inv = load_inventory(strict)
    conn = fabric_api.connection(inv, inv.host("host1"))
    try:
        with pytest.raises(HostKeyError, match="host1: unknown host key"):
            conn.run("true", hide=True, in_stream=False)
    finally:
        conn.close()
    assert empty.read_text() == ""  # Fabric's default policy would have added it
    # The same inventory with the right known_hosts works: the refusal was about the key, nothing else.
    good = fabric_api.connection(load_inventory(bed.inventory_path), inv.host("host1"))
    try:
        assert good.run("hostname", hide=True, in_stream=False).stdout.strip() == "host1"
    finally:
        good.close()


def test_a_jump_host_becomes_a_gateway_connection(make_testbed):
    bed = make_testbed(2)
    jumped = inventory_with_host2_behind_host1(bed)
    inv = load_inventory(jumped)
    conn = fabric_api.connection(inv, inv.host("host2"))
    try:
        assert conn.gateway.host == bed.hosts[0].address
        assert conn.run("hostname", hide=True, in_stream=False).stdout.strip() == "host2"
        assert conn.gateway.is_connected  # it went through host1
    finally:
        conn.close()
        conn.gateway.close()


def test_a_revoked_host_key_is_refused_even_where_a_plain_line_trusts_it(make_testbed):
    bed = make_testbed(1)
    name, kind, blob = bed.known_hosts.read_text().split()[:3]
    bed.known_hosts.write_text(f"{name} {kind} {blob}\n@revoked * {kind} {blob}\n")
    inv = load_inventory(bed.inventory_path)
    conn = fabric_api.connection(inv, inv.host("host1"))
    try:
        with pytest.raises(HostKeyError, match=r"host1: host key ssh-ed25519 .* is REVOKED"):
            conn.run("true", hide=True, in_stream=False)
    finally:
        conn.close()
