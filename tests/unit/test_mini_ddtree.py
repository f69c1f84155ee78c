"""examples/mini-ddtree reproduces the upstream DDTree failures on a hybrid Qwen3.5 target, one per fix, and runs to
completion once all fixes are in; its trained models reach the acceptance lengths of a real draft, and on the
pure-attention target every method reproduces the baseline token for token. The fixes are applied here by plain
string replacement on a copy of the example; the example itself stays unpatched. See
examples/mini-ddtree/PATCH_SITES.md for the sites."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mini-ddtree"

CACHE_TARGET = "past_key_values_target = DynamicCache()"
CACHE_DRAFT = "past_key_values_draft = DynamicCache()"
HYBRID_CACHE_TARGET = (
    'past_key_values_target = DynamicCache(config=target.config if hasattr(target, "config") else None)'
)
CUDA_TIME = "def cuda_time() -> float:\n    torch.cuda.synchronize()\n    return time.perf_counter()\n"
CUDA_TIME_FIXED = (
    "def cuda_time() -> float:\n    if torch.cuda.is_available():\n        torch.cuda.synchronize()\n"
    "    return time.perf_counter()\n"
)
CACHE_FILES = ["dflash.py", "ddtree.py", "model/dflash.py"]
# (file, receiver, argument expression, occurrences): every absolute crop, as upstream writes it.
CROP_SITES = [
    ("dflash.py", "past_key_values_draft", "start", 1),
    ("dflash.py", "past_key_values_target", "start", 1),
    ("ddtree.py", "past_key_values", "past_length", 1),
    ("ddtree.py", "past_key_values", "past_length + len(keep_current_indices)", 2),
    ("ddtree.py", "past_key_values_draft", "start", 1),
    ("model/dflash.py", "past_key_values_draft", "start", 1),
    ("model/dflash.py", "past_key_values_target", "start", 1),
]
BENCH_ARGS = ["--dataset", "mini", "--max-samples", "1", "--max-new-tokens", "8", "--tree-budget", "4"]
HYBRID, ATTN = "qwen3.5-hybrid", "qwen3-attn"
# At temperature 0 on the mini dataset: well above an untrained draft (tau ~1). The recipe trains the same models
# every time on one machine, but float rounding differs across CPUs: issue #14's 3.0 / 2.0 held on one machine and
# not on another (examples/mini-ddtree/README.md, "Acceptance floors").
DDTREE_TB8_TAU_FLOOR, DFLASH_TAU_FLOOR = 2.2, 1.8


def replace_exactly(path: Path, old: str, new: str, count: int) -> None:
    text = path.read_text()
    assert text.count(old) == count, f"{path.name}: expected {count} x {old!r}, found {text.count(old)}"
    path.write_text(text.replace(old, new))


def fix_cuda_time(repo: Path) -> None:
    replace_exactly(repo / "dflash.py", CUDA_TIME, CUDA_TIME_FIXED, 1)


def fix_hybrid_cache(repo: Path) -> None:
    for name in CACHE_FILES:
        replace_exactly(repo / name, CACHE_TARGET, HYBRID_CACHE_TARGET, 1)


def fix_relative_crop(repo: Path) -> None:
    """crop(n) keeps n tokens -> crop(-(length - n)) removes the surplus, and nothing when there is none."""
    for name, receiver, argument, count in CROP_SITES:
        length = f"{receiver}.get_seq_length()"
        relative = f"(None if {length} <= ({argument}) else {receiver}.crop(-({length} - ({argument}))))"
        replace_exactly(repo / name, f"{receiver}.crop({argument})", relative, count)


def fix_past_recording(repo: Path) -> None:
    """Linear-attention layers can only be cropped when they record past states (transformers 5.x)."""
    line = re.compile(rf"^( *){re.escape(HYBRID_CACHE_TARGET)}\n", re.M)
    for name in CACHE_FILES:
        text = (repo / name).read_text()
        assert len(line.findall(text)) == 1, name
        text = line.sub(lambda m: m[0] + "".join(f"{m[1]}{part}\n" for part in RECORD), text)
        (repo / name).write_text(text)


# 5.25+ asks how many per-token recurrent states a forward keeps for a crop; earlier releases take no count.
RECORD = ("try:", "    past_key_values_target.activate_past_recording(recurrent_states_to_keep=4096)",
          "except TypeError:", "    past_key_values_target.activate_past_recording()")
FIXES = [fix_cuda_time, fix_hybrid_cache, fix_relative_crop, fix_past_recording]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """Untrained models (seconds to build): enough for the failure modes, which happen before any number counts."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.0")
    out = tmp_path_factory.mktemp("mini-ddtree-models")
    subprocess.run(
        [sys.executable, "make_models.py", "--out", str(out), "--target-steps", "0", "--distill-steps", "0"],
        cwd=EXAMPLE, env=bench_env(), check=True, capture_output=True, text=True, timeout=300,
    )
    return out


def patched_copy(tmp_path: Path, models: Path, fixes) -> Path:
    repo = tmp_path / "ddtree"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    (repo / "models").symlink_to(models, target_is_directory=True)
    for fix in fixes:
        fix(repo)
    return repo


def run_benchmark_py(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmark.py", "--model-name-or-path", f"models/{HYBRID}",
         "--draft-name-or-path", f"models/{HYBRID}-draft", *BENCH_ARGS, "--save-path", "runs/out.pt"],
        cwd=repo, env=bench_env(), capture_output=True, text=True, timeout=300,
    )


def assert_fails_with(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0, result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr[-3000:]}"


def test_example_carries_the_upstream_patch_sites_verbatim():
    sources = {name: (EXAMPLE / name).read_text() for name in CACHE_FILES}
    for name, text in sources.items():
        stripped = [line.strip() for line in text.splitlines()]
        assert stripped.count(CACHE_TARGET) == 1 and stripped.count(CACHE_DRAFT) == 1, name
    assert sources["dflash.py"].count(CUDA_TIME) == 1
    for name, receiver, argument, count in CROP_SITES:
        stripped = [line.strip() for line in sources[name].splitlines()]
        assert stripped.count(f"{receiver}.crop({argument})") == count, (name, receiver, argument)
    all_crops = sum(text.count(".crop(") for text in sources.values())
    assert all_crops == sum(site[3] for site in CROP_SITES)


@pytest.mark.torch
def test_unpatched_benchmark_fails_in_cuda_time_on_a_cpu_host(tmp_path, models):
    result = run_benchmark_py(patched_copy(tmp_path, models, []))
    assert_fails_with(result, "in cuda_time", "torch.cuda.synchronize()")


@pytest.mark.torch
def test_with_cpu_safe_cuda_time_a_plain_dynamic_cache_fails_on_the_first_linear_attention_layer(tmp_path, models):
    result = run_benchmark_py(patched_copy(tmp_path, models, FIXES[:1]))
    assert_fails_with(result, "IndexError: list index out of range")
    # The first state the layer reads from the cache: its conv state up to 5.24, its recurrent state on 5.25.
    assert "get_conv_state" in result.stderr or "get_recurrent_state" in result.stderr, result.stderr[-3000:]


@pytest.mark.torch
def test_with_a_hybrid_cache_the_absolute_crop_fails(tmp_path, models):
    result = run_benchmark_py(patched_copy(tmp_path, models, FIXES[:2]))
    assert_fails_with(result, "past_key_values_target.crop(start)", "ValueError: Calling `crop` with a positive value")


@pytest.mark.torch
def test_past_recording_alone_does_not_excuse_the_absolute_crop(tmp_path, models):
    result = run_benchmark_py(patched_copy(tmp_path, models, [fix_cuda_time, fix_hybrid_cache, fix_past_recording]))
    assert_fails_with(result, "past_key_values_target.crop(start)", "ValueError: Calling `crop` with a positive value")


@pytest.mark.torch
def test_with_relative_crops_linear_attention_layers_refuse_to_crop_without_past_recording(tmp_path, models):
    result = run_benchmark_py(patched_copy(tmp_path, models, FIXES[:3]))
    assert_fails_with(result, "RuntimeError: `crop` was called, but the current layer does not track past states")


@pytest.mark.torch
def test_fully_fixed_benchmark_completes_through_torchrun_and_saves_the_documented_layout(tmp_path, models):
    import torch

    repo = patched_copy(tmp_path, models, FIXES)
    env = {**bench_env(), "PYTHON": sys.executable, "TORCHRUN": f"{sys.executable} -m torch.distributed.run",
           "MASTER_PORT": str(free_port()), "TREE_BUDGET": "4,8", "MAX_NEW_TOKENS": "8", "TASKS": "mini:2",
           "TARGET_STEPS": "0", "DISTILL_STEPS": "0"}  # the recipe the fixture built: make_models.py reuses it
    result = subprocess.run(["bash", "run_benchmark.sh"], cwd=repo, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved_files = sorted((repo / "runs").glob("*.pt"))
    assert [p.name for p in saved_files] == [
        f"mini__models_{ATTN}__models_{ATTN}-draft__temp0.0__sdpa.pt",
        f"mini__models_{HYBRID}__models_{HYBRID}-draft__temp0.0__sdpa.pt"]
    saved = saved_files[1]

    with torch.serialization.safe_globals([types.SimpleNamespace]):
        run = torch.load(saved, weights_only=True)
    assert set(run) == {"responses", "block_size", "target_attn_implementation", "draft_attn_implementation", "args"}
    assert run["block_size"] == 8
    assert (run["target_attn_implementation"], run["draft_attn_implementation"]) == ("sdpa", "sdpa")
    assert isinstance(run["args"], dict) and run["args"]["tree_budget"] == "4,8" and run["args"]["max_samples"] == 2
    assert len(run["responses"]) >= 2  # two samples, one row per turn
    fields = {"num_input_tokens", "num_output_tokens", "time_to_first_token", "time_per_output_token",
              "acceptance_lengths", "decode_rounds", "stage_times", "output_ids"}
    for response in run["responses"]:
        assert set(response) == {"baseline", "dflash", "ddtree_tb4", "ddtree_tb8"}
        prompt = response["baseline"].output_ids[0, : response["baseline"].num_input_tokens]
        for method in response.values():
            assert isinstance(method, types.SimpleNamespace) and fields <= set(vars(method))
            assert 1 <= method.num_output_tokens <= 8
            assert method.decode_rounds == len(method.acceptance_lengths) >= 1
            assert torch.equal(method.output_ids[0, : method.num_input_tokens], prompt)
        assert response["baseline"].acceptance_lengths == [1] * response["baseline"].decode_rounds


@pytest.fixture(scope="session")
def trained_models() -> Path:
    """The demo's trained models (tests/conftest.py caches them on disk while their recipe is unchanged)."""
    from tests.conftest import mini_ddtree_models

    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.0")
    return mini_ddtree_models()


def greedy_run(repo: Path, target: str, max_samples: int = 8, max_new_tokens: int = 64) -> dict:
    import torch

    save = repo / "runs" / f"{target}.pt"
    result = subprocess.run(
        [sys.executable, "benchmark.py", "--model-name-or-path", f"models/{target}", "--draft-name-or-path",
         f"models/{target}-draft", "--dataset", "mini", "--max-samples", str(max_samples), "--max-new-tokens",
         str(max_new_tokens), "--tree-budget", "8", "--temperature", "0", "--save-path", str(save)],
        cwd=repo, env=bench_env(), capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.serialization.safe_globals([types.SimpleNamespace]):
        return torch.load(save, weights_only=True)


def tau(run: dict, method: str) -> float:
    per_response = [sum(r[method].acceptance_lengths) / len(r[method].acceptance_lengths) for r in run["responses"]]
    return sum(per_response) / len(per_response)


@pytest.fixture(scope="module")
def greedy_runs(tmp_path_factory, trained_models) -> dict:
    """The patched benchmark, greedy, over the whole mini dataset, on both trained targets: {repo, runs}."""
    repo = patched_copy(tmp_path_factory.mktemp("trained"), trained_models, FIXES)
    return {"repo": repo, "runs": {target: greedy_run(repo, target) for target in (HYBRID, ATTN)}}


EXACT_ACCEPTANCE = r"""
import json, sys, types, torch
sys.path.insert(0, ".")
from transformers import AutoModelForCausalLM
from ddtree import build_ddtree_tree
from model import DFlashDraftModel, extract_context_feature
torch.set_num_threads(1)
name = sys.argv[1]
target = AutoModelForCausalLM.from_pretrained(f"models/{name}", dtype=torch.float32).eval()
draft = DFlashDraftModel.from_pretrained(f"models/{name}-draft", dtype=torch.float32).eval()
with torch.serialization.safe_globals([types.SimpleNamespace]):
    run = torch.load(f"runs/{name}.pt", weights_only=True)

def acceptance(prompt, continuation, budget):
    # Each round drafts from the exact target features of the accepted prefix (recomputed, never cached) and
    # accepts the longest drafted path the target's own greedy continuation follows, plus the target's next token.
    lengths, pos = [], 1  # the first generated token comes from the prefill
    while pos < len(continuation):
        prefix = torch.cat([prompt, continuation[:pos]])[None]
        hidden = target(prefix[:, :-1], output_hidden_states=True).hidden_states
        block = torch.full((1, draft.block_size), draft.mask_token_id)
        block[0, 0] = prefix[0, -1]
        out = draft(target_hidden=extract_context_feature(hidden, draft.target_layer_ids),
                    noise_embedding=target.model.embed_tokens(block),
                    position_ids=torch.arange(prefix.shape[1] - 1 + draft.block_size)[None])
        logits = target.lm_head(out[0, 1:])
        accepted = 0
        if budget is None:  # DFlash: one chain
            chain = logits.argmax(-1).tolist()
            while accepted < len(chain) and pos + accepted < len(continuation) \
                    and chain[accepted] == continuation[pos + accepted]:
                accepted += 1
        else:
            child_maps = build_ddtree_tree(logits, budget)[3]
            node = 0
            while pos + accepted < len(continuation) and int(continuation[pos + accepted]) in child_maps[node]:
                node = child_maps[node][int(continuation[pos + accepted])]
                accepted += 1
        lengths.append(accepted + 1)
        pos += accepted + 1
    return lengths

taus = {}
with torch.inference_mode():
    for method, budget in (("dflash", None), ("ddtree_tb8", 8)):
        per_response = []
        for response in run["responses"]:
            base = response["baseline"]
            ids = base.output_ids[0]
            lengths = acceptance(ids[: base.num_input_tokens], ids[base.num_input_tokens :], budget)
            per_response.append(sum(lengths) / len(lengths))
        taus[method] = sum(per_response) / len(per_response)
print(json.dumps(taus))
"""


def exact_tau(repo: Path, target: str) -> dict[str, float]:
    """tau as a lossless verifier would measure it: the draft against the baseline's own greedy output."""
    result = subprocess.run([sys.executable, "-c", EXACT_ACCEPTANCE, target], cwd=repo, env=bench_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.torch
def test_trained_drafts_reach_the_acceptance_length_floors_on_the_pure_attention_target(greedy_runs):
    run = greedy_runs["runs"][ATTN]
    assert len(run["responses"]) == 9  # eight prompts, one of them two turns
    taus = {m: tau(run, m) for m in ("ddtree_tb8", "dflash")}
    assert taus["ddtree_tb8"] >= DDTREE_TB8_TAU_FLOOR and taus["dflash"] >= DFLASH_TAU_FLOOR, taus


@pytest.mark.torch
def test_exact_verification_measures_the_same_tau_as_the_benchmark_where_verification_is_lossless(greedy_runs):
    exact = exact_tau(greedy_runs["repo"], ATTN)
    for method in ("dflash", "ddtree_tb8"):
        assert exact[method] == pytest.approx(tau(greedy_runs["runs"][ATTN], method), abs=0.1), method


@pytest.mark.torch
def test_the_hybrid_targets_draft_reaches_the_floors_under_exact_verification(greedy_runs):
    """On the hybrid the benchmark's own tau is lower: rejected drafts and tree siblings stay in the Gated DeltaNet
    state and lead the target astray (see the README's figures). The models themselves are as good as the
    pure-attention pair: measured against the target's own greedy output, the draft reaches the floors."""
    exact = exact_tau(greedy_runs["repo"], HYBRID)
    assert exact["ddtree_tb8"] >= DDTREE_TB8_TAU_FLOOR, exact
    assert exact["dflash"] >= DFLASH_TAU_FLOOR, exact


@pytest.mark.torch
def test_on_the_pure_attention_target_every_method_reproduces_the_baseline_exactly(greedy_runs):
    """Where every cache layer can be rolled back, speculation is lossless: divergence on the hybrid is Gated
    DeltaNet's recurrent state, not the generators'."""
    import torch

    for response in greedy_runs["runs"][ATTN]["responses"]:
        for method in ("dflash", "ddtree_tb8"):
            assert torch.equal(response[method].output_ids, response["baseline"].output_ids), method
