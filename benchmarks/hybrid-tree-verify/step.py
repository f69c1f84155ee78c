"""The cost of one verification step (verify forward + cache commit): the original lossy step, the batch-of-paths
reference and the one-forward verify of hybrid-tree-verify, timed alternately on the same tree.

Run inside a copy of examples/mini-ddtree patched with hybrid-cache, crop-relative, cpu-timing and
hybrid-tree-verify (run.py prepares one and calls this): `python step.py TARGET BUDGETS REPEATS`. For the first
prompt it builds DDTree's tree at each budget from the trained draft (and DFlash's block), then times, round-robin
so that load on a shared machine hits all three alike, each method on a fresh copy of the same prefilled cache:

- lossy: DDTree's own step (one forward under the tree mask, then compact_dynamic_cache); DFlash's (one forward,
  then the crop);
- paths: the reference (_verify_tree_by_paths, then the accepted chain run again; DFlash: states saved, the
  accepted prefix run again);
- new: verify_tree then commit_tree (DFlash: verify_chain, then the crop).

All three commit the same accepted path (the exact one), so they do the same work. Each row reports medians of
both the wall time and the process's CPU time (one thread): on a machine other jobs load, the wall time also counts
the time spent waiting for a core, the CPU time does not. Prints one JSON line per row.
"""

import copy
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
import ddops_hybrid_verify as hv  # noqa: E402
import ddtree  # noqa: E402
import dflash  # noqa: E402
from model import ByteTokenizer, DFlashDraftModel, extract_context_feature, load_and_process_dataset  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

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
    prefill = target(ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
    dflash._ddops_record_past(cache, start)  # as crop-relative leaves it: recording from the prefill on
    root = prefill.logits[0, -1].argmax()
    block = torch.full((1, draft.block_size), draft.mask_token_id)
    block[0, 0] = root
    hidden = draft(target_hidden=extract_context_feature(prefill.hidden_states, draft.target_layer_ids),
                   noise_embedding=target.model.embed_tokens(block),
                   position_ids=torch.arange(start + draft.block_size)[None])
    draft_logits = target.lm_head(hidden[0, 1:])
    block[0, 1:] = draft_logits.argmax(-1)
    chain_positions = torch.arange(start, start + draft.block_size)[None]

    def tree_steps(vin, vpos, vmask, parents, accepted):
        def lossy(c):
            target(vin, position_ids=vpos, attention_mask=vmask, past_key_values=c, use_cache=True,
                   output_hidden_states=True)
            ddtree.compact_dynamic_cache(c, start, accepted)

        def paths(c):
            hv._verify_tree_by_paths(target, vin, vpos, c, parents)
            c._ddops_tree = "paths"
            hv.commit_tree(target, c, start, accepted, vin, ddtree.compact_dynamic_cache)

        def new(c):
            hv.verify_tree(target, vin, vpos, vmask, c, parents)
            assert not hybrid or hv.verify_paths(c) in (None, {hv.ONE_FORWARD: 1})
            hv.commit_tree(target, c, start, accepted, vin, ddtree.compact_dynamic_cache)

        return {"lossy": lossy, "paths": paths, "new": new} if hybrid else {"lossy": lossy, "new": new}

    def chain_steps(kept):
        kwargs = dict(position_ids=chain_positions, past_key_values=None, use_cache=True, output_hidden_states=True)

        def lossy(c):
            target(block, **{**kwargs, "past_key_values": c})
            dflash._ddops_crop_to(c, start + kept)

        def paths(c):
            plan = hv.verify_route
            hv.verify_route = lambda *args: "forced: the reference"
            try:
                hv.verify_chain(target, c)(block, **{**kwargs, "past_key_values": c})
            finally:
                hv.verify_route = plan
            dflash._ddops_crop_to(c, start + kept)

        def new(c):
            hv.verify_chain(target, c)(block, **{**kwargs, "past_key_values": c})
            dflash._ddops_crop_to(c, start + kept)

        return {"lossy": lossy, "paths": paths, "new": new} if hybrid else {"lossy": lossy, "new": new}

    # Without linear layers the playbook never takes the reference path: only lossy and new are timed there.
    hybrid = bool(hv.linear_layers(cache))
    cases = []
    for budget in budgets:
        node_ids, depths, parents, child_maps, visibility, _ = ddtree.build_ddtree_tree(draft_logits, budget)
        vin, vpos, vmask = ddtree.compile_ddtree_tree(root, start, node_ids, depths, visibility, start,
                                                      target.dtype, ids.device)
        probe = copy.deepcopy(cache)
        out = hv.verify_tree(target, vin, vpos, vmask, probe, parents)
        accepted, _ = ddtree.follow_verified_tree(child_maps, out.logits.argmax(-1))
        paths_count = len(parents) - len(set(parents[1:]))
        cases.append(({"method": "ddtree", "budget": budget, "nodes": len(parents), "paths": paths_count,
                       "depth": int(depths.max()) if len(depths) else 0, "accepted": len(accepted)},
                      tree_steps(vin, vpos, vmask, parents, accepted)))
    probe = copy.deepcopy(cache)
    out = hv.verify_chain(target, probe)(block, position_ids=chain_positions, past_key_values=probe,
                                                     use_cache=True, output_hidden_states=True)
    kept = int((block[:, 1:] == out.logits.argmax(-1)[:, :-1]).long().cumprod(dim=1).sum()) + 1
    cases.append(({"method": "dflash", "budget": draft.block_size - 1, "nodes": draft.block_size, "paths": 1,
                   "depth": draft.block_size - 1, "accepted": kept}, chain_steps(kept)))

    for row, steps in cases:
        wall, cpu = {label: [] for label in steps}, {label: [] for label in steps}
        for repeat in range(repeats + 1):
            order = list(steps) if repeat % 2 else list(steps)[::-1]  # alternate, and rotate who goes first
            for label in order:
                c = copy.deepcopy(cache)
                tick, cpu_tick = time.perf_counter(), time.process_time()
                steps[label](c)
                if repeat:  # the first round warms up
                    wall[label].append(time.perf_counter() - tick)
                    cpu[label].append(time.process_time() - cpu_tick)
        figures = {f"{label}_ms": statistics.median(wall[label]) * 1e3 for label in steps}
        figures.update({f"{label}_cpu_ms": statistics.median(cpu[label]) * 1e3 for label in steps})
        print(json.dumps({"target": name, **row, **figures}), flush=True)
