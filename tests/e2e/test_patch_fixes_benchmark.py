"""End to end: on a testbed host, mini-DDTree's benchmark fails before the patches and completes after them.

Proven semantically, not by grep: the playbooks carry a `command` check that runs the benchmark on the host, so
`ddops verify` fails while the upstream bugs are there, and `ddops patch` only succeeds once the benchmark runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import MINI_DDTREE, REPO_ROOT, git_seed, requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, pytest.mark.torch, requires_sshd]

pytest.importorskip("transformers")

RUN_BENCHMARK = (
    "test -f models/qwen3.5-hybrid/config.json || python make_models.py --out models --target-steps 0 "
    "--distill-steps 0 >/dev/null; python benchmark.py --model-name-or-path models/qwen3.5-hybrid "
    "--draft-name-or-path models/qwen3.5-hybrid-draft --dataset mini "
    "--max-samples 1 --max-new-tokens 8 --tree-budget 4 --save-path runs/e2e.pt"
)


def playbook_with_benchmark_check(tmp_path: Path) -> Path:
    """The three built-in playbooks as one, the last patch also checking that the benchmark now runs."""
    patches = []
    for name in ("cpu-timing", "hybrid-cache", "crop-relative"):
        patches += yaml.safe_load((REPO_ROOT / "playbooks" / f"{name}.yaml").read_text())["patches"]
    patches[-1]["checks"].append({"kind": "command", "name": "mini-DDTree benchmark runs", "run": RUN_BENCHMARK,
                                  "timeout": 240})
    path = tmp_path / "mini-ddtree-fixed.yaml"
    path.write_text(yaml.safe_dump({"name": "mini-ddtree-fixed", "description": "the fixes, proven by running",
                                    "patches": patches}, sort_keys=False))
    return path


def check_output(doc: dict) -> str:
    return "\n".join(c.get("message", "") for c in doc["hosts"][0]["data"].get("checks", [])
                     if c.get("kind") == "command")


def test_benchmark_fails_unpatched_and_completes_once_patched(make_testbed, tmp_path):
    seed = git_seed(MINI_DDTREE, tmp_path / "seed")
    bed = make_testbed(1, seed=seed)
    playbook = playbook_with_benchmark_check(tmp_path)
    repo = bed.hosts[0].repo_dir

    def ddops(*args: str) -> tuple[int, dict]:
        proc = run_ddops("--json", *args, inventory=bed.inventory_path, timeout=400)
        return proc.returncode, json.loads(proc.stdout)

    # Unpatched: the benchmark dies in cuda_time() on a CPU-only host, as the real code does.
    code, doc = ddops("verify", "--all", str(playbook))
    assert code == 1
    assert "Torch not compiled with CUDA enabled" in check_output(doc)

    # With only the timing fix, the hybrid target's forward pass crashes on the config-less DynamicCache.
    assert ddops("patch", "--all", "cpu-timing")[0] == 0
    code, doc = ddops("verify", "--all", str(playbook))
    assert code == 1
    assert "IndexError" in check_output(doc)
    assert not (repo / "runs" / "e2e.pt").exists()

    # The rest of the fixes: the post-write check runs the benchmark, which now completes and saves its .pt.
    code, doc = ddops("patch", "--all", str(playbook))
    assert code == 0, doc
    assert doc["hosts"][0]["status"] == "changed"
    assert (repo / "runs" / "e2e.pt").stat().st_size > 0
    assert ddops("verify", "--all", str(playbook))[0] == 0

    # And rollback brings the original bytes (and so the crash) back.
    assert ddops("rollback", "--all")[0] == 0
    assert (repo / "dflash.py").read_bytes() == (seed / "dflash.py").read_bytes()
    assert (repo / "ddtree.py").read_bytes() == (seed / "ddtree.py").read_bytes()
