"""Foundation on real sshd hosts: ping, host-key policy, timeouts, unreachable hosts, JSON output, the agent."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import time
from pathlib import Path

import pytest

from ddops.errors import HostKeyError
from ddops.fleet import TaskOutcome, run_fleet
from ddops.inventory import load_inventory
from ddops.testbed import stop_host
from ddops.transport import Connector
from tests.conftest import inventory_with_host2_behind_host1, requires_sshd, run_ddops, wait_until

pytestmark = [pytest.mark.sshd, requires_sshd]


def hosts_of(bed):
    return list(load_inventory(bed.inventory_path).hosts)


def test_ping_all_reports_each_host_over_real_ssh(make_testbed):
    bed = make_testbed(3)
    proc = run_ddops("--json", "ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [h["host"] for h in doc["hosts"]] == ["host1", "host2", "host3"]
    for entry in doc["hosts"]:
        assert entry["status"] == "ok"
        assert entry["data"]["hostname"] == entry["host"]  # each host has its own UTS namespace
        assert entry["data"]["gpus"] == []
        assert entry["data"]["disk_free_bytes"] > 0
        assert entry["data"]["rtt_s"] > 0


def test_ping_table_on_a_pipe_lists_every_host(make_testbed):
    bed = make_testbed(2)
    proc = run_ddops("ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stderr
    assert "host1" in proc.stdout and "host2" in proc.stdout and "no GPU" in proc.stdout
    assert "2 hosts: 2 ok" in proc.stdout


def test_hosts_have_separate_filesystems_at_the_same_path(make_testbed):
    bed = make_testbed(2)
    (bed.hosts[0].repo_dir / "only-on-host1").write_text("x")
    inv = load_inventory(bed.inventory_path)
    connector = Connector(inv.known_hosts)
    results = run_fleet(list(inv.hosts), lambda h, s: TaskOutcome("ok", s.run(f"ls {h.repo}").stdout.strip()),
                        connector.connect)
    assert [r.message for r in results] == ["only-on-host1", ""]


def test_stopped_host_is_unreachable_and_the_others_ok(make_testbed):
    bed = make_testbed(3)
    stop_host(bed, "host2")
    proc = run_ddops("--json", "ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 1
    statuses = {h["host"]: h["status"] for h in json.loads(proc.stdout)["hosts"]}
    assert statuses == {"host1": "ok", "host2": "unreachable", "host3": "ok"}


def test_host_stopping_mid_run_is_reported_and_others_finish(make_testbed):
    bed = make_testbed(3)
    inv = load_inventory(bed.inventory_path)
    connector = Connector(inv.known_hosts)

    def task(host, session):
        if host.name == "host2":
            stop_host(bed, "host2")  # kills its sshd and the session processes under it
        return TaskOutcome("ok", session.run("echo still-here", timeout=5).stdout.strip())

    results = {r.host: r for r in run_fleet(list(inv.hosts), task, connector.connect)}
    assert results["host1"].status == results["host3"].status == "ok"
    assert results["host2"].status == "unreachable"
    assert "connection lost" in results["host2"].message


def test_unknown_host_key_is_refused_with_hint_and_nothing_runs(make_testbed, tmp_path):
    bed = make_testbed(1)
    bed.known_hosts.write_text("")
    marker = bed.hosts[0].repo_dir / "ran"
    proc = run_ddops("ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 1
    assert "unknown host key" in proc.stderr + proc.stdout and "--accept-new" in proc.stderr + proc.stdout
    assert not marker.exists()
    inv = load_inventory(bed.inventory_path)
    with pytest.raises(HostKeyError, match="--accept-new"):
        Connector(inv.known_hosts).connect(inv.hosts[0])


def test_accept_new_records_the_key_then_plain_runs_work(make_testbed):
    bed = make_testbed(2)
    bed.known_hosts.write_text("")
    assert run_ddops("--accept-new", "ping", "--all", inventory=bed.inventory_path).returncode == 0
    recorded = bed.known_hosts.read_text()
    assert all(f"[{h.address}]:{h.port} ssh-ed25519" in recorded for h in bed.hosts)
    assert run_ddops("ping", "--all", inventory=bed.inventory_path).returncode == 0


def test_the_unknown_key_hint_works_where_it_is_typed_after_the_command(make_testbed):
    # The hint says "re-run with --accept-new": appended to the command as typed, that must work.
    bed = make_testbed(1)
    bed.known_hosts.write_text("")
    refused = run_ddops("ping", "--host", "host1", "-i", str(bed.inventory_path))
    assert refused.returncode == 1 and "--accept-new" in refused.stderr + refused.stdout
    proc = run_ddops("ping", "--host", "host1", "-i", str(bed.inventory_path), "--accept-new", "-v", "--json",
                     "--forks", "2")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"] == {"ok": 1}
    assert f"[{bed.hosts[0].address}]:{bed.hosts[0].port} ssh-ed25519" in bed.known_hosts.read_text()


def test_changed_host_key_is_refused_even_with_accept_new(make_testbed, tmp_path):
    bed = make_testbed(1)
    other = make_testbed(1)
    host = bed.hosts[0]
    wrong_key = other.known_hosts.read_text().split()[1:]
    bed.known_hosts.write_text(f"[{host.address}]:{host.port} {' '.join(wrong_key)}\n")
    proc = run_ddops("--accept-new", "ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 1
    assert "host key CHANGED" in proc.stdout + proc.stderr
    assert len(bed.known_hosts.read_text().splitlines()) == 1  # nothing recorded


def test_hanging_command_is_cut_off_while_others_finish(make_testbed):
    bed = make_testbed(3)
    inv = load_inventory(bed.inventory_path)
    connector = Connector(inv.known_hosts)

    def task(host, session):
        command = "sleep 30" if host.name == "host2" else "echo done"
        return TaskOutcome("ok", session.run(command, timeout=1.5).stdout.strip())

    started = time.monotonic()
    results = {r.host: r for r in run_fleet(list(inv.hosts), task, connector.connect)}
    assert time.monotonic() - started < 30, "the fleet waited for the 30 s sleep"
    assert results["host1"].message == results["host3"].message == "done"
    assert results["host2"].status == "failed" and "timed out after 1.5s" in results["host2"].message


def test_silent_listener_is_unreachable_within_the_connect_timeout(make_testbed):
    bed = make_testbed(1)
    listener = socket.socket()
    listener.bind((bed.hosts[0].address, 0))
    listener.listen()
    port = listener.getsockname()[1]
    inv_path = Path(bed.root) / "silent.yaml"
    text = bed.inventory_path.read_text().replace("connect_timeout: 5", "connect_timeout: 1")
    text += f"  silent: {{address: {bed.hosts[0].address}, port: {port}}}\n"
    inv_path.write_text(text)
    try:
        proc = run_ddops("--json", "ping", "--all", inventory=inv_path)
    finally:
        listener.close()
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert {name: h["status"] for name, h in hosts.items()} == {"host1": "ok", "silent": "unreachable"}
    # The message names the 1 s timeout that ended the wait: a state, not a wall time, which load stretches.
    assert "accepted the connection but did not speak SSH within 1s" in hosts["silent"]["message"]


def test_agent_round_trip_returns_structured_data(make_testbed):
    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    with Connector(inv.known_hosts).connect(inv.hosts[0]) as session:
        facts = session.call_agent("facts", {"repo": inv.hosts[0].repo})
        assert facts["hostname"] == "host1"
        assert facts["repo_exists"] is True
        assert session.round_trips == 1


def test_shell_metacharacters_in_repo_path_never_reach_a_shell(make_testbed, tmp_path):
    bed = make_testbed(1)
    marker = Path("/tmp") / f"ddops-pwned-{os.getpid()}"
    hostile = f"/root/ddtree/x;touch {marker};$(touch {marker})`touch {marker}`"
    inv = load_inventory(bed.inventory_path)
    host = inv.hosts[0]
    from dataclasses import replace

    with Connector(inv.known_hosts).connect(replace(host, repo=hostile)) as session:
        facts = session.call_agent("facts", {"repo": hostile})
        assert facts["repo_exists"] is False
        (tmp_path / "data").write_bytes(b"data")
        session.put_file(tmp_path / "data", "/root/ddtree/" + "a'b;$(x)")
        assert session.run(f"cat {shlex.quote('/root/ddtree/' + chr(39).join(['a', 'b;$(x)']))}").stdout == "data"
    assert not marker.exists()


def test_json_output_is_one_document_even_with_failures(make_testbed):
    bed = make_testbed(2)
    stop_host(bed, "host1")
    proc = run_ddops("ping", "--all", "--json", inventory=bed.inventory_path)
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 1 and doc["summary"] == {"ok": 1, "unreachable": 1}
    assert len(doc["hosts"]) == 2


def test_inventory_check_and_hosts_commands(make_testbed, tmp_path):
    bed = make_testbed(2)
    assert run_ddops("inventory", "check", inventory=bed.inventory_path).returncode == 0
    listed = run_ddops("hosts", "--json", inventory=bed.inventory_path)
    assert [h["host"] for h in json.loads(listed.stdout)["hosts"]] == ["host1", "host2"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  a: {prot: 1}\n")
    proc = run_ddops("inventory", "check", inventory=bad)
    assert proc.returncode == 2
    assert f"{bad}:2: hosts.a.prot: unknown key (did you mean 'port'?)" in proc.stderr


def test_testbed_refuses_clearly_without_sshd(monkeypatch):
    from ddops import testbed
    from ddops.errors import TestbedError

    monkeypatch.setattr(testbed, "SSHD_CANDIDATES", ())
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(TestbedError, match="apt-get install -y openssh-server"):
        testbed.preflight()


def test_testbed_down_ends_detached_processes_left_on_its_hosts(make_testbed):
    from ddops import testbed

    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    marker = f"sleep {1000 + os.getpid() % 1000}"
    with Connector(inv.known_hosts).connect(inv.hosts[0]) as session:
        session.run(f"setsid sh -c '{marker}' </dev/null >/dev/null 2>&1 &")

    def sleepers() -> list[str]:
        return [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == marker]

    wait_until(sleepers, timeout=10)  # `run` returns when the shell exits, maybe before the sleeper has started
    testbed.down(bed.root)
    assert sleepers() == []


def test_testbed_down_ends_what_a_host_left_running_when_its_sshd_was_stopped_alone(make_testbed):
    # stop_host is a host whose sshd died: detached processes (a bench runner, a resident agent) live on, as on a
    # real host. They are still the testbed's, and end with it, even though no sshd is left to find them through.
    from ddops import testbed

    bed = make_testbed(2)
    inv = load_inventory(bed.inventory_path)
    marker = f"sleep {2000 + os.getpid() % 1000}"
    with Connector(inv.known_hosts).connect(inv.hosts[1]) as session:
        session.run(f"setsid sh -c '{marker}' </dev/null >/dev/null 2>&1 &")

    def sleepers() -> list[str]:
        return [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == marker]

    wait_until(sleepers, timeout=10)
    stop_host(bed, "host2")
    assert sleepers()  # the sshd alone went
    testbed.down(bed.root)
    assert sleepers() == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_proxy_jump_reaches_a_host_through_another_inventory_host(make_testbed):
    bed = make_testbed(2)
    jumped = inventory_with_host2_behind_host1(bed)
    inv = load_inventory(jumped)
    assert inv.host("host2").proxy_jump == "host1"
    connector = Connector(inv.known_hosts, jump_hosts=inv.hosts)
    try:
        with connector.connect(inv.host("host2")) as session:
            assert session.run("hostname").stdout.strip() == "host2"
        assert list(connector._jumps) == ["host1"]  # the connection went through host1
    finally:
        connector.close()
    # With the jump host gone, the target is unreachable, and the message says through which host.
    stop_host(bed, "host1")
    proc = run_ddops("--json", "ping", "--host", "host2", inventory=jumped)
    entry = json.loads(proc.stdout)["hosts"][0]
    assert proc.returncode == 1 and entry["status"] == "unreachable"
    assert "host1" in entry["message"]


def test_an_identity_file_that_is_not_a_key_is_named_in_the_error(make_testbed):
    bed = make_testbed(1)
    bogus = Path(bed.root) / "not-a-key"
    bogus.write_text("this is not a private key\n")
    inv_path = Path(bed.root) / "bogus-key.yaml"
    inv_path.write_text(bed.inventory_path.read_text().replace(str(bed.client_key), str(bogus)))
    proc = run_ddops("--json", "ping", "--all", inventory=inv_path)
    entry = json.loads(proc.stdout)["hosts"][0]
    assert proc.returncode == 1 and entry["status"] == "unreachable"
    assert f"identity_file {bogus} is not a usable private key" in entry["message"]


def test_proxy_jump_chain_goes_through_each_hop_in_turn(make_testbed):
    bed = make_testbed(3)
    h3 = bed.hosts[2]
    chained = Path(bed.root) / "chain.yaml"
    chained.write_text(bed.inventory_path.read_text().replace(
        f"host3: {{address: {h3.address}, port: {h3.port}, groups: [testbed]}}",
        f"host3: {{address: {h3.address}, port: {h3.port}, groups: [testbed], proxy_jump: 'host1,host2'}}"))
    inv = load_inventory(chained)
    connector = Connector(inv.known_hosts, jump_hosts=inv.hosts)
    try:
        with connector.connect(inv.host("host3")) as session:
            assert session.run("hostname").stdout.strip() == "host3"
        # host2 was reached through host1, and host3 through that session to host2.
        assert sorted(connector._jumps) == ["host1", "host1,host2"]
        assert connector._jumps["host1,host2"].host.proxy_jump == "host1"
    finally:
        connector.close()
    # Without the first hop nothing further is reachable, and the message says which hop failed.
    stop_host(bed, "host1")
    proc = run_ddops("--json", "ping", "--host", "host3", inventory=chained)
    entry = json.loads(proc.stdout)["hosts"][0]
    assert proc.returncode == 1 and entry["status"] == "unreachable"
    assert "host1" in entry["message"]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs an OpenSSH client (ssh -G)")
def test_proxy_jump_chain_of_ssh_config_aliases_resolved_by_openssh(make_testbed):
    bed = make_testbed(3)
    h1, h2, h3 = bed.hosts
    ssh_config = Path(bed.root) / "ssh_config"
    hops = Path(bed.root) / "hops.conf"
    hops.write_text(f"Host jump-one\n  HostName {h1.address}\n  Port {h1.port}\n"
                    f"Host jump-two\n  HostName {h2.address}\n  Port {h2.port}\n")
    # Host blocks match the name ssh is given, and ddops gives it the host's address.
    ssh_config.write_text(f"Include {hops}\nHost {h3.address}\n  ProxyJump jump-one,jump-two\n")
    inv_path = Path(bed.root) / "aliases.yaml"
    inv_path.write_text(bed.inventory_path.read_text()
                        .replace("ssh_config: /dev/null", f"ssh_config: {ssh_config}")
                        .replace(f"host3: {{address: {h3.address}, port: {h3.port}, groups: [testbed]}}",
                                 f"target: {{address: {h3.address}, port: {h3.port}, groups: [testbed]}}"))
    inv = load_inventory(inv_path)
    assert inv.host("target").proxy_jump == "jump-one,jump-two"
    assert {h.name: (h.address, h.port) for h in inv.jump_hosts} == {"jump-one": (h1.address, h1.port),
                                                                     "jump-two": (h2.address, h2.port)}
    proc = run_ddops("--json", "ping", "--host", "target", inventory=inv_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["hosts"][0]["data"]["hostname"] == "host3"
    stop_host(bed, "host2")
    proc = run_ddops("--json", "ping", "--host", "target", inventory=inv_path)
    entry = json.loads(proc.stdout)["hosts"][0]
    assert entry["status"] == "unreachable" and "jump-two" in entry["message"]
    # Where the inventory names no known_hosts, ssh_config's UserKnownHostsFile for each host (hops too) is used.
    elsewhere = Path(bed.root) / "jump_known_hosts"
    elsewhere.write_text("")
    hops.write_text(hops.read_text() + f"Host jump-one\n  UserKnownHostsFile {elsewhere}\n")
    ssh_config.write_text(ssh_config.read_text() + f"Host *\n  UserKnownHostsFile {bed.known_hosts}\n")
    inv_path.write_text("".join(line for line in inv_path.read_text().splitlines(keepends=True)
                                if not line.startswith("known_hosts:")))
    proc = run_ddops("--json", "ping", "--host", "target", inventory=inv_path)
    entry = json.loads(proc.stdout)["hosts"][0]
    assert entry["status"] == "unreachable" and "jump-one: unknown host key" in entry["message"], entry
    assert str(elsewhere) in entry["message"]
