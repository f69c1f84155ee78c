"""Security defaults: host keys are checked (unknown and changed keys refused, nothing runs), and the client's private
key — or a password someone put in the inventory — never shows up in output, `--json`, logs, remote state or
exception messages, whether the command succeeds or fails."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from ddops.testbed import stop_host
from tests.conftest import one_json, requires_sshd
from tests.reliability.conftest import all_output, iter_files

pytestmark = [pytest.mark.sshd, requires_sshd]

PASSWORD = "hunter2-Tr0ub4dor-never-print-me"


@pytest.fixture(scope="module")
def fleet(make_fleet):
    return make_fleet(6)


def private_material(key_file: Path) -> list[str]:
    """Pieces of the private key that must never appear anywhere: every 24 characters of its base64 body, the raw
    key blob's hex, and the PEM armour."""
    lines = key_file.read_text().strip().splitlines()
    body = "".join(lines[1:-1])
    pieces = [body[i:i + 24] for i in range(0, len(body) - 24, 12)]
    pieces.append(base64.b64decode(body).hex()[64:128])
    pieces.append("PRIVATE KEY-----")  # the armour (OpenSSH's own "UNPROTECTED PRIVATE KEY FILE" may be quoted)
    return pieces


def assert_no_secret(text: str, secrets: list[str], where: str) -> None:
    for piece in secrets:
        assert piece not in text, f"private material leaked into {where}: {piece!r}"


@pytest.fixture(scope="module")
def mixed(fleet, tmp_path_factory):
    """An inventory where host1 is fine and every other host fails in its own way (stopped, wrong key, a key file
    that is not a key, an unknown host key, a changed host key)."""
    root = tmp_path_factory.mktemp("mixed")
    other = root / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    garbage = root / "garbage_key"
    garbage.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nbm90IGEga2V5\n-----END OPENSSH PRIVATE KEY-----\n")
    garbage.chmod(0o600)  # refused for what it holds, not for its mode
    known = fleet.bed.known_hosts.read_text().splitlines()
    h4, h5, h6 = fleet.bed.hosts[3], fleet.bed.hosts[4], fleet.bed.hosts[5]
    h1_key = known[0].split(" ", 1)[1]
    known_hosts = root / "known_hosts"
    known_hosts.write_text("\n".join(line for line in known if not line.startswith(f"[{h5.address}]:")
                                     and not line.startswith(f"[{h6.address}]:"))
                           + f"\n[{h6.address}]:{h6.port} {h1_key}\n")
    text = fleet.bed.inventory_path.read_text().replace(str(fleet.bed.known_hosts), str(known_hosts))
    text = text.replace(f"host3: {{address: {fleet.bed.hosts[2].address}",
                        f"host3: {{identity_file: {json.dumps(str(other))}, address: {fleet.bed.hosts[2].address}")
    text = text.replace(f"host4: {{address: {h4.address}",
                        f"host4: {{identity_file: {json.dumps(str(garbage))}, address: {h4.address}")
    inventory = root / "inventory.yaml"
    inventory.write_text(text)
    stop_host(fleet.bed, "host2")
    return inventory


def test_unknown_and_changed_host_keys_are_refused_and_nothing_runs_there(fleet, mixed):
    fleet.reset()
    proc = fleet.cli("--json", "patch", "--all", inventory=mixed)
    assert proc.returncode == 1
    hosts = {h["host"]: h for h in one_json(proc)["hosts"]}
    assert hosts["host1"]["status"] == "changed"
    assert hosts["host5"]["status"] == "unreachable" and "unknown host key" in hosts["host5"]["message"]
    assert "--accept-new" in hosts["host5"]["message"]
    assert hosts["host6"]["status"] == "unreachable" and "host key CHANGED" in hosts["host6"]["message"]
    assert hosts["host3"]["status"] == "unreachable" and "authentication failed" in hosts["host3"]["message"]
    assert hosts["host4"]["status"] == "unreachable"
    for name in ("host3", "host4", "host5", "host6"):
        fleet.assert_original(name)
        assert not (fleet.repo(name) / ".ddops").exists()


def test_private_keys_never_appear_in_output_json_remote_state_or_exceptions(fleet, mixed):
    from ddops.inventory import load_inventory
    from ddops.transport import Connector

    fleet.reset()
    secrets = private_material(fleet.bed.client_key)
    assert len(secrets) > 10 and all(piece in fleet.bed.client_key.read_text() for piece in secrets[:3])
    runs = [fleet.cli("-v", "--json", "patch", "--all", inventory=mixed),
            fleet.cli("-v", "-v", "patch", "--all", "--diff", inventory=mixed),
            fleet.cli("-v", "--json", "status", inventory=mixed),
            fleet.cli("-v", "verify", "--all", inventory=mixed),
            fleet.cli("-v", "--json", "ping", "--all", inventory=mixed),
            fleet.cli("-v", "--json", "rollback", "--all", inventory=mixed),
            fleet.cli("-v", "--json", "hosts", "--all", inventory=mixed)]
    assert [r.returncode for r in runs] == [1, 1, 1, 1, 1, 1, 0]
    for run in runs:
        if "--json" in run.args:
            json.loads(run.stdout)  # still exactly one document, failures and all
    assert_no_secret(all_output(*runs), secrets, "CLI output")

    # Remote state and the local plan cache hold no key material either.
    for h in fleet.bed.hosts:
        for path in iter_files(fleet.repo(h.name) / ".ddops"):
            assert_no_secret(path.read_bytes().decode("latin-1"), secrets, str(path))
    for path in iter_files(Path(os.environ["DDOPS_CACHE_DIR"])):
        assert_no_secret(path.read_bytes().decode("latin-1"), secrets, str(path))

    # Nor do the exceptions a library user would catch.
    inventory = load_inventory(mixed)
    connector = Connector(inventory.known_hosts)
    for host in inventory.hosts[1:]:
        with pytest.raises(Exception) as caught:
            connector.connect(host).close()
        assert_no_secret(f"{caught.value!s} {caught.value!r}", secrets, f"the exception for {host.name}")


def test_a_password_in_the_inventory_is_refused_without_echoing_it(fleet, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(fleet.bed.inventory_path.read_text().replace(
        "  user: root", f"  user: root\n  password: {PASSWORD}"))
    runs = [fleet.cli(*args, inventory=inventory) for args in (("-v", "--json", "patch", "--all"),
                                                               ("-v", "inventory", "check"))]
    for run in runs:
        assert run.returncode == 2 and "defaults.password: unknown key" in run.stderr
    # Under --json the refusal is the one JSON document (docs/json.md); without it, nothing on stdout.
    document = json.loads(runs[0].stdout)
    assert document["exit_code"] == 2 and "defaults.password: unknown key" in document["error"]
    assert runs[1].stdout == ""
    assert PASSWORD not in all_output(*runs)
