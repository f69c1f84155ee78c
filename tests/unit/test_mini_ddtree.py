"""examples/mini-ddtree reproduces the upstream DDTree failures on a hybrid Qwen3.5 target, one per fix, and runs to
completion once all fixes are in. The fixes are applied here by plain string replacement on a copy of the example;
the example itself stays unpatched. See examples/mini-ddtree/PATCH_SITES.md for the sites."""

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
        text = line.sub(lambda m: f"{m[0]}{m[1]}past_key_values_target.activate_past_recording()\n", text)
        (repo / name).write_text(text)


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
    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.0")
    out = tmp_path_factory.mktemp("mini-ddtree-models")
    subprocess.run(
        [sys.executable, "make_models.py", "--out", str(out), "--distill-steps", "0"],
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
        [sys.executable, "benchmark.py", "--model-name-or-path", "models/target",
         "--draft-name-or-path", "models/draft", *BENCH_ARGS, "--save-path", "runs/out.pt"],
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
    assert_fails_with(result, "get_conv_state", "IndexError: list index out of range")


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
           "MASTER_PORT": str(free_port()), "TREE_BUDGET": "4,8", "MAX_NEW_TOKENS": "8"}
    result = subprocess.run(["bash", "run_benchmark.sh"], cwd=repo, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (saved,) = (repo / "runs").glob("*.pt")
    assert saved.name == "mini__models_target__models_draft__temp0.0__sdpa.pt"

    with torch.serialization.safe_globals([types.SimpleNamespace]):
        run = torch.load(saved, weights_only=True)
    assert set(run) == {"responses", "block_size", "target_attn_implementation", "draft_attn_implementation", "args"}
    assert run["block_size"] == 4
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


TREE_IS_LOSSLESS_ON_FULL_ATTENTION = r"""
import json, sys, torch
sys.path.insert(0, ".")
import make_models
from ddtree import ddtree_generate
from dflash import dflash_generate
from model import ByteTokenizer, load_and_process_dataset

make_models.TARGET_LAYER_TYPES = ["full_attention"] * 4
target = make_models.build_target(0)
draft = make_models.build_draft(0, 4)
make_models.distill_draft(target, draft, steps=200, seed=0)
tokenizer = ByteTokenizer()
report = []
for row in load_and_process_dataset("mini")[:3]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": row["turns"][0]}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer.encode(text, return_tensors="pt")
    common = dict(model=draft, target=target, input_ids=ids, mask_token_id=draft.mask_token_id,
                  max_new_tokens=24, stop_token_ids=[tokenizer.eos_token_id])
    base = dflash_generate(block_size=1, **common)
    for name, run in [("dflash", dflash_generate(block_size=4, **common)),
                      ("ddtree_tb8", ddtree_generate(block_size=4, tree_budget=8, **common))]:
        report.append({"method": name, "same": torch.equal(run.output_ids, base.output_ids),
                       "longest": max(run.acceptance_lengths)})
    spec = draft.spec_generate(target, ids, 24, [tokenizer.eos_token_id], 0.0)
    report.append({"method": "spec_generate", "same": torch.equal(spec, base.output_ids), "longest": 0})
print(json.dumps(report))
"""


@pytest.mark.torch
def test_dflash_and_ddtree_reproduce_the_baseline_exactly_on_a_full_attention_target(tmp_path, models):
    """The generators are lossless where the cache can be rolled back: divergence on the hybrid is Gated DeltaNet's."""
    repo = patched_copy(tmp_path, models, FIXES[:3])  # relative crops suffice without linear-attention layers
    result = subprocess.run([sys.executable, "-c", TREE_IS_LOSSLESS_ON_FULL_ATTENTION], cwd=repo, env=bench_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(entry["same"] for entry in report), report
    assert max(entry["longest"] for entry in report) > 1, "the draft never got a token accepted"
