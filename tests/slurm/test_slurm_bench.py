"""Slurm as the bench executor, against a real single-node Slurm: a testbed sshd host is the login node, the
mini-DDTree checkout lies on the filesystem it shares with the Slurm node, and the bench plan runs as a real job
array (submit, follow, status, a cancelled task, a failed task, collect, report); patch/verify/status/rollback
work on that shared checkout unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MINI_DDTREE, REPO_ROOT, git_seed, run_ddops, wait_until
from tests.conftest import testbeds as started_testbeds
from tests.slurm.conftest import login_inventory

pytestmark = [pytest.mark.slurm, pytest.mark.sshd]
pytest.importorskip("transformers", minversion="5.0")
pytest.importorskip("torch")

FIXES = ("hybrid-cache", "crop-relative", "cpu-timing")
RUN = "20261201-1200-slrm"


def slurm_plan(path: Path) -> Path:
    """mini-ddtree-bench as a 4-task grid: two good runs, one that fails (no such dataset), one that waits to be
    cancelled. Tiny: one prompt, eight new tokens."""
    text = (REPO_ROOT / "playbooks" / "mini-ddtree-bench.yaml").read_text()
    head, _, _ = text.partition("vars:\n")
    command = text.split("command: >-\n", 1)[1]
    path.write_text(head.replace("name: mini-ddtree-bench", "name: mini-ddtree-slurm") + """vars:
  models: models
  max_samples: 1
  max_new_tokens: 8
  tree_budgets: "4"
matrix:
  case:
    - {dataset: mini, target: qwen3-attn, temperature: 0.0, delay: 0}
    - {dataset: mini, target: qwen3.5-hybrid, temperature: 0.0, delay: 0}
    - {dataset: nosuch, target: qwen3-attn, temperature: 0.0, delay: 0}
    - {dataset: mini, target: qwen3-attn, temperature: 0.5, delay: 900}
command: >-
  sleep {delay} &&
""" + command)
    return path


@pytest.fixture(scope="module")
def cluster_bed(slurm_cluster, tmp_path_factory):
    """(inventory path, shared repo, results dir): a login node (testbed sshd) whose `slurm:` names the cluster."""
    # A `%` in the path: Slurm expands %-patterns in --output, so ddops must write it as `%%` there.
    shared = tmp_path_factory.mktemp("shared-fs-100%j")
    repo = git_seed(MINI_DDTREE, shared / "ddtree")
    # Untrained models (seconds to build): this test is about Slurm's plumbing, not the numbers.
    subprocess.run([sys.executable, "make_models.py", "--out", str(repo / "models"), "--target-steps", "0",
                    "--distill-steps", "0"],
                   cwd=repo, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, check=True,
                   capture_output=True, timeout=300)
    with started_testbeds(tmp_path_factory) as start:
        bed = start(1, name_prefix="login")
        # The repo is not the testbed's private bind mount: the same path on the login node and on the Slurm node.
        inventory = login_inventory(bed, repo, slurm_cluster, 'partition: debug, gres: "gpu:1", time: 10')
        yield inventory, repo, shared / "results"


def timeout_plan(path: Path) -> Path:
    """Two tasks: one ends at once, one outlives the job's one-minute time limit (Slurm: TIMEOUT)."""
    path.write_text("""name: slurm-timeout
summarizer: ddtree
results: "*.pt"
matrix:
  delay: [0, 600]
command: sleep {delay}
""")
    return path


def timeout_inventory(bed) -> Path:
    """The same login node, in a group whose jobs get one minute and no GPU (they run beside the mini plan's)."""
    inventory, _repo, _results = bed
    text = inventory.read_text().replace('gres: "gpu:1", time: 10', "time: 1")
    path = inventory.with_name("slurm-timeout-inventory.yaml")
    path.write_text(text)
    return path


def ddops(bed, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    inventory, _repo, results = bed
    return run_ddops(*args, inventory=inventory, env={"DDOPS_RESULTS_DIR": str(results)}, timeout=timeout)


def ddops_json(bed, *args: str) -> tuple[int, dict]:
    proc = ddops(bed, "--json", *args)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def squeue(cluster, job: str) -> str:
    return subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%K %T %r"], env={**os.environ, **cluster.env},
                          capture_output=True, text=True).stdout


def test_bench_runs_the_plan_as_one_job_array_on_the_shared_checkout(cluster_bed, slurm_cluster, tmp_path):
    inventory, repo, results = cluster_bed
    plan = slurm_plan(tmp_path / "mini-ddtree-slurm.yaml")
    originals = {name: hashlib.sha256((repo / name).read_bytes()).hexdigest() for name in ("ddtree.py", "dflash.py")}

    # Unpatched: refused before anything reaches Slurm.
    code, doc = ddops_json(cluster_bed, "bench", str(plan), "--host", "login", "--run-id", "20261201-1159-refu")
    assert code == 1 and "required patches not applied" in doc["hosts"][0]["message"], doc
    assert not (repo / ".ddops" / "runs" / "20261201-1159-refu").exists()

    # patch / verify / status on the shared checkout, exactly as on a bare host.
    proc = ddops(cluster_bed, "patch", "--host", "login", *FIXES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ddops(cluster_bed, "verify", "--host", "login", *FIXES).returncode == 0
    code, doc = ddops_json(cluster_bed, "status", "--host", "login")
    assert code == 0, doc

    # A job that outlives its time limit, started first: Slurm enforces limits in whole minutes, checked every 30 s.
    slow = (timeout_inventory(cluster_bed), repo, results)
    code, doc = ddops_json(slow, "bench", str(timeout_plan(tmp_path / "timeout.yaml")), "--host", "login",
                           "--run-id", "20261201-1200-tlim")
    assert code == 0, doc
    slow_job = doc["hosts"][0]["data"]["job_id"]

    # Submit: one job array, one task per run of the grid.
    code, doc = ddops_json(cluster_bed, "bench", str(plan), "--host", "login", "--run-id", RUN)
    assert code == 0, doc
    host = doc["hosts"][0]
    job = host["data"]["job_id"]
    assert host["data"]["total"] == 4 and "job array" in host["message"]
    run_dir = repo / ".ddops" / "runs" / RUN
    submitted = json.loads((run_dir / "slurm.json").read_text())
    assert submitted["job_id"] == job and {"--array=0-3", "--gres=gpu:1", "--partition=debug"} <= set(
        submitted["sbatch_args"])

    # Two fake GPUs, one per task: while the first two run, the last one waits in the queue and says why.
    code, doc = ddops_json(cluster_bed, "bench", "status", RUN)
    last = doc["hosts"][0]["data"]["run"]["runs"][3]
    assert code == 0 and last["status"] == "pending" and last["slurm"]["detail"].startswith("PENDING"), last

    # The waiting task, cancelled alone (scancel JOB_3) once it is running.
    wait_until(lambda: "3 RUNNING" in squeue(slurm_cluster, job), timeout=120, interval=0.5)
    proc = ddops(cluster_bed, "bench", "stop", RUN, "--task", "3", "--yes")
    assert proc.returncode == 0 and f"scancel {job}_3" in proc.stdout, proc.stdout + proc.stderr

    # Follow until every task ended: the tasks' output, prefixed with their index, with node and GPU ids.
    follow = ddops(cluster_bed, "bench", "logs", RUN, "--follow", timeout=240)
    assert follow.returncode == 1, follow.stdout + follow.stderr  # one task failed, one was cancelled
    assert "[0] === ddops task 1/4" in follow.stdout and "CUDA_VISIBLE_DEVICES=" in follow.stdout
    assert "[2] " in follow.stdout and "unknown dataset 'nosuch'" in follow.stdout

    # Status per task, from Slurm: COMPLETED, FAILED with the exit code, CANCELLED; node and GPU ids.
    code, doc = ddops_json(cluster_bed, "bench", "status", RUN)
    assert code == 1
    run = doc["hosts"][0]["data"]["run"]
    assert run["status"] == "failed" and run["total"] == 4
    tasks = {r["index"]: r for r in run["runs"]}
    assert [tasks[i]["status"] for i in range(4)] == ["ok", "ok", "failed", "cancelled"]
    assert tasks[2]["exit_code"] not in (0, None) and tasks[2]["slurm"]["state"] == "FAILED"
    assert tasks[3]["slurm"]["state"] == "CANCELLED"
    for i in (0, 1, 2):
        slurm = tasks[i]["slurm"]
        assert slurm["array_job_id"] == job and slurm["array_index"] == i and slurm["node"] == "localhost"
        assert slurm["cuda_visible_devices"] in ("0", "1") and slurm["slurm_job_gpus"] in ("0", "1")
    shown = ddops(cluster_bed, "bench", "status", RUN)
    assert "Slurm array tasks" in shown.stdout and "CANCELLED" in shown.stdout and "FAILED" in shown.stdout

    # Stopping a job that has ended cancels nothing and says so.
    proc = ddops(cluster_bed, "bench", "stop", RUN, "--yes")
    assert proc.returncode == 0 and "nothing to stop" in proc.stdout, proc.stdout + proc.stderr

    # Collect: the finished tasks' results with the provenance manifest, plus job id, array index, node, GPU ids.
    proc = ddops(cluster_bed, "bench", "collect", RUN)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the run failed; its good results are still fetched
    manifest = json.loads((results / RUN / "manifest.json").read_text())
    entry = manifest["hosts"]["login"]
    assert entry["executor"] == "slurm" and entry["job_id"] == job
    assert sorted(f["path"] for f in entry["files"]) == ["mini__qwen3-attn__t0.0__sdpa.pt",
                                                         "mini__qwen3.5-hybrid__t0.0__sdpa.pt"]
    assert [c["slurm"]["array_index"] for c in entry["commands"]] == [0, 1, 2, 3]
    assert all(c["slurm"]["node"] == "localhost" for c in entry["commands"][:3])
    assert entry["patches"] and all(p["in_place"] for p in entry["patches"])

    # Report: the finished tasks' rows, and the failed and cancelled tasks named as such.
    report = ddops(cluster_bed, "bench", "report", RUN, "--format", "json")
    assert report.returncode == 1
    rows = json.loads(report.stdout)["rows"]
    assert {r["method"] for r in rows} >= {"baseline", "dflash"} and {r["host"] for r in rows} == {"login"}
    assert f"Slurm task {job}_2 FAILED" in report.stderr and f"Slurm task {job}_3 CANCELLED" in report.stderr

    # The job killed for its time limit shows up as such, in status and in the report; its finished task is kept.
    wait_until(lambda: not squeue(slurm_cluster, slow_job).strip(), timeout=150, interval=1)
    code, doc = ddops_json(slow, "bench", "status", "20261201-1200-tlim")
    tasks = doc["hosts"][0]["data"]["run"]["runs"]
    assert code == 1 and [t["status"] for t in tasks] == ["ok", "timeout"], tasks
    assert tasks[1]["slurm"]["state"] == "TIMEOUT" and tasks[1]["slurm"]["node"] == "localhost"
    assert ddops(slow, "bench", "collect", "20261201-1200-tlim").returncode == 1
    report = ddops(slow, "bench", "report", "20261201-1200-tlim")
    assert report.returncode == 1 and f"Slurm task {slow_job}_1 TIMEOUT" in report.stderr, report.stderr

    # rollback on the shared checkout: the exact original bytes.
    assert ddops(cluster_bed, "rollback", "--host", "login", "--yes").returncode == 0
    assert {n: hashlib.sha256((repo / n).read_bytes()).hexdigest() for n in originals} == originals
