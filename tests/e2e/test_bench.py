"""End to end: `ddops bench` on real sshd hosts running mini-DDTree on the CPU — launch detached, survive the
controller being killed, reattach, collect every result file with its provenance, report numbers that match the
files, stop without leaving a process behind, refuse an unpatched host, report a crash with its exit code and log."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from statistics import fmean

import pytest

from tests.conftest import MINI_DDTREE, REPO_ROOT, as_at_a_terminal, git_seed, requires_sshd, run_ddops, wait_until

pytestmark = [pytest.mark.sshd, pytest.mark.torch, requires_sshd]

pytest.importorskip("transformers", minversion="5.0")
torch = pytest.importorskip("torch")

FIXES = ("hybrid-cache", "crop-relative", "cpu-timing")
MINI_PLAN = "mini-ddtree-bench"


# --- fixtures -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """mini-DDTree's tiny models, built once (untrained: fast, and the numbers do not matter here)."""
    out = tmp_path_factory.mktemp("mini-models")
    subprocess.run([sys.executable, "make_models.py", "--out", str(out), "--target-steps", "0", "--distill-steps", "0"],
                   cwd=MINI_DDTREE,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, check=True,
                   capture_output=True, timeout=300)
    return out


def with_host_vars(bed) -> None:
    """Keep the runs tiny (the plan's torchrun --standalone already picks a free port per run)."""
    lines = []
    for line in bed.inventory_path.read_text().splitlines():
        if line.rstrip().endswith("groups: [testbed]}"):
            line = line.rstrip()[:-1] + ", vars: {max_samples: 1, max_new_tokens: 8}}"
        lines.append(line)
    bed.inventory_path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def mini_bed(make_testbed, tmp_path, models):
    """make(n, patched=(host names)) -> a testbed seeded with a git copy of mini-DDTree, models in place."""

    def make(count: int, patched: tuple[str, ...] | None = None):
        bed = make_testbed(count, seed=git_seed(MINI_DDTREE, tmp_path / f"seed{count}"))
        for h in bed.hosts:
            shutil.copytree(models, h.repo_dir / "models")
        with_host_vars(bed)
        names = [h.name for h in bed.hosts] if patched is None else list(patched)
        if names:
            selection = [arg for name in names for arg in ("--host", name)]
            proc = run_ddops("patch", *selection, *FIXES, inventory=bed.inventory_path)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return bed

    return make


@pytest.fixture
def results_dir(tmp_path) -> Path:
    return tmp_path / "results"


def ddops(bed, results_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_ddops(*args, inventory=bed.inventory_path, env={"DDOPS_RESULTS_DIR": str(results_dir)},
                     timeout=timeout)


def ddops_json(bed, results_dir: Path, *args: str) -> tuple[int, dict]:
    proc = ddops(bed, results_dir, "--json", *args)
    return proc.returncode, json.loads(proc.stdout)


def tagged(run_id: str) -> list[int]:
    """Live processes of a run, found by the tag the runner puts in their environment (pid namespace is shared)."""
    wanted = f"DDOPS_RUN_ID={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "environ").read_bytes().split(b"\0") \
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def direct_numbers(pt: Path) -> dict[str, dict[str, float]]:
    """Per method, straight from the file with torch: tok/s, speedup over this file's baseline, tau."""
    with torch.serialization.safe_globals([types.SimpleNamespace]):
        data = torch.load(pt, weights_only=True)
    methods = data["responses"][0].keys()
    tpot = {m: fmean(r[m].time_per_output_token for r in data["responses"]) for m in methods}
    out = {}
    for m in methods:
        tau = fmean(fmean(r[m].acceptance_lengths) for r in data["responses"]) if m != "baseline" else None
        out[m] = {"tokens_per_s": 1 / tpot[m], "speedup": tpot["baseline"] / tpot[m], "tau": tau,
                  "temperature": data["args"]["temperature"], "model": data["args"]["model_name_or_path"]}
    return out


# --- tests --------------------------------------------------------------------------------------------------------


def test_bench_on_three_hosts_survives_the_controller_being_killed_then_collects_and_reports(mini_bed, results_dir):
    bed = mini_bed(3)
    run_id = "20261130-0000-e2e1"
    argv = [sys.executable, "-m", "ddops", "-i", str(bed.inventory_path), "bench", MINI_PLAN, "--all", "--follow",
            "--run-id", run_id]
    controller = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "DDOPS_RESULTS_DIR": str(results_dir), "COLUMNS": "200"})
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = controller.stdout.readline()
        seen.append(line)
        if "| === ddops run 1/2" in line:  # a host's log, streamed with its prefix: the run is under way
            break
    assert any(line.startswith(("host1 |", "host2 |", "host3 |")) for line in seen), "".join(seen)
    controller.send_signal(signal.SIGKILL)
    controller.wait(timeout=10)
    controller.stdout.close()

    # The runs go on without the controller; reattach by status and by following the logs.
    code, doc = ddops_json(bed, results_dir, "bench", "status", run_id)
    assert code == 0, doc
    assert {h["data"]["run"]["status"] for h in doc["hosts"]} <= {"starting", "running", "completed"}
    follow = ddops(bed, results_dir, "bench", "logs", run_id, "--follow", timeout=180)
    assert follow.returncode == 0, follow.stdout[-3000:] + follow.stderr[-3000:]
    for host in ("host1", "host2", "host3"):
        assert f"{host} | === ddops run {run_id} completed" in follow.stdout
        assert f"{host}: completed 2/2 ok" in follow.stderr
    # Each runner records the end, then exits: nothing of the run is left moments later.
    wait_until(lambda: tagged(run_id) == [], timeout=10)

    code, doc = ddops_json(bed, results_dir, "bench", "status", run_id)
    assert code == 0
    for h in doc["hosts"]:
        run = h["data"]["run"]
        assert run["status"] == "completed" and [r["exit_code"] for r in run["runs"]] == [0, 0]

    # Collect: every .pt of every host, byte-identical, with provenance.
    proc = ddops(bed, results_dir, "bench", "collect", run_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=bed.hosts[0].repo_dir, capture_output=True, text=True,
                          check=True).stdout.strip()
    manifest = json.loads((results_dir / run_id / "manifest.json").read_text())
    for h in bed.hosts:
        remote = sorted((h.repo_dir / ".ddops" / "runs" / run_id / "results").glob("*.pt"))
        local = sorted((results_dir / run_id / h.name).glob("*.pt"))
        assert [p.name for p in local] == [p.name for p in remote] == ["mini__qwen3-attn__t0.0__sdpa.pt",
                                                                       "mini__qwen3.5-hybrid__t0.0__sdpa.pt"]
        assert [sha256(p) for p in local] == [sha256(p) for p in remote]
        entry = manifest["hosts"][h.name]
        assert entry["gpu"] == {"model": None, "count": 0, "driver": None,
                                "state": {"gpus": [], "cuda_driver": None, "torch_cuda": None, "issues": []}}
        assert entry["python"] == ".".join(map(str, sys.version_info[:3]))
        assert entry["torch"] == torch.__version__.split("+")[0] or entry["torch"] == torch.__version__
        assert entry["transformers"] and entry["repo_commit"] == head
        assert {p["id"] for p in entry["patches"]} >= set(FIXES)
        assert all(len(p["sha256"]) == 64 and p["in_place"] for p in entry["patches"])
        assert entry["exit_codes"] == {"0": 0, "1": 0} and entry["started"] and entry["ended"]
        assert all("benchmark.py" in c["command"] and c["env"]["OMP_NUM_THREADS"] == "1" for c in entry["commands"])
        assert entry["env"]["HF_HUB_OFFLINE"] == "1"
        assert {f["sha256"] for f in entry["files"]} == {sha256(p) for p in local}

    # Resumable: what is already here is skipped; a missing or damaged file is fetched again.
    (results_dir / run_id / "host1" / "mini__qwen3.5-hybrid__t0.0__sdpa.pt").unlink()
    (results_dir / run_id / "host2" / "mini__qwen3-attn__t0.0__sdpa.pt").write_bytes(b"damaged")
    code, doc = ddops_json(bed, results_dir, "bench", "collect", run_id)
    assert code == 0
    fetched = {h["host"]: (h["data"]["fetched"], h["data"]["kept"]) for h in doc["hosts"]}
    assert fetched == {"host1": (1, 1), "host2": (1, 1), "host3": (0, 2)}

    # The report's numbers are the files' numbers.
    proc = ddops(bed, results_dir, "bench", "report", run_id, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert len(rows) == 3 * 2 * 4  # hosts x targets x (baseline, dflash, ddtree_tb4, ddtree_tb8)
    for h in bed.hosts:
        for pt in (results_dir / run_id / h.name).glob("*.pt"):
            for method, want in direct_numbers(pt).items():
                (row,) = [r for r in rows if r["host"] == h.name and r["method"] == method
                          and r["temperature"] == want["temperature"] and r["model"] == want["model"]]
                assert row["tokens_per_s"] == pytest.approx(want["tokens_per_s"], rel=1e-9)
                assert row["speedup"] == pytest.approx(want["speedup"], rel=1e-9)
                if want["tau"] is not None:
                    assert row["acceptance_length"] == pytest.approx(want["tau"], rel=1e-9)
    table = ddops(bed, results_dir, "bench", "report", run_id, "--plot", str(results_dir / "report.png"))
    assert table.returncode == 0 and "ddtree_tb8" in table.stdout and "host3" in table.stdout
    assert (results_dir / "report.png").stat().st_size > 0


def hold_benchmark(host) -> Path:
    """Make the host's benchmark.py wait at its start while a gate file exists: its run cannot end (and the
    controller following it cannot finish) before the test has done what it waits for, however loaded the machine."""
    gate = host.repo_dir / ".hold-benchmark"
    gate.write_text("")
    script = host.repo_dir / "benchmark.py"
    text = script.read_text()
    hold = ("import os as _hold_os, time as _hold_time\n"
            "while _hold_os.path.exists(_hold_os.path.join(_hold_os.path.dirname(_hold_os.path.abspath(__file__)), "
            "'.hold-benchmark')):\n    _hold_time.sleep(0.05)\n")
    script.write_text(hold + text)
    return gate


def test_ctrl_c_detaches_and_bench_stop_ends_every_process_including_torchrun_workers(mini_bed, results_dir):
    bed = mini_bed(1)
    hold_benchmark(bed.hosts[0])  # never released: `bench stop` must end the held worker
    run_id = "20261130-0000-stop"
    controller = subprocess.Popen(
        [sys.executable, "-m", "ddops", "-i", str(bed.inventory_path), "bench", MINI_PLAN, "--all", "--follow",
         "--run-id", run_id], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "DDOPS_RESULTS_DIR": str(results_dir)}, preexec_fn=as_at_a_terminal)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "=== ddops run 1/2" not in controller.stdout.readline():
        pass
    # The state Ctrl-C must meet: the controller following a run whose worker is up (and held there).
    wait_until(lambda: any("benchmark.py" in cmdline(p) and "torch.distributed.run" not in cmdline(p)
                           for p in tagged(run_id)), timeout=120, interval=0.2)
    assert controller.poll() is None, "the controller ended while its run was held"
    controller.send_signal(signal.SIGINT)  # Ctrl-C: stop following, leave the run alone
    out, err = controller.communicate(timeout=30)
    assert controller.returncode == 130, err
    assert f"detached: run {run_id} keeps going" in err
    # the next steps keep the -i this run was given
    hint = f"ddops -i {bed.inventory_path} bench"
    assert f"{hint} logs {run_id} --follow" in err and f"{hint} status {run_id}" in err
    # torchrun starts its worker in a session of its own: wait for it, so stop has to find it.
    wait_until(lambda: any("benchmark.py" in cmdline(p) and "torch.distributed.run" not in cmdline(p)
                           for p in tagged(run_id)), timeout=60, interval=0.2)
    assert len(tagged(run_id)) >= 3  # runner, sh, torchrun, its worker

    proc = ddops(bed, results_dir, "bench", "stop", run_id, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stopped" in proc.stdout
    assert tagged(run_id) == []
    time.sleep(1)  # nothing starts the next run behind our back
    assert tagged(run_id) == []
    code, doc = ddops_json(bed, results_dir, "bench", "status", run_id)
    run = doc["hosts"][0]["data"]["run"]
    assert code == 1 and run["status"] == "stopped"
    assert [r["status"] for r in run["runs"]] == ["stopped", "pending"]
    listed = ddops(bed, results_dir, "bench", "list")
    assert run_id in listed.stdout and "stopped" in listed.stdout


def test_an_unpatched_host_is_refused_with_the_reason_and_the_others_run(mini_bed, results_dir):
    bed = mini_bed(2, patched=("host1",))
    code, doc = ddops_json(bed, results_dir, "bench", MINI_PLAN, "--all", "--run-id", "20261130-0000-refu")
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert code == 1 and doc["run_id"] == "20261130-0000-refu"
    assert hosts["host1"]["status"] == "changed"
    assert hosts["host2"]["status"] == "failed"
    message = hosts["host2"]["message"]
    assert "required patches not applied" in message
    assert all(f"{p} (pending)" in message for p in FIXES)
    assert not (bed.hosts[1].repo_dir / ".ddops" / "runs").exists()
    assert ddops(bed, results_dir, "bench", "stop", "20261130-0000-refu", "--yes").returncode == 0
    assert tagged("20261130-0000-refu") == []


def test_a_crashing_run_is_reported_with_its_exit_code_and_log_tail(mini_bed, results_dir, tmp_path):
    bed = mini_bed(1)
    plan = tmp_path / "crash-bench.yaml"
    plan.write_text((REPO_ROOT / "playbooks" / f"{MINI_PLAN}.yaml").read_text()
                    .replace("matrix:\n  dataset: [mini]", "matrix:\n  dataset: [no-such-dataset]")
                    .replace("target: [qwen3.5-hybrid, qwen3-attn]", "target: [qwen3-attn]")
                    .replace("name: mini-ddtree-bench", "name: crash-bench"))
    proc = ddops(bed, results_dir, "bench", str(plan), "--all", "--follow", "--run-id", "20261130-0000-boom",
                 timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "exit code 1" in proc.stdout and "no-such-dataset" in proc.stdout
    code, doc = ddops_json(bed, results_dir, "bench", "status", "20261130-0000-boom")
    run = doc["hosts"][0]["data"]["run"]
    assert code == 1 and run["status"] == "failed"
    assert [r["exit_code"] for r in run["runs"]] == [1]
    assert all("no-such-dataset" in r["log_tail"] and "Traceback" in r["log_tail"] for r in run["runs"])
    shown = ddops(bed, results_dir, "bench", "status", "20261130-0000-boom")
    assert shown.returncode == 1
    assert "failed with exit code 1" in shown.stdout and "Traceback" in shown.stdout
