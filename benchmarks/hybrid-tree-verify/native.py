"""DFlash's block on transformers 5.25+: its native per-token recording against hybrid-tree-verify's fold.

Run inside a copy of examples/mini-ddtree patched with hybrid-cache, crop-relative, cpu-timing and
hybrid-tree-verify, with a transformers that has `activate_past_recording(recurrent_states_to_keep=K)` (5.25+):
`python native.py TARGET REPEATS`. For the first prompt it drafts DFlash's block from the trained draft, then times,
round-robin on fresh copies of the same prefilled cache (recording as crop-relative leaves it):

- native: the plain verify forward, which with K >= the block runs its Gated DeltaNet layers token by token and
  keeps each token's recurrent state, then the crop, which puts back the state of the last accepted token;
- fold: ddops_hybrid_verify.verify_chain (one chunked forward, no per-token states), then the same crop, which
  folds the state along the accepted prefix.

Both commit the same accepted prefix. Prints one JSON line per verifier: median CPU and wall ms of verify + crop,
the bytes the linear layers hold between the two (conv inputs and recorded recurrent states), and the largest
difference of the committed states from a cache that prefilled the prompt and the accepted prefix at once.
"""

import copy
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
import ddops_hybrid_verify as hv  # noqa: E402
import dflash  # noqa: E402
from model import ByteTokenizer, DFlashDraftModel, extract_context_feature, load_and_process_dataset  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

torch.set_num_threads(1)
name, repeats = sys.argv[1], int(sys.argv[2])
target = AutoModelForCausalLM.from_pretrained(f"models/{name}", dtype=torch.float32).eval()
draft = DFlashDraftModel.from_pretrained(f"models/{name}-draft", dtype=torch.float32).eval()
tokenizer = ByteTokenizer.from_pretrained(f"models/{name}")
text = tokenizer.apply_chat_template([{"role": "user", "content": load_and_process_dataset("mini")[0]["turns"][0]}],
                                     tokenize=False, add_generation_prompt=True, enable_thinking=False)
ids = tokenizer.encode(text, return_tensors="pt")
start = ids.shape[1]


def held_bytes(cache):
    total = 0
    for layer in hv.linear_layers(cache).values():
        total += hv._state(layer, "conv_states").nbytes
        for states in (getattr(layer, "recurrent_states_history", None) or {}).values():
            total += sum(state.nbytes for state in states)
    return total


def states(cache):
    return [hv._state(layer, name).float() for layer in hv.linear_layers(cache).values()
            for name in ("recurrent_states", "conv_states")]


with torch.inference_mode():
    cache = DynamicCache(config=target.config)
    prefill = target(ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
    dflash._ddops_record_past(cache, start + 64)  # as crop-relative leaves it
    block = torch.full((1, draft.block_size), draft.mask_token_id)
    block[0, 0] = prefill.logits[0, -1].argmax()
    hidden = draft(target_hidden=extract_context_feature(prefill.hidden_states, draft.target_layer_ids),
                   noise_embedding=target.model.embed_tokens(block),
                   position_ids=torch.arange(start + draft.block_size)[None])
    block[0, 1:] = target.lm_head(hidden[0, 1:]).argmax(-1)
    positions = torch.arange(start, start + draft.block_size)[None]
    posterior = target(block, position_ids=positions, past_key_values=copy.deepcopy(cache)).logits.argmax(-1)
    kept = int((block[:, 1:] == posterior[:, :-1]).long().cumprod(dim=1).sum()) + 1
    fresh = DynamicCache(config=target.config)
    target(torch.cat([ids, block[:, :kept]], dim=1), past_key_values=fresh, use_cache=True)

    verifiers = {"native": lambda c: target, "fold": lambda c: hv.verify_chain(target, c)}
    timings = {key: ([], []) for key in verifiers}
    held, gaps = {}, {}
    for _ in range(repeats):
        for key, verifier in verifiers.items():
            c = copy.deepcopy(cache)
            cpu, wall = time.process_time(), time.perf_counter()
            verifier(c)(block, position_ids=positions, past_key_values=c, use_cache=True)
            held[key] = held_bytes(c)
            dflash._ddops_crop_to(c, start + kept)
            timings[key][0].append(time.process_time() - cpu)
            timings[key][1].append(time.perf_counter() - wall)
            gaps[key] = max((a - b).abs().max().item() for a, b in zip(states(c), states(fresh), strict=True))

for key, (cpu, wall) in timings.items():
    print(json.dumps({"target": name, "verifier": key, "block": draft.block_size, "accepted": kept,
                      "cpu_ms": round(statistics.median(cpu) * 1e3, 2),
                      "wall_ms": round(statistics.median(wall) * 1e3, 2),
                      "held_bytes_at_verify": held[key], "max_state_diff": gaps[key]}))
