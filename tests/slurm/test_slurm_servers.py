"""A bench plan's `server:` under Slurm, on a real single-node cluster: each array task starts its own server on the
compute node, stops it when its command ends, and a job cancelled in the middle (scancel: what `bench stop` does,
and what Slurm does at a job's time limit) leaves no server process and nothing listening."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import git, run_ddops, wait_until
from tests.conftest import testbeds as started_testbeds
from tests.slurm.conftest import login_inventory
from tests.unit.test_bench_servers import SERVE, listening, nothing_left, server_processes

pytestmark = [pytest.mark.slurm, pytest.mark.sshd]
RUN = "20261204-1200-srvr"


@pytest.fixture
def login(slurm_cluster, tmp_path_factory):
    """(inventory, shared repo, results dir): a login node whose group submits to the cluster, no GPU asked."""
    repo = tmp_path_factory.mktemp("shared-fs") / "repo"
    repo.mkdir()
    (repo / "serve.py").write_text(SERVE)
    git(repo, "init", "-q", "-b", "main")
    with started_testbeds(tmp_path_factory) as start:
        bed = start(1, name_prefix="login")
        inventory = login_inventory(bed, repo, slurm_cluster, "partition: debug, time: 5")
        yield inventory, repo, tmp_path_factory.mktemp("results")


def ddops(login, *args: str) -> subprocess.CompletedProcess[str]:
    inventory, _repo, results = login
    return run_ddops(*args, inventory=inventory, env={"DDOPS_RESULTS_DIR": str(results)})


def squeue(cluster, job: str) -> str:
    return subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%K %T"], capture_output=True, text=True,
                          env={**cluster.env, "PATH": "/usr/bin:/bin:/usr/sbin"}).stdout


def task_server(repo: Path, index: int) -> dict | None:
    """The server task <index> records, once it has one."""
    try:
        record = json.loads((repo / ".ddops" / "runs" / RUN / f"task-{index}.json").read_text())
    except (OSError, ValueError):
        return None
    return (record.get("servers") or [None])[0]


def test_each_task_serves_itself_and_a_cancelled_job_leaves_no_server(login, slurm_cluster, tmp_path):
    _inventory, repo, _results = login
    plan = tmp_path / "served.yaml"
    plan.write_text(f"""name: served
summarizer: vllm
results: "*.json"
server:
  command: {sys.executable} serve.py tree {{server_port}}
  ready: /
matrix:
  delay: [0, 600]
command: sleep {{delay}}
""")
    proc = ddops(login, "--json", "bench", str(plan), "--host", "login", "--run-id", RUN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads(proc.stdout)["hosts"][0]["data"]["job_id"]
    # The short task: its server was ready, then stopped with its command, on the compute node.
    wait_until(lambda: (task_server(repo, 0) or {}).get("ended"), timeout=120, interval=0.5)
    first = task_server(repo, 0)
    assert first["name"] == "task-0-server-1" and first["ready_seconds"] is not None
    # The long one, cancelled while its server answers and its command runs.
    wait_until(lambda: (task_server(repo, 1) or {}).get("ready_seconds") is not None, timeout=120, interval=0.5)
    port, tree = task_server(repo, 1)["port"], server_processes(RUN)
    assert listening(port) and len(tree) >= 2  # the server and the helper it started in a session of its own
    proc = ddops(login, "bench", "stop", RUN, "--yes")
    assert proc.returncode == 0 and f"scancel {job}" in proc.stdout, proc.stdout + proc.stderr
    wait_until(lambda: not squeue(slurm_cluster, job).strip(), timeout=60, interval=0.5)
    wait_until(lambda: nothing_left(RUN, [first["port"], port], tree), timeout=30, interval=0.2)
    log = (repo / ".ddops" / "runs" / RUN / "task-1-server-1.log").read_text()
    assert "serve.py starting: tree" in log  # the task's server output, kept in the run directory
