#!/usr/bin/env python3
"""Plan-only microbenchmark: the time to plan N files cold (no plan cache) in a fresh process, no hosts involved.

    python benchmarks/fleet-speed/plan_bench.py [--files 1000] [--playbook scaling|hybrid-cache|crop-relative]
                                           [--engine fast|libcst] [--repo PATH] [--repeats 3]

Each run is a fresh `python -c` that imports the planner from --repo (default: this checkout; give another
checkout, e.g. `git worktree add /tmp/before <rev>`, to measure the code before a change), plans every file once
with a Planner without disk cache, and reports wall and CPU seconds, peak RSS and whether libcst was imported.
`--engine libcst` sets DDOPS_PLAN_ENGINE=libcst (the stdlib fast path off). Files: the fan-out benchmark's 1000
simulated modules (scaling) or mini-ddtree's ddtree.py and dflash.py repeated with a distinct comment each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

CHILD = r"""
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from pathlib import Path
from ddops.patching.plan import Planner
try:
    from ddops.patching.playbook import load_playbook
except ImportError:  # a checkout from before playbook.py moved into patching/ (a baseline run)
    from ddops.playbook import load_playbook
files = json.loads(Path(sys.argv[1]).read_text())
patches = load_playbook(sys.argv[2]).patches
planner = Planner()
states = {}
for path, text in files.items():
    touching = [p for p in patches if path in p.files]
    plan = planner.plan_file(path, text.encode(), touching)
    states[plan.state] = states.get(plan.state, 0) + 1
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "libcst": "libcst" in sys.modules, "states": states, "computed": planner.cache_misses}))
"""


def corpus(kind: str, count: int) -> tuple[dict[str, str], str]:
    """(path -> text, playbook path) for the named case."""
    if kind == "scaling":
        from run import SCALING_PLAYBOOK, scaling_files

        files = scaling_files("a")
        return {p: d.decode() for p, d in sorted(files.items())[:count]}, str(SCALING_PLAYBOOK)
    names = ("ddtree.py", "dflash.py")
    base = {n: (REPO / "examples" / "mini-ddtree" / n).read_text() for n in names}
    # Distinct contents (a comment differs), so no plan is shared: each costs a transform, as on a new commit.
    files = {f"{names[i % 2]}": base[names[i % 2]] + f"# copy {i}\n" for i in range(min(count, 2))}
    return files, str(REPO / "playbooks" / f"{kind}.yaml")


def run_once(files_json: Path, playbook: str, repo: Path, engine: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDOPS_")}
    env["PYTHONPATH"] = str(repo)
    if engine == "libcst":
        env["DDOPS_PLAN_ENGINE"] = "libcst"
    out = subprocess.run([sys.executable, "-c", CHILD, str(files_json), playbook], env=env, cwd=repo,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--playbook", default="scaling", help="scaling (1000 simulated modules) or a built-in playbook")
    p.add_argument("--engine", default="fast", choices=("fast", "libcst"))
    p.add_argument("--repo", default=str(REPO), help="the checkout whose planner is measured")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    files, playbook = corpus(args.playbook, args.files)
    with tempfile.TemporaryDirectory() as tmp:
        files_json = Path(tmp) / "files.json"
        files_json.write_text(json.dumps(files))
        runs = [run_once(files_json, playbook, Path(args.repo), args.engine) for _ in range(args.repeats)]
    walls = [r["wall"] for r in runs]
    print(json.dumps({"repo": args.repo, "engine": args.engine, "playbook": args.playbook, "files": len(files),
                      "wall_median": round(statistics.median(walls), 3), "wall_min": round(min(walls), 3),
                      "wall_max": round(max(walls), 3),
                      "cpu_median": round(statistics.median(r["cpu"] for r in runs), 3),
                      "rss_mb_max": round(max(r["rss_mb"] for r in runs), 1), "libcst_loaded": runs[0]["libcst"],
                      "states": runs[0]["states"], "computed": runs[0]["computed"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
