"""The built-in playbooks on the real upstream DDTree: sites, exactness and an exact rollback, through the ddops CLI.

Give it a checkout of liranringel/ddtree (the commit the playbooks target is c96427a). It copies the checkout twice
and, with a `connection: local` inventory (the same agent and journal as an ssh host), patches one copy with the
playbooks the README recommends for hybrids on a CPU (cpu-timing, hybrid-cache, crop-relative, hybrid-tree-verify:
"exact") and the other without hybrid-tree-verify ("lossy"). For each copy it checks the life of the patches:

    patch --check   every patch pending (the diff), nothing written
    patch           applied; a second patch changes nothing; status shows every patch applied; verify passes

then runs upstream's own dflash_generate and ddtree_generate (greedy) on the mini benchmark's trained targets
(a Qwen3.5-layout hybrid and a Qwen3 one) with upstream's own DFlashDraftModel class holding the mini draft's
weights, and compares each output with greedy decoding of the target that uses no cache at all (so no cache bug can
agree with itself). Last, `rollback` must give back upstream's files byte for byte.

    .venv/bin/python benchmarks/hybrid-tree-verify/upstream.py --upstream ~/src/ddtree [--prompts 3]
        [--max-new-tokens 40] [--budgets 4,8,16] [--python PY]

Upstream's files import loguru and datasets: `--python` names an interpreter that has them besides torch and
transformers 5 (default: this one). Nothing is downloaded: the models come from tests/conftest.py's cache, trained
there on first use. Prints a markdown table (the one in playbooks/README.md).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mini-ddtree"
UPSTREAM_FILES = ("ddtree.py", "dflash.py", "model/dflash.py")
LOSSY = ("cpu-timing", "hybrid-cache", "crop-relative")
EXACT = (*LOSSY, "hybrid-tree-verify")
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
       "PYTHONDONTWRITEBYTECODE": "1"}

# Tokenized in the mini example (its tokenizer and prompts), so the upstream run needs nothing of the example's code.
PROMPTS = r"""
import json, sys
sys.path.insert(0, ".")
from model import ByteTokenizer, load_and_process_dataset
tokenizer = ByteTokenizer.from_pretrained(sys.argv[1])
prompts = []
for sample in load_and_process_dataset("mini")[: int(sys.argv[2])]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": sample["turns"][0]}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    prompts.append(tokenizer.encode(text, return_tensors="pt")[0].tolist())
print(json.dumps({"prompts": prompts, "eos": tokenizer.eos_token_id}))
"""

# Runs in the patched upstream copy: upstream's own generate functions and draft class.
COMPARE = r"""
import json, sys, torch
sys.path.insert(0, ".")
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from model import DFlashDraftModel
import ddtree, dflash

torch.set_num_threads(1)
models, data, tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
budgets = [int(b) for b in sys.argv[4].split(",")]
report = {}
for name in ("qwen3.5-hybrid", "qwen3-attn"):
    target = AutoModelForCausalLM.from_pretrained(f"{models}/{name}", dtype=torch.float32).eval()
    draft = DFlashDraftModel.from_pretrained(f"{models}/{name}-draft", dtype=torch.float32).eval()
    # The mini's draft calls its attention `attn`, upstream's `self_attn`: the same weights under another name.
    weights = load_file(f"{models}/{name}-draft/model.safetensors")
    missing, unexpected = draft.load_state_dict({k.replace(".attn.", ".self_attn."): v for k, v in weights.items()},
                                                strict=False)
    if unexpected or any("rotary" not in k for k in missing):
        raise SystemExit(f"{name}-draft does not fit upstream's DFlashDraftModel: {missing} {unexpected}")
    common = dict(model=draft, target=target, mask_token_id=draft.mask_token_id, max_new_tokens=tokens,
                  stop_token_ids=[data["eos"]], temperature=0.0)
    for prompt in data["prompts"]:
        ids = torch.tensor([prompt])
        greedy = ids
        with torch.no_grad():
            for _ in range(tokens):
                token = target(greedy).logits[:, -1].argmax(-1, keepdim=True)
                greedy = torch.cat([greedy, token], 1)
                if token.item() == data["eos"]:
                    break
        runs = {"dflash": lambda: dflash.dflash_generate(input_ids=ids, block_size=draft.block_size, **common)}
        for budget in budgets:
            runs[f"ddtree {budget}"] = lambda b=budget: ddtree.ddtree_generate(
                input_ids=ids, block_size=draft.block_size, tree_budget=b, **common)
        for method, run in runs.items():
            row = report.setdefault(f"{name}|{method}", {"equal": 0, "responses": 0, "tau": [], "error": None})
            try:
                out = run()
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            row["equal"] += int(torch.equal(out.output_ids, greedy))
            row["responses"] += 1
            row["tau"].append(sum(out.acceptance_lengths) / len(out.acceptance_lengths))
    try:
        draft.spec_generate(target, torch.tensor([data["prompts"][0]]), tokens, [data["eos"]], 0.0)
        report[f"{name}|spec_generate"] = {"runs": True}
    except Exception as exc:
        report[f"{name}|spec_generate"] = {"runs": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
print(json.dumps(report))
"""


def ddops(inventory: Path, *args: str) -> dict:
    """One ddops command on the local host, its --json document (exit 3 is `--check` saying it would change)."""
    proc = subprocess.run([sys.executable, "-m", "ddops", "-i", str(inventory), "--json", *args, "--all"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"ddops {' '.join(args)}: exit {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    (host,) = json.loads(proc.stdout)["hosts"]
    return host


def life_of_the_patches(root: Path, label: str, upstream: Path, playbooks: tuple[str, ...]) -> tuple[Path, list[str]]:
    """A patched copy of upstream, and what went wrong on the way (empty when every step said what it should)."""
    repo = root / label
    shutil.copytree(upstream, repo, ignore=shutil.ignore_patterns(".git"))
    inventory = root / f"{label}.yaml"
    inventory.write_text(f"ssh_config: /dev/null\npatches: {json.dumps(list(playbooks))}\n"
                         f"hosts:\n  upstream: {{connection: local, repo: {json.dumps(str(repo))}}}\n")
    problems = []
    check = ddops(inventory, "patch", "--check")
    untouched = all(filecmp.cmp(repo / f, upstream / f, shallow=False) for f in UPSTREAM_FILES)
    if check["status"] != "changed" or not untouched:
        problems.append(f"patch --check: {check['status']}: {check['message']}")
    for attempt, wanted in (("first", "changed"), ("second", "ok")):
        host = ddops(inventory, "patch")
        if host["status"] != wanted:
            problems.append(f"{attempt} patch: {host['status']}: {host['message']}")
    status = ddops(inventory, "status")
    not_applied = {patch: state for patch, state in status["data"].get("patches", {}).items() if state != "applied"}
    if status["status"] != "ok" or not status["data"].get("patches") or not_applied:
        problems.append(f"status: {status['status']}: {status['message']} {not_applied}")
    verify = ddops(inventory, "verify")
    if verify["status"] != "ok":
        problems.append(f"verify: {verify['status']}: {verify['message']}")
    return repo, problems


def rolled_back_exactly(root: Path, label: str, repo: Path, upstream: Path) -> list[str]:
    host = ddops(root / f"{label}.yaml", "rollback")
    changed = [f for f in UPSTREAM_FILES if not filecmp.cmp(repo / f, upstream / f, shallow=False)]
    return ([f"rollback: {host['status']}: {host['message']}"] if host["status"] != "changed" else []) + \
        [f"rollback left {f} different from upstream's" for f in changed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=Path, required=True, help="a checkout of liranringel/ddtree")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--budgets", default="4,8,16")
    parser.add_argument("--python", default=sys.executable, help="an interpreter with loguru and datasets")
    args = parser.parse_args()
    upstream = args.upstream.expanduser().resolve()
    missing = [f for f in UPSTREAM_FILES if not (upstream / f).is_file()]
    if missing:
        raise SystemExit(f"{upstream}: not a DDTree checkout (no {', '.join(missing)})")
    probe = subprocess.run([args.python, "-c", "import loguru, datasets, transformers, torch"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        raise SystemExit(f"{args.python}: upstream's imports fail ({probe.stderr.strip().splitlines()[-1]}): "
                         "pip install loguru datasets there, or name another interpreter with --python")

    sys.path.insert(0, str(REPO))
    from tests.conftest import mini_ddtree_models

    models = mini_ddtree_models()
    env = {**os.environ, **ENV}
    data = subprocess.run([sys.executable, "-c", PROMPTS, str(models / "qwen3.5-hybrid"), str(args.prompts)],
                          cwd=EXAMPLE, env=env, capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="ddtree-upstream-") as tmp:
        root = Path(tmp)
        os.environ["DDOPS_CACHE_DIR"] = str(root / "cache")  # plans of this check stay out of the user's cache
        results, problems = {}, {}
        for label, playbooks in (("lossy", LOSSY), ("exact", EXACT)):
            repo, problems[label] = life_of_the_patches(root, label, upstream, playbooks)
            proc = subprocess.run([args.python, "-c", COMPARE, str(models), data, str(args.max_new_tokens),
                                   args.budgets], cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(f"{label}: upstream's generate failed: {proc.stderr[-3000:]}")
            results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
            problems[label] += rolled_back_exactly(root, label, repo, upstream)

    print(f"upstream: {upstream}")
    for label in ("lossy", "exact"):
        print(f"{label} ({', '.join(LOSSY if label == 'lossy' else EXACT)}): patch --check, patch, patch again, "
              f"status, verify, rollback: {'; '.join(problems[label]) or 'as expected'}")
    print("\n| target | method | = greedy, lossy | = greedy, exact | τ lossy | τ exact |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for key in results["exact"]:
        name, method = key.split("|")
        cells = []
        for label in ("lossy", "exact"):
            row = results[label][key]
            if method == "spec_generate":
                cells.append("runs" if row["runs"] else f"fails: {row['error']}")
            else:
                error = f" (error: {row['error']})" if row["error"] else ""
                cells.append(f"{row['equal']}/{row['responses']}{error}")
        taus = [results[label][key].get("tau") for label in ("lossy", "exact")]
        tau_cells = [f"{sum(t) / len(t):.2f}" if t else "" for t in taus]
        print(f"| {name} | {method} | {cells[0]} | {cells[1]} | {tau_cells[0]} | {tau_cells[1]} |")
    exact_ok = all(row["equal"] == row["responses"] > 0 and not row["error"]
                   for key, row in results["exact"].items() if not key.endswith("spec_generate")) and \
        all(row["runs"] for key, row in results["exact"].items() if key.endswith("spec_generate"))
    print(f"\nevery method equal to greedy with the exact set: {'PASS' if exact_ok else 'FAIL'}")
    if not exact_ok or any(problems.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
