"""`ddops testbed` hosts on each engine: a shared home is really shared while each repo stays a host's own, and
container hosts are real containers (own host key, hostname, home) that `testbed down` removes without a trace."""

from __future__ import annotations

import subprocess

import pytest

from ddops.testbed.containers import ContainerEngine, _netavark_rules, _read_ip_forward
from tests.conftest import CONTAINER_ENGINE, both_engines, requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]


def ssh(bed, host, command: str) -> str:
    """Run a command on a testbed host with the OpenSSH client, host key checked against the testbed's known_hosts."""
    proc = subprocess.run(["ssh", "-i", str(bed.client_key), "-o", f"UserKnownHostsFile={bed.known_hosts}",
                           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-F", "/dev/null",
                           "-p", str(host.port), f"root@{host.address}", command],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{host.name}: {command}: {proc.stderr}"
    return proc.stdout


@both_engines
def test_shared_home_hosts_see_one_home_directory_and_each_its_own_repo(make_testbed):
    bed = make_testbed(3, shared_home=True)
    one, two, three = bed.hosts
    ssh(bed, one, "echo written-on-host1 > ~/shared-probe && echo mine > /root/ddtree/own-file")
    assert ssh(bed, two, "cat ~/shared-probe") == "written-on-host1\n"
    assert ssh(bed, three, "cat /root/shared-probe") == "written-on-host1\n"
    assert (bed.home_dir / "shared-probe").read_text() == "written-on-host1\n"
    # The repo path is each host's own directory, on top of the shared home.
    assert ssh(bed, two, "ls -A /root/ddtree") == ""
    assert (one.repo_dir / "own-file").read_text() == "mine\n"
    assert not (two.repo_dir / "own-file").exists()
    assert ssh(bed, two, "hostname") == "host2\n"


@both_engines
def test_without_shared_home_a_file_in_one_hosts_home_is_not_seen_by_another(make_testbed):
    bed = make_testbed(2)
    one, two = bed.hosts
    ssh(bed, one, "mkdir -p ~/.cache/ddops && echo host1-only > ~/.cache/ddops/probe")
    assert ssh(bed, two, "cat ~/.cache/ddops/probe 2>/dev/null || echo absent") == "absent\n"


@pytest.mark.containers
def test_container_hosts_have_their_own_host_keys_hostnames_and_loopback_ports(make_testbed):
    bed = make_testbed(2, engine=CONTAINER_ENGINE)
    engine = ContainerEngine(bed.engine)
    keys = [line.split()[2] for line in bed.known_hosts.read_text().splitlines()]
    assert len(keys) == 2 and keys[0] != keys[1]  # made per container, none baked into the image
    for host in bed.hosts:
        assert ssh(bed, host, "hostname; python3 -c 'print(1)'") == f"{host.name}\n1\n"
        assert ssh(bed, host, "cat /proc/1/cgroup >/dev/null; test -e /run/.containerenv -o -e /.dockerenv && "
                              "echo container") == "container\n"
        published = engine.run("port", host.container, "22", what="port").split()
        assert published == [f"{host.address}:{host.port}"]  # its own loopback address, nothing else


@pytest.mark.containers
def test_status_shows_the_containers_and_down_removes_them_with_their_network_and_firewall_chains(make_testbed):
    chains_before, forward_before = bool(_netavark_rules()), _read_ip_forward()
    bed = make_testbed(2, engine=CONTAINER_ENGINE)
    engine = ContainerEngine(bed.engine)
    proc = run_ddops("testbed", "status", "--root", bed.root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in bed.hosts:
        assert host.container in proc.stdout and "running" in proc.stdout

    proc = run_ddops("testbed", "down", "--root", bed.root)
    assert proc.returncode == 0, proc.stderr
    assert "stopped 2 containers" in proc.stdout
    listed = engine.run("ps", "-a", "--format", "{{.Names}}", what="ps").split()
    assert not set(listed) & {h.container for h in bed.hosts}
    assert bed.network not in engine.run("network", "ls", "--format", "{{.Name}}", what="network ls").split()
    if bed.engine == "podman" and not listed:  # the last ddops container gone: the machine as it was before
        assert bool(_netavark_rules()) == chains_before
        assert _read_ip_forward() == forward_before


@pytest.mark.containers
def test_image_runs_the_users_own_image_and_a_missing_one_is_refused_by_name(make_testbed, tmp_path):
    from ddops.errors import TestbedError
    from ddops.testbed.containers import image_tag

    engine = ContainerEngine(CONTAINER_ENGINE)
    engine.ensure_default_image()
    own = "localhost/ddops-test-own-image:sshd"
    engine.run("tag", image_tag(), own, what="tag")
    try:
        bed = make_testbed(1, engine=CONTAINER_ENGINE, image=own)
        assert bed.image == own and ssh(bed, bed.hosts[0], "hostname") == "host1\n"
        assert engine.run("inspect", "--format", "{{.ImageName}}" if engine.name == "podman" else "{{.Config.Image}}",
                          bed.hosts[0].container, what="inspect").strip() == own
    finally:
        engine.try_run("image", "rm", own)
    with pytest.raises(TestbedError, match="--image localhost/ddops-no-such-image:x: no such image"):
        make_testbed(1, engine=CONTAINER_ENGINE, image="localhost/ddops-no-such-image:x")
