"""hybrid-tree-verify on the mini benchmark: fidelity, tau, verification cost and time per token, lossy vs exact.

Copies examples/mini-ddtree twice and applies the playbooks the mini bench plan requires (hybrid-cache,
crop-relative, cpu-timing) to both and hybrid-tree-verify to one ("exact"), then in one run:

1. benchmark.py greedy on both trained targets in both copies: per method (DFlash, DDTree at each budget) the
   responses equal to the baseline's, tau, and the time per output token relative to the baseline's in the same run;
2. step.py in the exact copy: the cost of one verification step (verify + commit) for the lossy step, the
   batch-of-paths reference and the one-forward verify, timed round-robin on the same tree, medians;
3. the issue's targets, each PASS or FAIL: every exact method equal to the baseline on both targets, the new step
   <= 1.15x the lossy step at every budget (CPU-time medians), DDTree at budget >= 8 faster per token than the
   baseline on the hybrid.

    .venv/bin/python benchmarks/hybrid-tree-verify/run.py [--budgets 4,8,16,32,64] [--max-new-tokens 64]
        [--max-samples 8] [--step-repeats 30] [--step-only] [--keep DIR]
    .venv/bin/python benchmarks/hybrid-tree-verify/run.py --device cuda [gpu.py's options]   # see gpu.py

The models come from tests/conftest.py's cache (.cache/mini-ddtree-models, or $DDOPS_MINI_MODELS), trained there on
first use. Prints markdown tables (the ones in playbooks/README.md).
"""

from __future__ import annotations

import argparse
import json
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
STEP_LIMIT = 1.15  # the bound on the new step, relative to the lossy one
ENV = {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


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


def prepare(root: Path, label: str, models: Path | None, playbooks: tuple[str, ...]) -> Path:
    repo = root / label
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    if models is not None:
        (repo / "models").symlink_to(models, target_is_directory=True)
    patch_repo(repo, playbooks)
    return repo


def run(repo: Path, target: str, budgets: str, max_new_tokens: int, max_samples: int) -> dict:
    import torch

    save = repo / "runs" / f"{target}.pt"
    result = subprocess.run(
        [sys.executable, "benchmark.py", "--model-name-or-path", f"models/{target}", "--draft-name-or-path",
         f"models/{target}-draft", "--dataset", "mini", "--max-samples", str(max_samples), "--max-new-tokens",
         str(max_new_tokens), "--tree-budget", budgets, "--temperature", "0", "--save-path", str(save)],
        cwd=repo, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{repo.name}/{target}: benchmark.py failed:\n{result.stderr[-3000:]}")
    with torch.serialization.safe_globals([types.SimpleNamespace]):
        return torch.load(save, weights_only=True)


def figures(run_: dict, method: str) -> tuple[int, int, float, float]:
    """(responses equal to the baseline, responses, tau, time per output token / the baseline's)."""
    import torch

    responses = run_["responses"]
    same = sum(torch.equal(r[method].output_ids, r["baseline"].output_ids) for r in responses)
    taus = [sum(r[method].acceptance_lengths) / len(r[method].acceptance_lengths) for r in responses]
    per_token = sum(r[method].time_per_output_token for r in responses)
    baseline = sum(r["baseline"].time_per_output_token for r in responses)
    return same, len(responses), sum(taus) / len(taus), per_token / baseline


def steps(repo: Path, target: str, budgets: str, repeats: int) -> list[dict]:
    result = subprocess.run([sys.executable, str(Path(__file__).with_name("step.py")), target, budgets, str(repeats)],
                            cwd=repo, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"step.py {target} failed:\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="4,8,16,32,64")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-samples", type=int, default=8)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument("--step-repeats", type=int, default=30, help="timings per method for step.py's medians")
    parser.add_argument("--step-only", action="store_true", help="only the per-step cost (step.py), no full runs")
    parser.add_argument("--device", default="cpu", help="cuda: the GPU mode (gpu.py, a random-initialised "
                                                        "Qwen3.5-shaped target); other options go to gpu.py")
    args, rest = parser.parse_known_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="hybrid-tree-verify-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.device != "cpu":
        repo = prepare(root, "exact", None, BASE_PLAYBOOKS + ("hybrid-tree-verify",))
        code = subprocess.run([sys.executable, str(Path(__file__).with_name("gpu.py")), "--device", args.device,
                               *rest], cwd=repo, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}).returncode
        raise SystemExit(code)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    sys.path.insert(0, str(REPO))
    from tests.conftest import mini_ddtree_models

    models = mini_ddtree_models()
    repos = {"lossy": prepare(root, "lossy", models, BASE_PLAYBOOKS),
             "exact": prepare(root, "exact", models, BASE_PLAYBOOKS + ("hybrid-tree-verify",))}
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    methods = ["dflash", *(f"ddtree_tb{b}" for b in budgets)]
    verdicts: list[tuple[str, bool]] = []

    if not args.step_only:
        print("| target | method | = baseline, lossy | = baseline, exact | τ lossy | τ exact | "
              "time/token vs baseline, lossy | exact |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for target in TARGETS:
            runs = {label: run(repo, target, args.budgets, args.max_new_tokens, args.max_samples)
                    for label, repo in repos.items()}
            for method in methods:
                (lossy_same, total, lossy_tau, lossy_time), (same, _, tau, time_) = (
                    figures(runs["lossy"], method), figures(runs["exact"], method))
                print(f"| {target} | {method.replace('ddtree_tb', 'ddtree ')} | {lossy_same}/{total} | "
                      f"{same}/{total} | {lossy_tau:.2f} | {tau:.2f} | {lossy_time:.2f}x | {time_:.2f}x |")
                verdicts.append((f"{target} {method}: exact output = baseline ({same}/{total})", same == total))
                if target == TARGETS[0] and method.startswith("ddtree_tb") and int(method[9:]) >= 8:
                    verdicts.append((f"{target} {method}: faster per token than the baseline ({time_:.2f}x)",
                                     time_ < 1.0))
        print()

    print("| target | verifier | budget | nodes (paths × depth) | lossy ms | paths ms | new ms | "
          "paths / lossy | new / lossy |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for target in TARGETS:
        for row in steps(repos["exact"], target, ",".join(budgets), args.step_repeats):
            new_ratio = row["new_cpu_ms"] / row["lossy_cpu_ms"]
            paths = (f"{row['paths_cpu_ms']:.1f} ({row['paths_ms']:.1f}) | "
                     f"{row['paths_cpu_ms'] / row['lossy_cpu_ms']:.2f}x") if "paths_ms" in row else "— | —"
            paths_cell, paths_ratio = paths.split(" | ")
            print(f"| {target} | {row['method']} | {row['budget']} | {row['nodes']} ({row['paths']} × "
                  f"{row['depth']}) | {row['lossy_cpu_ms']:.1f} ({row['lossy_ms']:.1f}) | {paths_cell} | "
                  f"{row['new_cpu_ms']:.1f} ({row['new_ms']:.1f}) | {paths_ratio} | {new_ratio:.2f}x |")
            verdicts.append((f"{target} {row['method']} budget {row['budget']}: new step {new_ratio:.2f}x the lossy "
                             f"step (<= {STEP_LIMIT}x)", new_ratio <= STEP_LIMIT))
    print("\nms: median CPU time of one step (median wall time in parentheses; other jobs load this machine). "
          "Without linear layers the playbook never takes the reference path (—).\n")
    for text, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if not args.keep:
        shutil.rmtree(root)
    raise SystemExit(0 if all(ok for _, ok in verdicts) else 1)


if __name__ == "__main__":
    main()
