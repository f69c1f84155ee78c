"""Run inside a transformers release's venv (torch and transformers only): the hybrid verify module on that release.

    python hybrid_probe.py route MODULE.py          the route against cache-free forwards, on tiny random targets
    python hybrid_probe.py mini REPO MODELS N TOKENS BUDGETS
                                                    the patched mini DDTree's methods against cache-free greedy
    python hybrid_probe.py both MODULE.py REPO MODELS N TOKENS BUDGETS
                                                    the two in one process: {"route": ..., "mini": ...}

Prints one JSON document; tests/unit/test_hybrid_matrix.py reads it. Ground truth is always a forward without any
cache (the prompt and the path to a node as one sequence), never the release's own cached multi-token forward:
some releases get that one wrong.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import sys
from types import SimpleNamespace

import torch

VOCAB, PROMPT = 64, 11


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tiny_target(layer_types, seed=0):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=list(layer_types),
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4)
    return Qwen3_5ForCausalLM(config).eval()


def target_cache(target, prompt, record, module):
    """The target cache as the playbooks leave it after the prefill: hybrid-cache's, which hybrid-tree-verify
    replaces where the release's model brings its own cache class (crop-relative records from there on)."""
    from transformers import DynamicCache

    cache = module.target_cache(target, DynamicCache(config=target.config))
    target(prompt, past_key_values=cache, use_cache=True)
    if record and hasattr(cache, "activate_past_recording"):
        import inspect

        if "recurrent_states_to_keep" in inspect.signature(cache.activate_past_recording).parameters:
            cache.activate_past_recording(recurrent_states_to_keep=4096)
        else:
            cache.activate_past_recording()
    return cache


def random_tree(size, rng):
    return [-1] + [rng.randrange(node) for node in range(1, size)]


def path_to(parents, node):
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def tree_inputs(parents, past, ids):
    """DDTree's verify inputs for a tree after `past` tokens: positions past + depth, and the additive tree mask."""
    size = len(parents)
    visible = torch.zeros(size, size, dtype=torch.bool)
    depth = [0] * size
    for node, parent in enumerate(parents):
        if parent >= 0:
            visible[node], depth[node] = visible[parent], depth[parent] + 1
        visible[node, node] = True
    mask = torch.zeros(1, 1, size, past + size)
    mask[0, 0, :, past:].masked_fill_(~visible, torch.finfo(torch.float32).min)
    return torch.tensor([depth]) + past, mask


def cache_free_logits(target, sequence, ids, parents):
    """Each node's logits from one forward without a cache over the prompt and the path to it (a batch of them,
    right-padded: causal layers never see what follows a row's last token)."""
    rows = [torch.cat([sequence[0], ids[0, path_to(parents, node)]]) for node in range(len(parents))]
    width = max(len(row) for row in rows)
    batch = torch.stack([torch.cat([row, row.new_zeros(width - len(row))]) for row in rows])
    logits = target(batch).logits
    return torch.stack([logits[node, len(row) - 1] for node, row in enumerate(rows)])


def states(cache, module):
    """Every committed tensor, flattened: linear states, then attention keys/values cut to the cache's length."""
    out = []
    for layer in cache.layers:
        if hasattr(layer, "recurrent_states"):
            out += [module._state(layer, "recurrent_states").float().flatten(),
                    module._state(layer, "conv_states")[..., -4:].float().flatten()]
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            out += [layer.keys.flatten(), layer.values.flatten()]
    return out


def gap(got, want):
    if len(got) != len(want) or any(a.shape != b.shape for a, b in zip(got, want, strict=True)):
        return float("inf")
    return max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))


def probe_route(module_path):
    """Rounds of trees and chains through verify_tree / verify_chain, each against cache-free forwards."""
    module = load("ddops_hybrid_verify", module_path)
    rng = random.Random(0)
    report = {"paths": {}, "logit_gap": 0.0, "state_gap": 0.0, "rounds": 0}
    for layout in (("linear_attention", "full_attention") * 2, ("linear_attention",) * 3 + ("full_attention",)):
        target = tiny_target(layout)
        for record in (False, True):
            sequence = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(7))
            with torch.inference_mode():
                cache = target_cache(target, sequence, record, module)
                for round_, size in enumerate((17, 8, 66, 5)):
                    past = sequence.shape[1]
                    chain = round_ % 2 == 1
                    parents = list(range(-1, size - 1)) if chain else random_tree(size, rng)
                    ids = torch.randint(0, VOCAB, (1, size), generator=torch.Generator().manual_seed(round_))
                    positions, mask = tree_inputs(parents, past, ids)
                    if chain:
                        output = module.verify_chain(target, cache)(ids, position_ids=positions, past_key_values=cache,
                                                                   use_cache=True, output_hidden_states=True)
                    else:
                        output = module.verify_tree(target, ids, positions, mask, cache, parents)
                    want = cache_free_logits(target, sequence, ids, parents)
                    report["logit_gap"] = max(report["logit_gap"], (output.logits[0] - want).abs().max().item())
                    accepted = path_to(parents, rng.randrange(size))
                    if chain:
                        cache.crop(past + len(accepted))
                    else:
                        module.commit_tree(target, cache, past, accepted, ids, compact=None)
                    sequence = torch.cat([sequence, ids[:, accepted]], dim=1)
                    fresh = target_cache(target, sequence, False, module)
                    report["state_gap"] = max(report["state_gap"], gap(states(cache, module), states(fresh, module)))
                    report["rounds"] += 1
                for label, count in (module.verify_paths(cache) or {}).items():
                    report["paths"][label] = report["paths"].get(label, 0) + count
    return report


def cache_free_greedy(target, ids, tokens, stop):
    """The target's greedy continuation, each token from a forward over the whole sequence without any cache."""
    sequence = ids
    for _ in range(tokens):
        token = target(sequence).logits[:, -1].argmax(-1, keepdim=True)
        sequence = torch.cat([sequence, token], dim=1)
        if int(token) == stop:
            break
    return sequence


def probe_mini(repo, models, samples, tokens, budgets):
    """Every method of the patched mini DDTree on both trained targets, each output against cache-free greedy."""
    sys.path.insert(0, repo)
    from ddtree import ddtree_generate
    from dflash import dflash_generate
    from model import ByteTokenizer, DFlashDraftModel, load_and_process_dataset
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    report = {}
    for name in ("qwen3.5-hybrid", "qwen3-attn"):
        target = AutoModelForCausalLM.from_pretrained(f"{models}/{name}", dtype=torch.float32).eval()
        draft = DFlashDraftModel.from_pretrained(f"{models}/{name}-draft", dtype=torch.float32).eval()
        tokenizer = ByteTokenizer.from_pretrained(f"{models}/{name}")
        stop = tokenizer.eos_token_id
        common = dict(model=draft, target=target, mask_token_id=draft.mask_token_id, max_new_tokens=int(tokens),
                      stop_token_ids=[stop], temperature=0.0)
        methods = {"baseline": functools.partial(dflash_generate, block_size=1, **common),
                   "dflash": functools.partial(dflash_generate, block_size=draft.block_size, **common)}
        for budget in (int(b) for b in budgets.split(",")):
            methods[f"ddtree_tb{budget}"] = functools.partial(ddtree_generate, block_size=draft.block_size,
                                                              tree_budget=budget, **common)
        rows = report[name] = {}
        with torch.inference_mode():
            for sample in load_and_process_dataset("mini")[:int(samples)]:
                text = tokenizer.apply_chat_template([{"role": "user", "content": sample["turns"][0]}], tokenize=False,
                                                     add_generation_prompt=True, enable_thinking=False)
                ids = tokenizer.encode(text, return_tensors="pt")
                want = cache_free_greedy(target, ids, int(tokens), stop)
                outputs = {key: run(input_ids=ids) for key, run in methods.items()}
                outputs["spec_generate"] = SimpleNamespace(
                    output_ids=draft.spec_generate(target, ids, int(tokens), [stop], 0.0))
                for key, out in outputs.items():
                    row = rows.setdefault(key, {"equal": 0, "responses": 0, "verify_paths": {}})
                    row["equal"] += int(torch.equal(out.output_ids, want))
                    row["responses"] += 1
                    for label, rounds in (getattr(out, "verify_paths", None) or {}).items():
                        row["verify_paths"][label] = row["verify_paths"].get(label, 0) + rounds
    return report


if __name__ == "__main__":
    import transformers

    mode, *args = sys.argv[1:]
    result = {"transformers": transformers.__version__}
    if mode == "both":  # one interpreter start and one torch + transformers import instead of two
        result["route"] = probe_route(args[0])
        sys.modules.pop("ddops_hybrid_verify")  # the mini DDTree imports its own copy, as a patched checkout does
        result["mini"] = probe_mini(*args[1:])
    else:
        result.update(probe_route(*args) if mode == "route" else probe_mini(*args))
    print(json.dumps(result))
