"""Container testbed hosts must not reach the machine's loopback-only services (#25 item 7): netavark turns on
route_localnet on the bridge, so a SYN a container's root crafts to 127.x.y.z:PORT reached a namespace host's sshd.
Tested from inside a container: raw sockets are refused there, and even with CAP_NET_RAW (exec --privileged) the
machine drops what comes from the bridge to 127.0.0.0/8, until `testbed down` removes the rule."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from ddops import testbed as tb
from ddops.testbed.containers import ContainerEngine, _testbed_id
from tests.conftest import CONTAINER_ENGINE, requires_sshd

pytestmark = [pytest.mark.sshd, pytest.mark.containers, requires_sshd]

# Run inside the container (stdlib only): a TCP SYN built by hand, sent out of eth0 to the gateway's MAC address
# whatever its IP destination (as a container's root can, with raw sockets), and the kind of answer: synack, rst,
# none (within 3 s), or no-raw-socket.
PROBE = (Path(__file__).with_name("loopback_probe.py")).read_text()


def probe(engine: ContainerEngine, container: str, destination: str, port: int, *extra: str) -> str:
    done = subprocess.run(engine.argv("exec", "-i", *extra, container, "python3", "-", destination, str(port)),
                          input=PROBE, capture_output=True, text=True, env=engine.env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def gateway(engine: ContainerEngine, container: str) -> str:
    routes = subprocess.run(engine.argv("exec", container, "cat", "/proc/net/route"), capture_output=True, text=True,
                            env=engine.env(), check=True).stdout.splitlines()[1:]
    default = [r.split() for r in routes if r.split()[1] == "00000000"][0]
    return socket.inet_ntoa(struct.pack("<L", int(default[2], 16)))


def loopback_rules(bed) -> list[str]:
    rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True, check=True).stdout
    return [r for r in rules.splitlines() if f"ddops-testbed-{_testbed_id(bed.root)}" in r]


def test_a_container_host_cannot_reach_a_loopback_sshd_of_the_machine(make_testbed):
    target = make_testbed(1).hosts[0]  # a namespace host: sshd listening on 127.x.y.2 only
    bed = make_testbed(1, engine=CONTAINER_ENGINE)
    engine, container = ContainerEngine(bed.engine), bed.hosts[0].container
    assert probe(engine, container, target.address, target.port) == "no-raw-socket"
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        pytest.skip("the firewall rule needs root and iptables")
    # With CAP_NET_RAW given back, the probe itself works (the machine answers a SYN to its bridge address)...
    assert probe(engine, container, gateway(engine, container), target.port, "--privileged") == "rst"
    # ...and the SYN to the loopback sshd is dropped.
    assert probe(engine, container, target.address, target.port, "--privileged") == "none"
    assert len(loopback_rules(bed)) == 1
    tb.down(bed.root)
    assert loopback_rules(bed) == []
