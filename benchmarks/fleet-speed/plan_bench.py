#!/usr/bin/env python3
"""Plan-only microbenchmark: the time to plan N files cold (no plan cache) in a fresh process, no hosts involved.

    python benchmarks/fleet-speed/plan_bench.py [--files 1000] [--playbook scaling|NAME[,NAME...]]
                                           [--engine fast|libcst] [--repo PATH] [--baseline-repo PATH] [--repeats 3]

Each run is a fresh `python -c` that imports the planner from --repo (default: this checkout), imports libcst, plans
every file once with a Planner without disk cache, and reports wall and CPU seconds (`libcst_s`: libcst's import
alone, `plan_s`: the planning after it: the one-time cost of a new content), peak RSS and whether libcst was used.
With --baseline-repo (another checkout, e.g. `git worktree add /tmp/before <rev>`; repeatable) the runs take turns
between the checkouts, so that all see the same load. `--engine libcst` sets DDOPS_PLAN_ENGINE=libcst (the stdlib
fast path off).
Files: the fan-out benchmark's 1000 simulated modules (scaling), or the mini-ddtree files the named built-in
playbooks patch (e.g. `cpu-timing,hybrid-cache,crop-relative`), each with a distinct comment.
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
patches = [p for name in sys.argv[2].split(",") for p in load_playbook(name).patches]
t1, c1 = time.perf_counter(), time.process_time()
import libcst
t2, c2 = time.perf_counter(), time.process_time()
planner = Planner()
states = {}
for path, text in files.items():
    touching = [p for p in patches if path in p.files]
    plan = planner.plan_file(path, text.encode(), touching)
    states[plan.state] = states.get(plan.state, 0) + 1
t3, c3 = time.perf_counter(), time.process_time()
print(json.dumps({"wall": t3 - t0, "cpu": c3 - c0, "libcst_s": t2 - t1, "plan_s": t3 - t2,
                  "libcst_cpu": c2 - c1, "plan_cpu": c3 - c2,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "libcst": "libcst" in sys.modules, "states": states, "computed": planner.cache_misses}))
"""


def corpus(kind: str, count: int) -> tuple[dict[str, str], str]:
    """(path -> text, playbook path) for the named case."""
    if kind == "scaling":
        from run import SCALING_PLAYBOOK, scaling_files

        files = scaling_files("a")
        return {p: d.decode() for p, d in sorted(files.items())[:count]}, str(SCALING_PLAYBOOK)
    sys.path.insert(0, str(REPO))
    from ddops.patching.playbook import load_playbook

    books = [str(REPO / "playbooks" / f"{name}.yaml") for name in kind.split(",")]
    names = dict.fromkeys(f for book in books for p in load_playbook(book).patches for f in p.files)
    mini = REPO / "examples" / "mini-ddtree"
    # Distinct contents (a comment differs), so no plan is shared: each costs a transform, as on a new commit.
    files = {n: (mini / n).read_text() + f"# copy {i}\n" for i, n in enumerate(names) if (mini / n).is_file()}
    return dict(list(files.items())[:count]), ",".join(books)


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
    p.add_argument("--baseline-repo", action="append", default=[],
                   help="another checkout, measured in turns with --repo (repeatable)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    files, playbook = corpus(args.playbook, args.files)
    repos = [args.repo, *args.baseline_repo]
    runs: dict[str, list[dict]] = {repo: [] for repo in repos}
    with tempfile.TemporaryDirectory() as tmp:
        files_json = Path(tmp) / "files.json"
        files_json.write_text(json.dumps(files))
        for _ in range(args.repeats):
            for repo in repos:
                runs[repo].append(run_once(files_json, playbook, Path(repo), args.engine))
    for repo, samples in runs.items():
        print(json.dumps({"repo": repo, "engine": args.engine, "playbook": args.playbook, "files": len(files),
                          **{f"{key}_{stat}": round(fn(r[key] for r in samples), 3)
                             for key in ("wall", "plan_s", "libcst_s", "plan_cpu", "libcst_cpu")
                             for stat, fn in (("median", statistics.median), ("min", min), ("max", max))},
                          "cpu_median": round(statistics.median(r["cpu"] for r in samples), 3),
                          "rss_mb_max": round(max(r["rss_mb"] for r in samples), 1),
                          "libcst_loaded": samples[0]["libcst"], "states": samples[0]["states"],
                          "computed": samples[0]["computed"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
