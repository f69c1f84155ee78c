"""hybrid-tree-verify: DDTree's tree verification made exact on hybrid (Gated DeltaNet + full attention) targets.

The playbook on DDTree-shaped files (before -> after, applied twice, composed with the other built-ins in either
order, the real upstream sites), and the patched mini DDTree on the trained mini models: on the hybrid target its
greedy output equals the baseline's for every response at tree budgets 4, 8 and 16, where the unpatched one does
not; on the pure-attention target nothing changes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.patching.checks import run_checks
from ddops.patching.kinds import APPLIED, PENDING
from ddops.patching.plan import plan_file
from ddops.patching.playbook import load_playbook

FIXTURES = Path(__file__).parent / "fixtures" / "ddtree" / "hybrid-tree-verify"
REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "examples" / "mini-ddtree"
NAME = "hybrid-tree-verify"


def patches(name: str, path: str = "ddtree.py") -> list:
    return [p for p in load_playbook(name).patches if path in p.files]


def apply(source: bytes, *names: str) -> bytes:
    plan = plan_file("ddtree.py", source, [p for name in names for p in patches(name)])
    assert all(r.outcome.ok for r in plan.results), [r.outcome.message for r in plan.results]
    return plan.new


# --- the playbook on files --------------------------------------------------------------------------------------

@pytest.mark.parametrize("before", [FIXTURES / "before" / "ddtree.py", MINI / "ddtree.py"],
                         ids=["upstream-shaped fixture", "mini-ddtree"])
def test_the_playbook_is_pending_on_upstream_shaped_sites_then_applied_and_changes_nothing_twice(before):
    source = before.read_bytes()
    first = plan_file("ddtree.py", source, patches(NAME))
    assert [r.state for r in first.results] == [PENDING] * 3, [r.outcome.message for r in first.results]
    for patch in patches(NAME):
        results = run_checks("ddtree.py", source, first.new, patch.checks)
        assert results and all(r.ok for r in results), [(r.name, r.message) for r in results if not r.ok]
        assert not all(r.ok for r in run_checks("ddtree.py", source, source, patch.checks))
    second = plan_file("ddtree.py", first.new, patches(NAME))
    assert [r.state for r in second.results] == [APPLIED] * 3
    assert second.new == first.new and not second.changed


def test_the_fixture_turns_into_the_after_fixture():
    before = (FIXTURES / "before" / "ddtree.py").read_bytes()
    assert apply(before, NAME) == (FIXTURES / "after" / "ddtree.py").read_bytes()


def test_only_the_verify_forward_and_the_target_compaction_change_in_ddtree_generate():
    after = (FIXTURES / "after" / "ddtree.py").read_text()
    assert "output = _ddops_verify_tree(target, verify_input_ids, verify_position_ids, verify_attention_mask" in after
    assert "_ddops_commit_tree(target, past_key_values_target, start, accepted_indices, verify_input_ids)" in after
    # The hidden states for the draft are still read the upstream way, from the (now exact) verify output.
    assert ".index_select(1, accepted_index_tensor)" in after
    assert "def compact_dynamic_cache(" in after


@pytest.mark.parametrize("order", [("hybrid-cache", "crop-relative", NAME), (NAME, "hybrid-cache", "crop-relative")])
def test_it_composes_with_the_other_builtins_in_either_order(order):
    source = (MINI / "ddtree.py").read_bytes()
    new = apply(source, *order)
    compile(new, "ddtree.py", "exec")
    # crop-relative still finds exactly its 4 crops: the helper's own crop is spelled so that it does not match.
    again = plan_file("ddtree.py", new, [p for name in order for p in patches(name)])
    assert {r.state for r in again.results} == {APPLIED}
    for name in order:
        for patch in patches(name):
            assert all(r.ok for r in run_checks("ddtree.py", source, new, patch.checks)), (name, patch.id)


# --- the patched mini DDTree on the trained models ---------------------------------------------------------------

COMPARE = r"""
import importlib.util, json, sys, torch
sys.path.insert(0, ".")
from transformers import AutoModelForCausalLM
from dflash import dflash_generate
from model import ByteTokenizer, DFlashDraftModel, load_and_process_dataset

torch.set_num_threads(1)
name, samples, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
budgets = [int(b) for b in sys.argv[4].split(",")]

def load(module, path):
    spec = importlib.util.spec_from_file_location(module, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

generators = {"unpatched": load("ddtree_unpatched", "ddtree_unpatched.py").ddtree_generate,
              "patched": load("ddtree", "ddtree.py").ddtree_generate}
target = AutoModelForCausalLM.from_pretrained(f"models/{name}", dtype=torch.float32).eval()
draft = DFlashDraftModel.from_pretrained(f"models/{name}-draft", dtype=torch.float32).eval()
tokenizer = ByteTokenizer.from_pretrained(f"models/{name}")
prompts = [sample["turns"][0] for sample in load_and_process_dataset("mini")][:samples]
common = dict(model=draft, target=target, mask_token_id=draft.mask_token_id, max_new_tokens=tokens,
              stop_token_ids=[tokenizer.eos_token_id], temperature=0.0)
report = {}
for prompt in prompts:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    ids = tokenizer.encode(text, return_tensors="pt")
    baseline = dflash_generate(input_ids=ids, block_size=1, **common).output_ids
    for budget in budgets:
        for label, generate in generators.items():
            out = generate(input_ids=ids, block_size=draft.block_size, tree_budget=budget, **common)
            row = report.setdefault(f"{label}_tb{budget}", {"equal": 0, "responses": 0, "lengths": []})
            row["equal"] += int(torch.equal(out.output_ids, baseline))
            row["responses"] += 1
            row["lengths"].append(out.acceptance_lengths)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def trained_repo(tmp_path_factory) -> Path:
    """A copy of mini-ddtree with the trained models, the mini bench plan's playbooks, and ddtree.py twice: with
    hybrid-tree-verify (ddtree.py) and without (ddtree_unpatched.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.0")
    from tests.conftest import mini_ddtree_models

    models = mini_ddtree_models()
    repo = tmp_path_factory.mktemp("hybrid-tree-verify") / "ddtree"
    shutil.copytree(MINI, repo, ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    (repo / "models").symlink_to(models, target_is_directory=True)
    for name in ("hybrid-cache", "crop-relative", "cpu-timing"):
        for path in load_playbook(name).files:
            plan = plan_file(path, (repo / path).read_bytes(), patches(name, path))
            assert all(r.outcome.ok for r in plan.results), [r.outcome.message for r in plan.results]
            (repo / path).write_bytes(plan.new)
    (repo / "ddtree_unpatched.py").write_bytes((repo / "ddtree.py").read_bytes())
    (repo / "ddtree.py").write_bytes(apply((repo / "ddtree.py").read_bytes(), NAME))
    return repo


def compare(repo: Path, target: str, samples: int, tokens: int, budgets: str) -> dict:
    from tests.unit.test_mini_ddtree import bench_env

    result = subprocess.run([sys.executable, "-c", COMPARE, target, str(samples), str(tokens), budgets], cwd=repo,
                            env=bench_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def tau(row: dict) -> float:
    return sum(sum(lengths) / len(lengths) for lengths in row["lengths"]) / len(row["lengths"])


@pytest.mark.torch
def test_patched_ddtree_reproduces_the_baseline_on_the_hybrid_target_at_every_tree_budget(trained_repo):
    report = compare(trained_repo, "qwen3.5-hybrid", samples=3, tokens=40, budgets="4,8,16")
    for budget in (4, 8, 16):
        patched, unpatched = report[f"patched_tb{budget}"], report[f"unpatched_tb{budget}"]
        assert patched["equal"] == patched["responses"] == 3, (budget, patched["equal"])
        # Exact verification keeps the target on its own path, where the draft was trained: tau rises (the bench's
        # own tau, measured as the benchmark measures it).
        assert tau(patched) > tau(unpatched), (budget, tau(patched), tau(unpatched))
    # Without the playbook the tree leaks into the Gated DeltaNet state and the output leaves the baseline.
    assert sum(report[f"unpatched_tb{b}"]["equal"] for b in (4, 8, 16)) < 9, report


@pytest.mark.torch
def test_patched_ddtree_changes_nothing_on_the_pure_attention_target(trained_repo):
    report = compare(trained_repo, "qwen3-attn", samples=2, tokens=40, budgets="8")
    assert report["patched_tb8"]["equal"] == report["unpatched_tb8"]["equal"] == 2
    assert report["patched_tb8"]["lengths"] == report["unpatched_tb8"]["lengths"]
