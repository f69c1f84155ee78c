"""`ddops -H user@host:port,...`: hosts without an inventory, ~/.ssh/config filling in the rest, host keys checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]

ANCHOR = "past_key_values_target = DynamicCache()\n"


def home_with_ssh_config(tmp_path: Path, bed, known_lines: list[str]) -> dict[str, str]:
    """A home whose ~/.ssh/config gives the testbed's key and a known_hosts holding only `known_lines`."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    known = home / ".ssh" / "known_hosts"
    known.write_text("".join(known_lines))
    (home / ".ssh" / "config").write_text(f"Host 127.*\n  IdentityFile {bed.client_key}\n"
                                          f"  UserKnownHostsFile {known}\n")
    return {"HOME": str(home), "SSH_AUTH_SOCK": ""}


def spec(bed, *names: str, user: str = "root") -> str:
    return ",".join(f"{user}@{bed.host(n).address}:{bed.host(n).port}" for n in names)


def test_dash_h_patches_the_hosts_it_names_with_ssh_config_defaults_and_strict_host_keys(make_testbed, seed,
                                                                                          tmp_path):
    bed = make_testbed(3, seed=seed)
    lines = bed.known_hosts.read_text().splitlines(keepends=True)
    h1, h2 = bed.host("host1"), bed.host("host2")
    env = home_with_ssh_config(tmp_path, bed, [line for line in lines if line.startswith(f"[{h1.address}]")])

    proc = run_ddops("-H", spec(bed, "host1", "host2"), "--json", "patch", "hybrid-cache", env=env)
    assert proc.returncode == 1, proc.stderr
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert hosts[h1.address]["status"] == "changed"
    # host2's key is not in that known_hosts: refused, as with an inventory
    assert hosts[h2.address]["status"] == "unreachable" and "unknown host key" in hosts[h2.address]["message"]
    assert ANCHOR not in (h1.repo_dir / "ddtree.py").read_text()
    assert ANCHOR in (h2.repo_dir / "ddtree.py").read_text()
    assert ANCHOR in (bed.host("host3").repo_dir / "ddtree.py").read_text()  # not named: not touched

    env = home_with_ssh_config(tmp_path / "all", bed, lines)
    proc = run_ddops("-H", spec(bed, "host1", "host2"), "--json", "patch", "hybrid-cache", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [h["status"] for h in json.loads(proc.stdout)["hosts"]] == ["ok", "changed"]

    # After the command's name the long form works too (-H there is --host, a name from the inventory).
    proc = run_ddops("patch", "hybrid-cache", "--json", "--hosts", spec(bed, "host3"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(h["host"], h["status"]) for h in json.loads(proc.stdout)["hosts"]] == [(bed.host("host3").address,
                                                                                    "changed")]


@pytest.mark.parametrize("where", ["before the command", "after it"])
def test_dash_h_refuses_a_malformed_host_in_one_line(tmp_path, where):
    hosts = "root@127.0.0.1:22,not a host"
    args = ("-H", hosts, "ping") if where == "before the command" else ("ping", "--hosts", hosts)
    proc = run_ddops(*args, env={"HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ddops: error: -H not a host: not a host ([user@]host[:port], comma-separated)"


def test_dash_h_refuses_port_0_instead_of_taking_port_22(tmp_path):
    proc = run_ddops("-H", "root@127.0.0.1:0", "ping", env={"HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ddops: error: -H root@127.0.0.1:0: port 0 is out of range 1-65535"
