"""Ctrl-C during `ddops status` on real sshd hosts: the hosts it never asked are `not-asked`, never `no-repo`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, as_at_a_terminal, git, requires_sshd, wait_until

pytestmark = [pytest.mark.sshd, requires_sshd]


def test_ctrl_c_during_status_marks_the_hosts_it_never_asked_as_not_asked(make_testbed, seed, tmp_path):
    bed = make_testbed(3, seed=seed, patches=("hybrid-cache",))
    gate, entered = tmp_path / "gate", tmp_path / "entered"
    # host1's python waits for the gate: with --forks 1 the run holds there, the other two not started yet.
    held = tmp_path / "held-python"
    held.write_text(f"#!/bin/sh\ntouch {entered}\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n"
                    f"exec {sys.executable} \"$@\"\n")
    held.chmod(0o755)
    head = git(seed, "rev-parse", "HEAD")
    inventory = tmp_path / "inventory.yaml"
    text = bed.inventory_path.read_text().replace("  connect_timeout: 5", f"  connect_timeout: 5\n  commit: {head}")
    host1 = next(line for line in text.splitlines() if line.startswith("  host1:"))
    inventory.write_text(text.replace(host1, host1[:-1] + f", python: {json.dumps(str(held))}}}"))
    proc = subprocess.Popen([sys.executable, "-m", "ddops", "-i", str(inventory), "--json", "status", "--all",
                             "--forks", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env={**os.environ, "COLUMNS": "200"}, preexec_fn=as_at_a_terminal)
    try:
        wait_until(entered.exists, timeout=60)
        proc.send_signal(signal.SIGINT)  # the first Ctrl-C: host1 finishes, host2 and host3 are never started
        said = proc.stderr.readline()  # --json draws no progress: the first line on stderr is the Ctrl-C's
        assert said.startswith("ddops: interrupted: no new host starts"), said
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    hosts = {h["host"]: h for h in json.loads(out)["hosts"]}
    assert hosts["host1"]["data"]["pin"] == "at-pin"
    for name in ("host2", "host3"):
        assert hosts[name]["interrupted"] == "not_started" and hosts[name]["data"]["pin"] == "not-asked", hosts[name]
