"""hybrid-tree-verify: DDTree's and DFlash's verification made exact on hybrid (Gated DeltaNet + full attention)
targets, in one forward.

The playbook on DDTree-shaped files (before -> after, applied twice, composed with the other built-ins in either
order, the real upstream sites); the one-forward verifier the playbook inserts against the batch-of-paths reference
on tiny random-initialised targets (trees of every shape, grouped-query heads, caches with and without recorded conv
windows), each fallback guard taken on purpose; and the patched mini DDTree and DFlash on the trained mini models:
on the hybrid target their greedy output equals the baseline's for every response, where the unpatched ones do not;
on the pure-attention target nothing changes.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.patching.checks import run_checks
from ddops.patching.kinds import APPLIED, PENDING
from ddops.patching.plan import plan_file
from ddops.patching.playbook import load_playbook
from tests.unit.test_mini_ddtree import models, trained_models  # noqa: F401 - fixtures: the mini models, built once

FIXTURES = Path(__file__).parent / "fixtures" / "ddtree" / "hybrid-tree-verify"
REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "examples" / "mini-ddtree"
NAME = "hybrid-tree-verify"
FILES = ("ddtree.py", "dflash.py", "model/dflash.py")
SITES = {"ddtree.py": 5, "dflash.py": 4, "model/dflash.py": 3}  # the playbook's patches that touch each file


def patches(name: str, path: str = "ddtree.py") -> list:
    return [p for p in load_playbook(name).patches if path in p.files]


def apply(source: bytes | None, *names: str, path: str = "ddtree.py") -> bytes:
    plan = plan_file(path, source, [p for name in names for p in patches(name, path)])
    assert all(r.outcome.ok for r in plan.results), [r.outcome.message for r in plan.results]
    return plan.new


def patch_repo(repo: Path, *names: str) -> None:
    """Each playbook applied to repo in turn, as `ddops patch` writes it (the module it adds included)."""
    for name in names:
        for path in load_playbook(name).files:
            if (repo / path).is_file() or path.endswith(".py"):
                before = (repo / path).read_bytes() if (repo / path).is_file() else None
                (repo / path).write_bytes(apply(before, name, path=path))


# --- the playbook on files --------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", FILES)
@pytest.mark.parametrize("root", [FIXTURES / "before", MINI], ids=["upstream-shaped fixture", "mini-ddtree"])
def test_the_playbook_is_pending_on_upstream_shaped_sites_then_applied_and_changes_nothing_twice(root, path):
    source = (root / path).read_bytes()
    first = plan_file(path, source, patches(NAME, path))
    assert [r.state for r in first.results] == [PENDING] * SITES[path], [r.outcome.message for r in first.results]
    for patch in patches(NAME, path):
        results = run_checks(path, source, first.new, patch.checks)
        assert results and all(r.ok for r in results), [(r.name, r.message) for r in results if not r.ok]
        assert not all(r.ok for r in run_checks(path, source, source, patch.checks))
    second = plan_file(path, first.new, patches(NAME, path))
    assert [r.state for r in second.results] == [APPLIED] * SITES[path]
    assert second.new == first.new and not second.changed


@pytest.mark.parametrize("path", FILES)
def test_the_fixture_turns_into_the_after_fixture(path):
    before = (FIXTURES / "before" / path).read_bytes()
    assert apply(before, NAME, path=path) == (FIXTURES / "after" / path).read_bytes()


def test_only_the_verify_forwards_and_the_target_compaction_change_at_the_call_sites():
    after = (FIXTURES / "after" / "ddtree.py").read_text()
    assert ("output = ddops_hybrid_verify.verify_tree(target, verify_input_ids, verify_position_ids, "
            "verify_attention_mask") in after
    assert ("ddops_hybrid_verify.commit_tree(target, past_key_values_target, start, accepted_indices, "
            "verify_input_ids, compact_dynamic_cache)") in after
    assert "verify_paths=ddops_hybrid_verify.verify_paths(past_key_values_target))" in after
    # The hidden states for the draft are still read the upstream way, from the (now exact) verify output.
    assert ".index_select(1, accepted_index_tensor)" in after
    assert "def compact_dynamic_cache(" in after
    for path in ("dflash.py", "model/dflash.py"):
        after = (FIXTURES / "after" / path).read_text()
        assert ("output = ddops_hybrid_verify.verify_chain(target, past_key_values_target)(block_output_ids, "
                "position_ids=block_position_ids, past_key_values=past_key_values_target, use_cache=True") in after
        # The commit rides on DFlash's own crop, which stays as upstream wrote it (crop-relative may rewrite it).
        assert "    past_key_values_target.crop(start)\n" in after


@pytest.mark.parametrize("path", FILES)
@pytest.mark.parametrize("order", [("hybrid-cache", "crop-relative", NAME), (NAME, "hybrid-cache", "crop-relative")])
def test_it_composes_with_the_other_builtins_in_either_order(order, path):
    source = (MINI / path).read_bytes()
    new = apply(source, *order, path=path)
    compile(new, path, "exec")
    # crop-relative still finds exactly its crops: the helpers' own crops are spelled so that they do not match.
    again = plan_file(path, new, [p for name in order for p in patches(name, path)])
    assert {r.state for r in again.results} == {APPLIED}
    for name in order:
        for patch in patches(name, path):
            assert all(r.ok for r in run_checks(path, source, new, patch.checks)), (name, patch.id)


# --- the one-forward verifier against the batch-of-paths reference (tiny random targets, CPU) -------------------

VOCAB, PROMPT = 64, 11


MODULE = REPO / "playbooks" / "hybrid_verify.py"


def inserted_helpers():
    """The module the playbook adds to the repo (its source beside the playbook), imported from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ddops_hybrid_verify", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def path_taken(helpers, cache) -> str | None:
    """The one verify path the cache's run took so far ("one-forward" or "reference: ..."), None for none."""
    paths = helpers.verify_paths(cache)
    assert paths is None or len(paths) == 1, paths
    return None if paths is None else next(iter(paths))


def tiny_target(layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention"),
                key_heads=2, value_heads=4, seed=0):
    """A random-initialised Qwen3.5-layout target; grouped heads in both kinds of layer by default."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=list(layer_types),
        linear_num_key_heads=key_heads, linear_num_value_heads=value_heads, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4)
    return Qwen3_5ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def torch_():
    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.0")
    import torch

    torch.set_num_threads(1)
    return torch


@pytest.fixture(scope="module")
def hybrid(torch_):
    return tiny_target()


def crop_relative_helpers() -> dict:
    """crop-relative's helpers (_ddops_crop_to, _ddops_record_past), executed from the playbook's own text."""
    namespace: dict = {}
    exec(load_playbook("crop-relative").patch("crop-helper").transform.params["statement"], namespace)
    return namespace


def prefilled(torch_, target, record: bool, batch: int = 1, config=None, prompt: bool = True):
    """A target cache after a prompt; record=True as crop-relative leaves it (recording from the prefill on).
    config: build the cache for that config instead of the target's; prompt=False: the cache as built, before any
    forward."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config or target.config)
    if prompt:
        ids = torch_.randint(0, VOCAB, (1, PROMPT), generator=torch_.Generator().manual_seed(7)).expand(batch, PROMPT)
        with torch_.inference_mode():
            target(ids, past_key_values=cache, use_cache=True)
    if record:
        crop_relative_helpers()["_ddops_record_past"](cache, 4 * PROMPT)
    return cache


def tree_inputs(torch_, parents, seed=0):
    """DDTree's verify inputs for a tree: ids, positions PROMPT + depth, and the additive tree mask."""
    from tests.hybrid_probe import tree_inputs as positions_and_mask

    ids = torch_.randint(0, VOCAB, (1, len(parents)), generator=torch_.Generator().manual_seed(seed))
    return (ids, *positions_and_mask(parents, PROMPT, ids))


def path_to(parents, node):
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def cache_states(cache) -> list:
    """Every tensor a commit leaves: attention keys/values, linear conv windows and recurrent states (a layer may hold
    both kinds; None where it holds no such state)."""
    states = []
    for layer in cache.layers:
        if hasattr(layer, "recurrent_states"):
            states += [layer.recurrent_states[0], layer.conv_states[0]]
        if hasattr(layer, "keys"):
            states += [layer.keys, layer.values]
    return states


def assert_states_close(cache, reference, tolerance=1e-5):
    for got, want in zip(cache_states(cache), cache_states(reference), strict=True):
        assert (got is None) == (want is None)
        if got is None:
            continue
        assert got.shape == want.shape
        assert (got - want).abs().max().item() <= tolerance


def no_compaction(*args):
    raise AssertionError(f"DDTree's compaction called on a hybrid cache: {args}")


def verify_and_commit(torch_, helpers, target, cache, parents, accepted):
    """verify_tree, then commit_tree of the accepted path; returns (logits, the verify path taken)."""
    ids, positions, mask = tree_inputs(torch_, parents)
    with torch_.inference_mode():
        output = helpers.verify_tree(target, ids, positions, mask, cache, parents)
        taken = path_taken(helpers, cache)
        helpers.commit_tree(target, cache, PROMPT, accepted, ids, no_compaction)
    return output.logits, taken


def reference(torch_, helpers, target, cache, parents, accepted):
    """The batch-of-paths verifier and the chain re-run of the accepted path."""
    ids, positions, _ = tree_inputs(torch_, parents)
    with torch_.inference_mode():
        output = helpers._verify_tree_by_paths(target, ids, positions, cache, parents)
        cache._ddops_tree = "paths"
        helpers.commit_tree(target, cache, PROMPT, accepted, ids, no_compaction)
    return output.logits


def random_tree(size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [-1] + [rng.randrange(node) for node in range(1, size)]


TREES = {
    "one node": [-1],
    "chain": list(range(-1, 8)),
    "root and two children": [-1, 0, 0],
    "random 17": random_tree(17, 1),
    "bushy 70 (more than a 64-token chunk)": [-1] + [max(0, (node - 1) // 3) for node in range(1, 70)],
    "deep 70": random_tree(70, 2),
}


@pytest.mark.torch
@pytest.mark.parametrize("record", [False, True], ids=["conv window only", "recorded conv windows"])
@pytest.mark.parametrize("tree", list(TREES), ids=list(TREES))
def test_one_forward_verify_matches_the_batch_of_paths_reference(torch_, hybrid, tree, record):
    helpers, parents = inserted_helpers(), TREES[tree]
    for node in sorted({len(parents) - 1, len(parents) // 2, 0}):
        accepted = path_to(parents, node)
        cache, expected = prefilled(torch_, hybrid, record), prefilled(torch_, hybrid, record)
        logits, taken = verify_and_commit(torch_, helpers, hybrid, cache, parents, accepted)
        assert taken == (None if len(parents) == 1 else "one-forward")
        want = reference(torch_, helpers, hybrid, expected, parents, accepted)
        assert (logits - want).abs().max().item() <= 1e-4
        assert torch_.equal(logits.argmax(-1), want.argmax(-1))
        assert_states_close(cache, expected)
        assert cache.get_seq_length() == PROMPT + len(accepted)


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["linear first, one key head per value head", "linear first, grouped"])
def test_one_forward_verify_matches_the_reference_on_qwen3_5_layouts(torch_, layout):
    key_heads = 4 if layout.endswith("value head") else 1
    target = tiny_target(("linear_attention",) * 3 + ("full_attention",), key_heads=key_heads, value_heads=4, seed=3)
    helpers, parents = inserted_helpers(), TREES["random 17"]
    accepted = path_to(parents, 16)
    cache, expected = prefilled(torch_, target, True), prefilled(torch_, target, True)
    logits, taken = verify_and_commit(torch_, helpers, target, cache, parents, accepted)
    assert taken == "one-forward"
    want = reference(torch_, helpers, target, expected, parents, accepted)
    assert (logits - want).abs().max().item() <= 1e-4
    assert_states_close(cache, expected)


@pytest.mark.torch
def test_consecutive_rounds_stay_on_the_reference(torch_, hybrid):
    helpers = inserted_helpers()
    cache, expected = prefilled(torch_, hybrid, True), prefilled(torch_, hybrid, True)
    past = PROMPT
    for round_, parents in enumerate([TREES["random 17"], TREES["chain"], TREES["root and two children"]]):
        ids, positions, mask = tree_inputs(torch_, parents, seed=round_)
        positions, mask = positions - PROMPT + past, torch_.cat(
            [torch_.zeros(1, 1, len(parents), past - PROMPT), mask], dim=-1)
        accepted = path_to(parents, len(parents) - 1)
        with torch_.inference_mode():
            got = helpers.verify_tree(hybrid, ids, positions, mask, cache, parents).logits
            helpers.commit_tree(hybrid, cache, past, accepted, ids, no_compaction)
            want = helpers._verify_tree_by_paths(hybrid, ids, positions, expected, parents).logits
            expected._ddops_tree = "paths"
            helpers.commit_tree(hybrid, expected, past, accepted, ids, no_compaction)
        assert (got - want).abs().max().item() <= 1e-4
        assert_states_close(cache, expected)
        past += len(accepted)


def chain_verify(torch_, helpers, target, cache, size, seed=0, batch=1):
    ids = torch_.randint(0, VOCAB, (batch, size), generator=torch_.Generator().manual_seed(seed))
    positions = torch_.arange(PROMPT, PROMPT + size).expand(ids.shape[0], size)
    with torch_.inference_mode():
        output = helpers.verify_chain(target, cache)(ids, position_ids=positions, past_key_values=cache,
                                                               use_cache=True, output_hidden_states=True)
    return ids, positions, output


def chain_reference(torch_, target, cache, ids, positions, kept, record):
    with torch_.inference_mode():
        output = target(ids[:, :kept], position_ids=positions[:, :kept], past_key_values=cache, use_cache=True)
        if record:
            cache.crop(0)
    return output.logits


@pytest.mark.torch
@pytest.mark.parametrize("crop", ["absolute crop(n)", "relative crop(-excess)"])
@pytest.mark.parametrize("record", [False, True], ids=["conv window only", "recorded conv windows"])
@pytest.mark.parametrize("kept", [1, 3, 8])
def test_dflash_chain_verify_commits_on_the_next_crop_what_running_the_accepted_prefix_gives(
        torch_, hybrid, record, crop, kept):
    helpers = inserted_helpers()
    cache, expected = prefilled(torch_, hybrid, record), prefilled(torch_, hybrid, record)
    ids, positions, output = chain_verify(torch_, helpers, hybrid, cache, size=8)
    assert path_taken(helpers, cache) == "one-forward"
    with torch_.inference_mode():
        cache.crop(PROMPT + kept) if crop.startswith("absolute") else cache.crop(kept - 8)
    want = chain_reference(torch_, hybrid, expected, ids, positions, kept, record)
    assert (output.logits[:, :kept] - want).abs().max().item() <= 1e-4
    assert_states_close(cache, expected)
    assert "crop" not in vars(cache)  # the next crop is a plain crop again


# --- each fallback guard, taken on purpose -----------------------------------------------------------------------

def modeling_module():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    return modeling_qwen3_5


def other_conv_signature(x, w, bias=None, activation=None, **kwargs):
    """A conv with other parameter names: as if a transformers release renamed them."""
    return ORIGINAL_CONV(x, w, bias, activation=activation, **kwargs)


def other_rule_signature(q, k, v, **kwargs):
    """The chunked rule with other leading parameters: as if a transformers release renamed them."""
    return ORIGINAL_RULE(q, k, v, **kwargs)


def replaced_forward(self, *args, **kwargs):
    """A forward from outside the modeling module: as kernels' kernelize installs one."""
    return ORIGINAL_FORWARD(self, *args, **kwargs)


ORIGINAL_CONV = ORIGINAL_RULE = ORIGINAL_FORWARD = None
RULE = "torch_chunk_gated_delta_rule"


def own_forward(module, globals_: dict, renames: dict | None = None):
    """The Gated DeltaNet layer's own forward (undecorated), as a function of globals_, the global names in renames
    spelled as there: the same code, as if in another modeling module or another transformers release."""
    import inspect
    import types

    forward = inspect.unwrap(module.Qwen3_5GatedDeltaNet.forward)
    code = forward.__code__.replace(co_names=tuple((renames or {}).get(n, n) for n in forward.__code__.co_names))
    copied = types.FunctionType(code, globals_, forward.__name__, forward.__defaults__, forward.__closure__)
    copied.__kwdefaults__ = forward.__kwdefaults__
    return copied


def guard(name, monkeypatch, torch_, target):
    """Puts target in the situation of guard `name`; returns (the text verify_route's reason holds, a function
    that builds a cache after the prompt in that situation). The situations keep the target's own arithmetic: the
    reference verifies the same function."""
    import builtins
    import sys
    import types

    global ORIGINAL_CONV, ORIGINAL_RULE, ORIGINAL_FORWARD
    module = modeling_module()
    linear = [m for m in target.modules() if isinstance(m, module.Qwen3_5GatedDeltaNet)]
    cache = lambda: prefilled(torch_, target, True)  # noqa: E731 - as crop-relative leaves it
    if name == "conv signature":
        ORIGINAL_CONV = module.causal_conv1d_fn
        monkeypatch.setattr(module, "causal_conv1d_fn", other_conv_signature)
        return "causal_conv1d_fn does not take", cache
    if name == "rule signature":
        ORIGINAL_RULE = getattr(module, RULE)
        monkeypatch.setattr(module, RULE, other_rule_signature)
        return f"{RULE} does not take", cache
    if name == "rule renamed":
        # Module and forward both spell it otherwise: the route would swap a function the forward no longer calls.
        monkeypatch.setattr(module, "chunk_gated_delta_rule_v2", getattr(module, RULE), raising=False)
        monkeypatch.delattr(module, RULE)
        monkeypatch.setattr(module.Qwen3_5GatedDeltaNet, "forward",
                            own_forward(module, vars(module), {RULE: "chunk_gated_delta_rule_v2"}))
        return f"Qwen3_5GatedDeltaNet.forward does not call {RULE}", cache
    if name == "rule not in the modeling module":
        # The forward still calls it by name but finds it elsewhere (here: builtins); the route swaps the module's
        # own functions and puts them back, and cannot for one the module lacks.
        monkeypatch.setattr(builtins, RULE, getattr(module, RULE), raising=False)
        monkeypatch.delattr(module, RULE)
        return f"{module.__name__}.{RULE} does not take", cache
    if name == "kernel forward":
        ORIGINAL_FORWARD = module.Qwen3_5GatedDeltaNet.forward
        monkeypatch.setattr(module.Qwen3_5GatedDeltaNet, "forward", replaced_forward)
        return "a kernel replaced it", cache
    if name == "instance forward":
        monkeypatch.setattr(linear[0], "forward", linear[0].forward, raising=False)
        return "forward was replaced on the instance", cache
    if name == "two modeling modules":
        # The second linear layer's class from a copy of the modeling module (its own functions, its own globals).
        copy_ = types.ModuleType("ddops_test_modeling_copy")
        vars(copy_).update({k: v for k, v in vars(module).items() if not k.startswith("__")})
        monkeypatch.setitem(sys.modules, copy_.__name__, copy_)
        other = type("Qwen3_5GatedDeltaNet", (module.Qwen3_5GatedDeltaNet,),
                     {"forward": own_forward(module, vars(copy_)), "__module__": copy_.__name__})
        monkeypatch.setattr(linear[1], "__class__", other)
        return "linear-attention layers from more than one modeling module", cache
    if name == "conv activation":
        monkeypatch.setattr(linear[1], "activation", "gelu")  # the tree conv applies silu only
        return f"layer {linear[1].layer_idx}: activation 'gelu'", cache
    if name.startswith("cache built for"):
        # The cache from a config that differs from the target's in one layer: a sliding window over a full-attention
        # layer (wider than any sequence here), or a linear state next to a full-attention layer's keys and values
        # (a "hybrid" layer, whose linear state the target never fills; transformers cannot crop(0) that state, so
        # that cache records no conv windows).
        config = copy.deepcopy(target.config)
        kinds = list(config.layer_types)
        sliding = name.endswith("sliding window")
        at = kinds.index("full_attention") if sliding else len(kinds) - 1 - kinds[::-1].index("full_attention")
        kinds[at] = "sliding_attention" if sliding else "hybrid"
        config.layer_types, config.sliding_window = kinds, 4 * PROMPT
        why = "the cache has sliding-window layers" if sliding else \
            "the target's linear-attention modules do not match the cache's linear layers"
        return why, lambda: prefilled(torch_, target, sliding, config=config)
    if name == "no state yet":
        return f"linear layer {linear[0].layer_idx} holds no single conv and recurrent state yet", \
            lambda: prefilled(torch_, target, True, prompt=False)
    raise AssertionError(name)


GUARDS = ["conv signature", "rule signature", "rule renamed", "rule not in the modeling module", "kernel forward",
          "instance forward", "two modeling modules", "conv activation", "cache built for a sliding window",
          "cache built for a hybrid layer", "no state yet"]


@pytest.mark.torch
@pytest.mark.parametrize("name", GUARDS)
def test_each_guard_falls_back_to_the_batch_of_paths_and_stays_exact(torch_, name, monkeypatch):
    target = tiny_target()
    helpers, parents = inserted_helpers(), TREES["random 17"]
    accepted = path_to(parents, 16)
    why, cached = guard(name, monkeypatch, torch_, target)
    expected = cached()
    want = reference(torch_, helpers, target, expected, parents, accepted)
    cache = cached()
    logits, taken = verify_and_commit(torch_, helpers, target, cache, parents, accepted)
    assert taken.startswith("reference: ") and why in taken, taken
    assert (logits - want).abs().max().item() <= 1e-4
    assert_states_close(cache, expected)


@pytest.mark.torch
@pytest.mark.parametrize("name", GUARDS)
def test_each_guard_falls_back_to_the_saved_states_for_a_dflash_block_and_stays_exact(torch_, name, monkeypatch):
    target = tiny_target()
    helpers = inserted_helpers()
    why, cached = guard(name, monkeypatch, torch_, target)
    cache, expected = cached(), cached()
    ids, positions, output = chain_verify(torch_, helpers, target, cache, size=6)
    taken = path_taken(helpers, cache)
    assert taken.startswith("reference: ") and why in taken, taken
    with torch_.inference_mode():
        cache.crop(-3)
    want = chain_reference(torch_, target, expected, ids, positions, 3, expected.layers[0].record_past)
    assert (output.logits[:, :3] - want).abs().max().item() <= 1e-4
    assert_states_close(cache, expected)


@pytest.mark.torch
def test_a_batch_of_more_than_one_is_verified_by_the_reference(torch_, hybrid):
    helpers = inserted_helpers()
    cache, expected = prefilled(torch_, hybrid, True, batch=2), prefilled(torch_, hybrid, True, batch=2)
    assert helpers.verify_route(hybrid, cache, 2) == "batch of 2, not 1"
    ids, positions, output = chain_verify(torch_, helpers, hybrid, cache, size=5, batch=2)
    assert helpers.verify_paths(cache) == {"reference: batch of 2, not 1": 1}
    with torch_.inference_mode():
        cache.crop(-1)
    want = chain_reference(torch_, hybrid, expected, ids, positions, 4, True)
    assert (output.logits[:, :4] - want).abs().max().item() <= 1e-4
    assert_states_close(cache, expected)


@pytest.mark.torch
def test_the_target_cache_stays_the_one_built_where_transformers_cache_serves_the_model(torch_, hybrid):
    # Only a release whose Qwen3.5 brings its own cache class (5.2-5.4, tests/unit/test_hybrid_matrix.py) gets
    # another one: this one's DynamicCache has what the linear layers read.
    from transformers import DynamicCache

    cache = DynamicCache(config=hybrid.config)
    assert inserted_helpers().target_cache(hybrid, cache) is cache


@pytest.mark.torch
def test_without_linear_layers_the_original_calls_run_untouched(torch_):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch_.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=8)).eval()
    compacted: list = []
    helpers, parents = inserted_helpers(), TREES["random 17"]
    ids, positions, mask = tree_inputs(torch_, parents)
    cache, plain = prefilled(torch_, target, False), prefilled(torch_, target, False)
    with torch_.inference_mode():
        got = helpers.verify_tree(target, ids, positions, mask, cache, parents)
        want = target(ids, position_ids=positions, attention_mask=mask, past_key_values=plain, use_cache=True)
        helpers.commit_tree(target, cache, PROMPT, [0, 3], ids, lambda *args: compacted.append(args))
        chain = helpers.verify_chain(target, cache)(ids[:, :3], past_key_values=cache, use_cache=True)
    assert torch_.equal(got.logits, want.logits)
    assert compacted == [(cache, PROMPT, [0, 3])]  # DDTree's own compaction, with DDTree's own arguments
    assert chain.logits.shape[1] == 3 and "crop" not in vars(cache) and not hasattr(cache, "_ddops_tree")
    assert helpers.verify_paths(cache) is None  # no hybrid verify ran: the result says nothing


# --- the patched mini DDTree and DFlash on the trained models ---------------------------------------------------

COMPARE = r"""
import importlib.util, json, sys, torch
sys.path.insert(0, ".")
from transformers import AutoModelForCausalLM
from model import ByteTokenizer, DFlashDraftModel, load_and_process_dataset

torch.set_num_threads(1)
name, samples, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
budgets = [int(b) for b in sys.argv[4].split(",")]

def load(module, path):
    spec = importlib.util.spec_from_file_location(module, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

dflash = {"unpatched": load("dflash_unpatched", "dflash_unpatched.py"), "patched": load("dflash", "dflash.py")}
ddtree = {"unpatched": load("ddtree_unpatched", "ddtree_unpatched.py"), "patched": load("ddtree", "ddtree.py")}
target = AutoModelForCausalLM.from_pretrained(f"models/{name}", dtype=torch.float32).eval()
draft = DFlashDraftModel.from_pretrained(f"models/{name}-draft", dtype=torch.float32).eval()
tokenizer = ByteTokenizer.from_pretrained(f"models/{name}")
prompts = [sample["turns"][0] for sample in load_and_process_dataset("mini")][:samples]
common = dict(model=draft, target=target, mask_token_id=draft.mask_token_id, max_new_tokens=tokens,
              stop_token_ids=[tokenizer.eos_token_id], temperature=0.0)
report = {}

def record(key, out, baseline):
    row = report.setdefault(key, {"equal": 0, "responses": 0, "lengths": []})
    row["equal"] += int(torch.equal(out.output_ids, baseline))
    row["responses"] += 1
    row["lengths"].append(out.acceptance_lengths)

for prompt in prompts:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    ids = tokenizer.encode(text, return_tensors="pt")
    baseline = dflash["patched"].dflash_generate(input_ids=ids, block_size=1, **common).output_ids
    for label in ("unpatched", "patched"):
        record(f"{label}_dflash", dflash[label].dflash_generate(input_ids=ids, block_size=draft.block_size, **common),
               baseline)
        for budget in budgets:
            out = ddtree[label].ddtree_generate(input_ids=ids, block_size=draft.block_size, tree_budget=budget,
                                                **common)
            record(f"{label}_tb{budget}", out, baseline)
    spec = draft.spec_generate(target, ids, tokens, [tokenizer.eos_token_id], 0.0)
    record("patched_spec_generate", type("Out", (), {"output_ids": spec, "acceptance_lengths": [1]}), baseline)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def trained_repo(tmp_path_factory, trained_models) -> Path:  # noqa: F811
    """A copy of mini-ddtree with the trained models and the mini bench plan's playbooks, with hybrid-tree-verify in
    ddtree.py, dflash.py and model/dflash.py, and without it in ddtree_unpatched.py and dflash_unpatched.py."""
    repo = tmp_path_factory.mktemp("hybrid-tree-verify") / "ddtree"
    shutil.copytree(MINI, repo, ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    (repo / "models").symlink_to(trained_models, target_is_directory=True)
    patch_repo(repo, "hybrid-cache", "crop-relative", "cpu-timing")
    for path in ("ddtree.py", "dflash.py"):
        (repo / path.replace(".py", "_unpatched.py")).write_bytes((repo / path).read_bytes())
    patch_repo(repo, NAME)
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
def test_patched_ddtree_and_dflash_reproduce_the_baseline_on_the_hybrid_target(trained_repo):
    report = compare(trained_repo, "qwen3.5-hybrid", samples=3, tokens=40, budgets="4,8,16")
    for method in ("dflash", "tb4", "tb8", "tb16", "spec_generate"):
        patched = report[f"patched_{method}"]
        assert patched["equal"] == patched["responses"] == 3, (method, patched["equal"])
    for method in ("dflash", "tb4", "tb8", "tb16"):
        # Exact verification keeps the target on its own path, where the draft was trained: tau rises (the bench's
        # own tau, measured as the benchmark measures it). DFlash's chain alone may already be exact without the
        # playbook: on 5.25+ crop-relative's recording keeps each token's recurrent state and the crop puts it back.
        patched, unpatched = tau(report[f"patched_{method}"]), tau(report[f"unpatched_{method}"])
        assert patched > unpatched or (method == "dflash" and patched == unpatched), method
    # Without the playbook the tree and the rejected tokens leak into the Gated DeltaNet state: the output leaves
    # the baseline.
    assert sum(report[f"unpatched_{m}"]["equal"] for m in ("dflash", "tb4", "tb8", "tb16")) < 12, report


@pytest.mark.torch
def test_patched_ddtree_and_dflash_change_nothing_on_the_pure_attention_target(trained_repo):
    report = compare(trained_repo, "qwen3-attn", samples=2, tokens=40, budgets="8")
    for method in ("dflash", "tb8"):
        assert report[f"patched_{method}"]["equal"] == report[f"unpatched_{method}"]["equal"] == 2
        assert report[f"patched_{method}"]["lengths"] == report[f"unpatched_{method}"]["lengths"]
    assert report["patched_spec_generate"]["equal"] == 2


@pytest.mark.torch
def test_spec_generate_runs_on_the_hybrid_target_with_hybrid_cache_and_crop_relative_alone(torch_, tmp_path,
                                                                                            trained_models):  # noqa: F811
    """model/dflash.py's self-contained DFlash loop needs only the two playbooks the hybrid target needs to run at all
    (lossy without hybrid-tree-verify: what it rejects stays in the Gated DeltaNet state, so no output is asserted)."""
    import importlib.util

    from transformers import AutoModelForCausalLM

    shutil.copytree(MINI / "model", tmp_path / "model", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "data").symlink_to(MINI / "data", target_is_directory=True)  # the package reads ../data
    path = "model/dflash.py"
    source = apply((MINI / path).read_bytes(), "hybrid-cache", "crop-relative", path=path)
    assert b"_ddops_verify_chain" not in source and b"DynamicCache(config=" in source
    (tmp_path / path).write_bytes(source)
    name = "mini_ddtree_model_hybrid_cache_crop_relative"  # the package, patched, beside the unpatched `model`
    spec = importlib.util.spec_from_file_location(name, tmp_path / "model" / "__init__.py",
                                                  submodule_search_locations=[str(tmp_path / "model")])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
        target = AutoModelForCausalLM.from_pretrained(trained_models / "qwen3.5-hybrid", dtype=torch_.float32).eval()
        draft = package.DFlashDraftModel.from_pretrained(trained_models / "qwen3.5-hybrid-draft",
                                                         dtype=torch_.float32).eval()
        tokenizer = package.ByteTokenizer.from_pretrained(trained_models / "qwen3.5-hybrid")
        prompt = package.load_and_process_dataset("mini")[0]["turns"][0]
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
        ids = tokenizer.encode(text, return_tensors="pt")
        out = draft.spec_generate(target, ids, 24, [tokenizer.eos_token_id], 0.0)
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]
    assert torch_.equal(out[:, :ids.shape[1]], ids)
    assert ids.shape[1] < out.shape[1] <= ids.shape[1] + 24


# --- what crop recording holds ------------------------------------------------------------------------------------

HELD = r"""
import json, sys, torch
sys.path.insert(0, ".")
from transformers import AutoModelForCausalLM
from dflash import dflash_generate
from model import DFlashDraftModel

torch.set_num_threads(1)
target = AutoModelForCausalLM.from_pretrained("models/qwen3.5-hybrid", dtype=torch.float32).eval()
draft = DFlashDraftModel.from_pretrained("models/qwen3.5-hybrid-draft", dtype=torch.float32).eval()
widths = []

def conv_columns(cache):
    # The conv inputs each linear layer holds: its window, and whatever a recording keeps for a crop.
    held = [layer.conv_states for layer in getattr(cache, "layers", ()) if hasattr(layer, "conv_states")]
    return max((state.get(0) if isinstance(state, dict) else state).shape[-1] for state in held)

forward = target.forward
def counted(*args, **kwargs):
    out = forward(*args, **kwargs)
    widths.append(conv_columns(kwargs["past_key_values"]))
    return out
target.forward = counted
generator = torch.Generator().manual_seed(0)
prompt = torch.randint(0, target.config.vocab_size - 8, (1, int(sys.argv[1])), generator=generator)
dflash_generate(draft, target, prompt, draft.mask_token_id, 8, draft.block_size, [], 0.0)
print(json.dumps({"after_prefill": widths[0], "most": max(widths), "kernel": target.config.linear_conv_kernel_dim,
                  "block": draft.block_size}))
"""


@pytest.mark.torch
def test_crop_recording_holds_the_verify_window_not_the_prompt(tmp_path, models):  # noqa: F811
    """An 8k-token prompt: what the target cache's linear layers hold is their conv window after the prefill, and
    at most one verify block more until the crop takes it back (recording the prefill held all 8192 columns)."""
    from tests.unit.test_mini_ddtree import bench_env

    repo = tmp_path / "ddtree"
    shutil.copytree(MINI, repo, ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    (repo / "models").symlink_to(models, target_is_directory=True)
    patch_repo(repo, "hybrid-cache", "crop-relative", "cpu-timing", NAME)
    done = subprocess.run([sys.executable, "-c", HELD, "8192"], cwd=repo, env=bench_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    held = json.loads(done.stdout.strip().splitlines()[-1])
    assert held["after_prefill"] <= held["kernel"], held
    assert held["most"] <= held["kernel"] + held["block"], held
