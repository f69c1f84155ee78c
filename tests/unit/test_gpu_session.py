"""The GPU session of issue 36, checked on the CPU: gpu_prepare.py makes the carry (offline), gpu_session.py --dry runs
every step at toy size (gpu.py's figures, ddops on a `connection: local` host), and the benchmark itself runs with
ddops, libcst and paramiko unimportable, as on the GPU machine's image."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import MINI_DDTREE, REPO_ROOT

BENCH = REPO_ROOT / "benchmarks" / "hybrid-tree-verify"
GPU = BENCH / "gpu.py"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
# gpu.py run with the controller's packages made unimportable (a meta path finder ahead of every other).
BLOCKED = r"""
import runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ddops", "libcst", "paramiko"):
            raise ImportError(f"{name} is not on the GPU machine's image")
sys.meta_path.insert(0, Refuse())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def gpu_module():
    spec = importlib.util.spec_from_file_location("hybrid_gpu", GPU)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def carry(tmp_path_factory) -> Path:
    """gpu_prepare.py --offline: ddops' wheel, untrained mini models, the patched mini-DDTree copy."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.0")
    root = tmp_path_factory.mktemp("gpu-carry")
    models = root / "models"
    subprocess.run([sys.executable, "make_models.py", "--out", str(models), "--target-steps", "0",
                    "--distill-steps", "0"], cwd=MINI_DDTREE, env={**os.environ, **OFFLINE}, check=True,
                   capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, str(BENCH / "gpu_prepare.py"), "--offline", "--carry", str(root / "carry"),
                           "--models", str(models)], env={**os.environ, **OFFLINE}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return root / "carry"


def test_the_trees_paths_come_first_through_the_accepted_path_then_by_new_nodes():
    gpu = gpu_module()
    parents = [-1, 0, 1, 2, 0, 4, 1, 6]  # 0 -> 1 -> 2 -> 3, 0 -> 4 -> 5, 1 -> 6 -> 7
    assert gpu.root_paths(parents)[7] == [0, 1, 6, 7]
    ordered = gpu.leaves_by_coverage(parents, [0, 1, 6])
    assert ordered[0] == [0, 1, 6, 7]
    assert sorted(map(tuple, ordered)) == [(0, 1, 2, 3), (0, 1, 6, 7), (0, 4, 5)]
    assert ordered[1] == [0, 1, 2, 3] or ordered[1] == [0, 4, 5]  # each adds 2 new nodes


@pytest.mark.parametrize("argv, message", [
    (["--layers", "6"], "--layers must be a positive multiple of 4"),
    (["--budgets", "0"], "must be positive"),
    (["--contexts", "8k"], "comma-separated whole numbers"),
    (["--layout", "70b"], "invalid choice: '70b'"),
])
def test_the_gpu_mode_refuses_bad_arguments_before_building_anything(argv, message):
    result = subprocess.run([sys.executable, str(GPU), *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.torch
def test_the_dry_session_runs_every_step_on_the_cpu_and_brings_back_its_figures(carry, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(BENCH / "gpu_session.py"), "--dry", "--carry", str(carry), "--out",
                           str(out), "--work", str(tmp_path / "work")], env={**os.environ, **OFFLINE},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"hybrid-gpu.json", "session.json", "session.log", "outputs.tar.gz"} <= set(files)

    figures = json.loads((out / "hybrid-gpu.json").read_text())
    assert figures["stopped"] is None and figures["controller_imports"] == []
    assert figures["model"]["layers"] == 4 and figures["model"]["linear_attention_layers"] == 3
    assert {"torch", "transformers", "triton", "flash-linear-attention", "cuda", "driver", "device"} <= \
        set(figures["versions"])
    assert "no CUDA device" in figures["kernels"]["lossy-fla_skipped"]
    assert [(c["context"], c["budget"], c["nodes"]) for c in figures["cases"]] == [(48, 16, 17), (48, 64, 65)]
    for case in figures["cases"]:
        assert case["new_verify_path"] == "one-forward" and case["baseline"] == "lossy-torch"
        assert "no CUDA device" in case["methods"]["lossy-fla"]["skipped"]
        for method in ("lossy-torch", "paths", "new"):
            timed = case["methods"][method]
            assert timed["median_ms"] > 0 and len(timed["samples_ms"]) == 1, (method, timed)
        assert set(case["ratios"]) == {"paths/lossy-torch", "new/lossy-torch"}
        exact = case["exactness"]
        assert exact["nodes_checked"] == exact["of_nodes"] == case["nodes"]
        for method in ("paths", "new"):  # fp32 on the CPU: the exact verifiers agree with the cache-free forward
            assert exact[method]["share"] == 1.0 and exact[method]["max_logit_gap"] < 1e-4, (method, exact)
        assert exact["lossy-fla"] is None and exact["lossy-torch"]["nodes"] == case["nodes"]
    (chain,) = figures["chains"]
    assert chain["chain_block"] == 16 and chain["fold_max_state_diff"] <= 1e-5 and chain["fold_ms"] > 0, chain
    if chain["native_recording"]:  # 5.25+: transformers' own per-token recording, exact for a chain too
        assert chain["native_max_state_diff"] <= 1e-5 and chain["native_held_mib"] > chain["fold_held_mib"], chain

    table = subprocess.run([sys.executable, str(GPU), "--table", str(out / "hybrid-gpu.json")], capture_output=True,
                           text=True, timeout=60).stdout
    assert [line.split(" | ")[:2] for line in table.splitlines() if line.startswith("| 48 ")] == \
        [["| 48", "16"], ["| 48", "64"]] * 2 + [["| 48", "16"]], table  # time, exactness, DFlash's chain
    session = json.loads((out / "session.json").read_text())
    statuses = {step["step"]: step["status"] for step in session["steps"]}
    assert statuses["fla"] == "skipped" and statuses["gpu.py"] == 0 and statuses["install ddops"] == 0, statuses
    assert all(status in (0, "skipped") for status in statuses.values()), statuses
    ddops = session["ddops"]
    assert ddops["versions"]["ddops"] and ddops["versions"]["libcst"] and ddops["ping"]["gpus"] == []
    assert ddops["patch"]["status"] == "changed" and ddops["verify"]["status"] == "ok"
    assert ddops["device_for_benchmark"] == "cpu"  # `ddops exec` asked the host's interpreter
    assert ddops["bench"]["run"]["status"] == "completed", ddops["bench"]
    assert ddops["collect"]["manifest"]["gpu"] == {"model": None, "count": 0, "driver": None, "state": {
        "cuda_driver": None, "gpus": [], "issues": [], "torch_cuda": None}}  # the GPUs' state at launch: none
    methods = {row["method"] for row in ddops["report"]["rows"]}
    assert {"baseline", "dflash", "ddtree_tb4", "ddtree_tb8"} <= methods, ddops["report"]
    with tarfile.open(out / "outputs.tar.gz") as archive:
        names = archive.getnames()
    assert "ddops/report.json" in names and "bench/hybrid-gpu.json" in names and "inventory.yaml" in names


@pytest.mark.torch
def test_the_benchmark_runs_in_bf16_with_the_controllers_packages_unimportable_and_profiles_on_request(carry, tmp_path):
    repo = carry / "mini-exact"
    out = tmp_path / "figures"
    done = subprocess.run([sys.executable, "-c", BLOCKED, str(GPU), "--device", "cpu", "--dtype", "bfloat16",
                           "--layout", "tiny", "--contexts", "40", "--budgets", "8", "--repeats", "1",
                           "--prefill-chunk", "16", "--profile-over", "0", "--out", str(out)], cwd=repo,
                          env={**os.environ, **OFFLINE},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((out / "hybrid-gpu.json").read_text())
    assert figures["controller_imports"] == [] and figures["model"]["dtype"] == "bfloat16"  # the GPU's dtype
    (case,) = figures["cases"]
    assert case["exactness"]["new"]["nodes"] == case["nodes"]  # bf16: how many agree is a figure, not a check
    profile = case["profile"]
    assert set(profile["sections_ms"]) == {"new", "lossy-torch"}
    for sections in profile["sections_ms"].values():
        assert {"linear_attention", "full_attention", "mlp", "verify", "commit"} <= set(sections)
        assert sections["linear_attention"] > 0 and sections["verify"] >= sections["linear_attention"]
    assert "linalg_solve_triangular" in (out / profile["table"]).read_text()


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fixture", ["h100-busy", "legacy-driver"])
def test_the_sessions_capture_answers_the_agent_as_the_host_it_was_captured_on(fixture, tmp_path, monkeypatch):
    # The session saves the agent's own queries as a fixture folder; a fake nvidia-smi serving that folder must give
    # the agent's parsers what the machine itself gave them (here the "machine" is a fake serving a known fixture).
    from tests.gpu_fixtures import fake_gpu_bin

    session_module = load(BENCH / "gpu_session.py", "gpu_session")
    agent = load(REPO_ROOT / "remote" / "ddops_agent" / "gpus.py", "agent_gpus")

    def as_the_agent_sees(bin_dir: Path) -> tuple:
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        seen = agent.query_gpus(), agent.gpu_health()
        monkeypatch.undo()
        return seen

    machine = fake_gpu_bin(tmp_path / "machine", fixture)
    monkeypatch.setenv("PATH", f"{machine}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "work").mkdir()
    statuses = session_module.capture_gpu_fixture(session_module.Session(tmp_path / "work", 60),
                                                  tmp_path / "captured")
    monkeypatch.undo()
    assert statuses["query-gpu.csv"] == 0 and statuses["query-compute-apps.csv"] == 0
    replay = tmp_path / "replay"
    fake_gpu_bin(replay, fixture)
    for old in (replay / "fixture").iterdir():
        old.unlink()
    for new in (tmp_path / "captured").iterdir():
        (replay / "fixture" / new.name).write_bytes(new.read_bytes())
    original = as_the_agent_sees(machine)
    assert original[0][0] and original[0][1] is None  # GPUs listed, no error: a capture worth comparing
    assert as_the_agent_sees(replay) == original
