"""The cost of one DDTree verification step (verify forward + cache commit), original vs hybrid-tree-verify.

Run inside a copy of examples/mini-ddtree patched with hybrid-cache, crop-relative, cpu-timing and
hybrid-tree-verify (run.py prepares one and calls this): `python step.py TARGET BUDGETS REPEATS`. For one prompt's
first tree at each budget it times, alternating so that load on a shared machine hits both alike, DDTree's own step
(one forward under the tree mask, then compact_dynamic_cache) and the patched one (_ddops_verify_tree, then
_ddops_commit_tree), each on a fresh copy of the same prefilled cache, and prints the medians.
"""

import copy
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

import ddtree  # noqa: E402
from model import ByteTokenizer, DFlashDraftModel, extract_context_feature, load_and_process_dataset  # noqa: E402

torch.set_num_threads(1)
name, budgets, repeats = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], int(sys.argv[3])
target = AutoModelForCausalLM.from_pretrained(f"models/{name}", dtype=torch.float32).eval()
draft = DFlashDraftModel.from_pretrained(f"models/{name}-draft", dtype=torch.float32).eval()
tokenizer = ByteTokenizer.from_pretrained(f"models/{name}")
text = tokenizer.apply_chat_template([{"role": "user", "content": load_and_process_dataset("mini")[0]["turns"][0]}],
                                     tokenize=False, add_generation_prompt=True, enable_thinking=False)
ids = tokenizer.encode(text, return_tensors="pt")
start = ids.shape[1]

with torch.inference_mode():
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording()  # as crop-relative leaves it
    prefill = target(ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
    root = prefill.logits[0, -1].argmax()
    block = torch.full((1, draft.block_size), draft.mask_token_id)
    block[0, 0] = root
    hidden = draft(target_hidden=extract_context_feature(prefill.hidden_states, draft.target_layer_ids),
                   noise_embedding=target.model.embed_tokens(block),
                   position_ids=torch.arange(start + draft.block_size)[None])
    draft_logits = target.lm_head(hidden[0, 1:])

    def original(c, tree):
        vin, vpos, vmask, parents, child_maps = tree
        out = target(vin, position_ids=vpos, attention_mask=vmask, past_key_values=c, use_cache=True,
                     output_hidden_states=True)
        accepted, _ = ddtree.follow_verified_tree(child_maps, out.logits.argmax(-1))
        ddtree.compact_dynamic_cache(c, start, accepted)
        return len(accepted)

    def exact(c, tree):
        vin, vpos, vmask, parents, child_maps = tree
        out = ddtree._ddops_verify_tree(target, vin, vpos, vmask, c, parents)
        accepted, _ = ddtree.follow_verified_tree(child_maps, out.logits.argmax(-1))
        ddtree._ddops_commit_tree(target, c, start, accepted, vin)
        return len(accepted)

    print(f"{'target':16} {'budget':>6} {'paths':>5} {'depth':>5} {'original ms':>11} {'exact ms':>9} {'ratio':>6}")
    for budget in budgets:
        node_ids, depths, parents, child_maps, visibility, _ = ddtree.build_ddtree_tree(draft_logits, budget)
        vin, vpos, vmask = ddtree.compile_ddtree_tree(root, start, node_ids, depths, visibility, start,
                                                      target.dtype, ids.device)
        tree = (vin, vpos, vmask, parents, child_maps)
        times = {"original": [], "exact": []}
        for _ in range(repeats):
            for label, step in (("original", original), ("exact", exact)):
                c = copy.deepcopy(cache)
                tick = time.perf_counter()
                step(c, tree)
                times[label].append(time.perf_counter() - tick)
        paths = len(parents) - len(set(parents[1:]))
        before, after = statistics.median(times["original"]), statistics.median(times["exact"])
        print(f"{name:16} {budget:6d} {paths:5d} {int(depths.max()) if len(depths) else 0:5d} "
              f"{before * 1e3:11.2f} {after * 1e3:9.2f} {after / before:5.2f}x")
