"""`ddops bench` before and after a launch, through the CLI on real sshd hosts: the packages a plan needs checked
with each host's own python (refused in one line saying what to install where), each GPU's health (a fake
nvidia-smi answering from hand-written fixtures), --check's commands grouped, logs -f and logs of the last run,
and bench list's hosts grouped."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import requires_sshd, run_ddops, run_ddops_json
from tests.gpu_fixtures import fake_gpus_on_testbed_host

pytestmark = [pytest.mark.sshd, requires_sshd]


def plan_file(tmp_path: Path, *, gpus: int = 0, packages: str = "") -> Path:
    path = tmp_path / f"tiny-{gpus}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: tiny
        command: echo hello from run {{run_index}} > {{result_dir}}/out-{{n}}.txt
        results: "*.txt"
        summarizer: ddtree
        gpus: {gpus}
        timeout_minutes: 1
        matrix:
          n: [1, 2]
        """) + packages)
    return path


def python_with(tmp_path: Path, name: str, **versions: str) -> Path:
    """A host python (this one) that also sees fake distributions of these versions first."""
    site = tmp_path / f"site-{name}"
    for dist, version in versions.items():
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    wrapper = tmp_path / f"python-{name}"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def with_python(bed, tmp_path: Path, pythons: dict[str, Path]) -> Path:
    """The testbed's inventory with these hosts' `python:` set."""
    text = bed.inventory_path.read_text()
    for host, python in pythons.items():
        line = next(line for line in text.splitlines() if line.startswith(f"  {host}:"))
        text = text.replace(line, line[:-1] + f", python: {json.dumps(str(python))}}}")
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


def test_a_host_whose_python_lacks_the_plans_packages_is_refused_saying_what_to_install_where(make_testbed,
                                                                                              tmp_path):
    bed = make_testbed(3)
    plan = plan_file(tmp_path, packages='requires_packages:\n  transformers: ">=5.16,<5.25"\n  not-a-real-dist:\n')
    newer = python_with(tmp_path, "newer", transformers="5.25.0", not_a_real_dist="1.0")
    fine = python_with(tmp_path, "fine", transformers="5.24.0", not_a_real_dist="1.0")
    # host3's transformers in range whatever this python holds: its one problem is the missing distribution
    lacking = python_with(tmp_path, "lacking", transformers="5.24.0")
    inventory = with_python(bed, tmp_path, {"host1": fine, "host2": newer, "host3": lacking})
    code, doc = run_ddops_json("bench", str(plan), "--all", "--check", inventory=inventory)
    assert code == 1, doc
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["host1"]["status"] == "ok" and hosts["host1"]["message"].startswith("ready: 2 runs")
    assert hosts["host2"]["message"] == (
        f"refused: transformers 5.25.0, plan needs >=5.16,<5.25 (install it for {sys.executable}: "
        f"{sys.executable} -m pip install 'transformers>=5.16,<5.25')")
    # host3 lacks the fake distribution
    assert hosts["host3"]["data"]["problems"] == [
        f"not-a-real-dist is not installed, plan needs it (install it for {sys.executable}: {sys.executable} "
        "-m pip install not-a-real-dist)"]


@pytest.fixture
def gpu_bed(make_testbed):
    bed = make_testbed(3)
    for name, fixture in (("host1", "h100-idle"), ("host2", "h100-busy"), ("host3", "a100-unhealthy")):
        fake_gpus_on_testbed_host(bed, name, fixture)
    return bed


def test_a_busy_or_unhealthy_gpu_is_refused_unless_allowed_and_the_manifest_keeps_the_gpus_state(gpu_bed, tmp_path):
    plan = plan_file(tmp_path, gpus=1)
    code, doc = run_ddops_json("bench", str(plan), "--all", "--check", inventory=gpu_bed.inventory_path)
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert code == 1 and hosts["host1"]["status"] == "ok"
    assert hosts["host2"]["message"] == (
        "refused: GPU 1 busy: pid 48213 /usr/bin/python3 (38.0 GiB); GPU 2 busy: 20.0 GiB in use by a process "
        "nvidia-smi does not list (another container?) (--allow-busy-gpus runs anyway)")
    assert "GPU 1 ecc: 2 uncorrected ECC errors" in hosts["host3"]["message"]
    allowed = run_ddops("bench", str(plan), "--all", "--check", "--allow-busy-gpus", inventory=gpu_bed.inventory_path)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    code, doc = run_ddops_json("bench", str(plan), "--all", "--check", "--allow-busy-gpus",
                               inventory=gpu_bed.inventory_path)
    busy = {h["host"]: h for h in doc["hosts"]}["host2"]
    assert busy["status"] == "ok" and busy["data"]["warnings"][0] == "GPU 1 busy: pid 48213 /usr/bin/python3 (38.0 GiB)"
    assert "; warning: GPU 1 busy" in busy["message"]

    results = tmp_path / "results"
    env = {"DDOPS_RESULTS_DIR": str(results)}
    launch = run_ddops("bench", str(plan), "--host", "host1", "--no-follow", "--run-id", "20261204-0000-gpus",
                       inventory=gpu_bed.inventory_path, env=env)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    assert run_ddops("bench", "logs", "-f", inventory=gpu_bed.inventory_path, env=env).returncode == 0
    collect = run_ddops("bench", "collect", inventory=gpu_bed.inventory_path, env=env)
    assert collect.returncode == 0, collect.stdout + collect.stderr
    manifest = json.loads((results / "20261204-0000-gpus" / "manifest.json").read_text())
    state = manifest["hosts"]["host1"]["gpu"]["state"]
    assert state["cuda_driver"] == "12.4" and state["issues"] == [] and len(state["gpus"]) == 8
    assert state["gpus"][0]["power_limit_w"] == 700.0 and state["gpus"][0]["clocks_max_sm_mhz"] == 1980


def test_check_shows_each_distinct_command_list_once_and_logs_and_list_follow_the_last_run(make_testbed, tmp_path):
    bed = make_testbed(3)
    plan = plan_file(tmp_path)
    check = run_ddops("bench", str(plan), "--all", "--check", inventory=bed.inventory_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("all 3 hosts: 2 runs") == 1
    assert check.stdout.count("echo hello from run 0 > '<result_dir>'/out-1.txt") == 1

    env = {"DDOPS_RESULTS_DIR": str(tmp_path / "results")}
    launch = run_ddops("bench", str(plan), "--all", "--no-follow", inventory=bed.inventory_path, env=env)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    # -f is a follow here, as everywhere it is one; no run id: the last one launched from here
    followed = run_ddops("bench", "logs", "-f", inventory=bed.inventory_path, env=env)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert all(f"{h.name} | === ddops run 2/2: n=2" in followed.stdout for h in bed.hosts), followed.stdout
    logs = run_ddops("bench", "logs", inventory=bed.inventory_path, env=env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert {line.split(" | ")[0] for line in logs.stdout.splitlines() if "=== ddops run 1/2: n=1" in line} == \
        {"host1", "host2", "host3"}, logs.stdout
    listed = run_ddops("bench", "list", inventory=bed.inventory_path, env=env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "tiny" in line]
    assert len(rows) == 1 and "host[1-3]\u00a0(3)" in rows[0] and "completed" in rows[0]
