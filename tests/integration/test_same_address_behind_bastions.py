"""Two machines at one address:port, each behind its own bastion (10.0.0.5 in two private networks), in one
inventory: told apart by the jump they are reached through, their host keys by `host_key_alias`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ddops.testbed.common import host_key_path
from tests.conftest import requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]


def resolve_in_bastion(bastion, name: str, target, tmp_path: Path) -> None:
    """Make `name` mean `target`'s address on `bastion` only: an /etc/hosts of its own in its mount namespace, which
    its sshd reads when a jump asks it to connect to `name`."""
    hosts_file = tmp_path / f"hosts-{bastion.name}"
    hosts_file.write_text(f"127.0.0.1 localhost\n{target.address} {name}\n")
    subprocess.run(["nsenter", "--mount", "--target", str(bastion.pid()), "mount", "--bind", str(hosts_file),
                    "/etc/hosts"], check=True, capture_output=True)


def test_two_hosts_at_one_address_behind_different_bastions_are_two_hosts(make_testbed, tmp_path):
    bed = make_testbed(4)
    h1, h2, h3, h4 = bed.hosts
    resolve_in_bastion(h1, "inner.lan", h3, tmp_path)
    resolve_in_bastion(h2, "inner.lan", h4, tmp_path)
    for host in (h3, h4):
        (host.repo_dir / "who").write_text(host.name)

    known = tmp_path / "known_hosts"
    known.write_text(bed.known_hosts.read_text() + "".join(
        f"{alias} {' '.join(host_key_path(host).with_suffix('.pub').read_text().split()[:2])}\n"
        for alias, host in (("inner-a", h3), ("inner-b", h4))))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(bed.inventory_path.read_text().replace(str(bed.known_hosts), str(known))
                         + f"  inner-a: {{address: inner.lan, port: {h3.port}, proxy_jump: host1, "
                           "host_key_alias: inner-a}\n"
                         + f"  inner-b: {{address: inner.lan, port: {h4.port}, proxy_jump: host2, "
                           "host_key_alias: inner-b}\n")

    proc = run_ddops("--json", "exec", "--host", "inner-a", "--host", "inner-b", "--in-repo", "--", "cat", "who",
                     inventory=inventory)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {h["host"]: h["data"]["stdout"] for h in json.loads(proc.stdout)["hosts"]} == {"inner-a": "host3",
                                                                                          "inner-b": "host4"}

    # Each one's resident agent is its own: the second run finds both where the first left them.
    for expected in ("started", "resident"):
        proc = run_ddops("--json", "ping", "--host", "inner-a", "--host", "inner-b", inventory=inventory)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert [h["agent"] for h in json.loads(proc.stdout)["hosts"]] == [expected, expected]
