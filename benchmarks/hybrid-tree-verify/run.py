"""hybrid-tree-verify on the mini benchmark: fidelity, tau and verification cost, with and without the playbook.

Copies examples/mini-ddtree twice, applies the playbooks the mini bench plan requires (hybrid-cache, crop-relative,
cpu-timing) to both and hybrid-tree-verify to one, runs benchmark.py greedy on both trained targets, and prints per
target and tree budget: responses equal to the baseline's, tau, and the seconds per decode round spent in
verification (the verify and commit stages, which the playbook changes), and the mean time per output token; then
step.py's cost of one verification step, original vs patched, timed alternately on the same tree.

    .venv/bin/python benchmarks/hybrid-tree-verify/run.py [--budgets 4,8,16] [--max-new-tokens 64] [--keep DIR]
        [--step-only] [--step-repeats 30]

The models come from tests/conftest.py's cache (.cache/mini-ddtree-models), trained there on first use.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mini-ddtree"
TARGETS = ("qwen3.5-hybrid", "qwen3-attn")
BASE_PLAYBOOKS = ("hybrid-cache", "crop-relative", "cpu-timing")


def patch_repo(repo: Path, playbooks: tuple[str, ...]) -> None:
    """Apply built-in playbooks to the copy with ddops' own planner (the same code `ddops patch` runs)."""
    from ddops.patching.plan import plan_file
    from ddops.patching.playbook import load_playbook

    for name in playbooks:
        book = load_playbook(name)
        for path in book.files:
            plan = plan_file(path, (repo / path).read_bytes(), [p for p in book.patches if path in p.files])
            bad = [r.outcome.message for r in plan.results if not r.outcome.ok]
            if bad:
                raise SystemExit(f"{name}: {bad}")
            (repo / path).write_bytes(plan.new)


def prepare(root: Path, label: str, models: Path, playbooks: tuple[str, ...]) -> Path:
    repo = root / label
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    (repo / "models").symlink_to(models, target_is_directory=True)
    patch_repo(repo, playbooks)
    return repo


def run(repo: Path, target: str, budgets: str, max_new_tokens: int, max_samples: int) -> dict:
    import torch

    save = repo / "runs" / f"{target}.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "benchmark.py", "--model-name-or-path", f"models/{target}", "--draft-name-or-path",
         f"models/{target}-draft", "--dataset", "mini", "--max-samples", str(max_samples), "--max-new-tokens",
         str(max_new_tokens), "--tree-budget", budgets, "--temperature", "0", "--save-path", str(save)],
        cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{repo.name}/{target}: benchmark.py failed:\n{result.stderr[-3000:]}")
    with torch.serialization.safe_globals([types.SimpleNamespace]):
        return torch.load(save, weights_only=True)


def figures(run_: dict, method: str) -> tuple[int, int, float, float, float]:
    """(responses equal to the baseline, responses, tau, seconds of verify+commit per decode round, seconds per
    output token)."""
    import torch

    responses = run_["responses"]
    same = sum(torch.equal(r[method].output_ids, r["baseline"].output_ids) for r in responses)
    taus = [sum(r[method].acceptance_lengths) / len(r[method].acceptance_lengths) for r in responses]
    # The first round's draft is the draft's prefill and not timed; verify/commit are timed every round.
    seconds = sum(r[method].stage_times["verify"] + r[method].stage_times["commit"] for r in responses)
    rounds = sum(r[method].decode_rounds for r in responses)
    per_token = sum(r[method].time_per_output_token for r in responses) / len(responses)
    return same, len(responses), sum(taus) / len(taus), seconds / max(rounds, 1), per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="4,8,16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-samples", type=int, default=8)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument("--step-repeats", type=int, default=30, help="timings per method for step.py's medians")
    parser.add_argument("--step-only", action="store_true", help="only the per-step cost (step.py), no full runs")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from tests.conftest import mini_ddtree_models

    models = mini_ddtree_models()
    root = args.keep or Path(tempfile.mkdtemp(prefix="hybrid-tree-verify-"))
    root.mkdir(parents=True, exist_ok=True)
    repos = {"unpatched": prepare(root, "unpatched", models, BASE_PLAYBOOKS),
             "patched": prepare(root, "patched", models, BASE_PLAYBOOKS + ("hybrid-tree-verify",))}
    methods = [f"ddtree_tb{b.strip()}" for b in args.budgets.split(",") if b.strip()]
    print(f"{'target':16} {'method':12} {'run':10} {'= baseline':>10} {'tau':>6} {'ms verify+commit/round':>23} {'ms/token':>9}")
    for target in TARGETS if not args.step_only else ():
        runs = {label: run(repo, target, args.budgets, args.max_new_tokens, args.max_samples)
                for label, repo in repos.items()}
        for method in methods:
            for label, run_ in runs.items():
                same, total, tau, per_round, per_token = figures(run_, method)
                print(f"{target:16} {method:12} {label:10} {same:>4}/{total:<5} {tau:6.2f} {per_round * 1e3:23.2f}"
                      f" {per_token * 1e3:9.2f}")
    print()
    for target in TARGETS:
        result = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("step.py")), target, args.budgets, str(args.step_repeats)],
            cwd=repos["patched"], env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
                                       "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            raise SystemExit(f"step.py {target} failed:\n{result.stderr[-3000:]}")
        lines = result.stdout.strip().splitlines()
        print("\n".join(lines if target == TARGETS[0] else lines[1:]))
    if not args.keep:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
