"""GPU mode of the hybrid-tree-verify benchmark: one verification step (verify + commit) on a random-initialised
Qwen3.5-shaped target at long contexts, for the lossy step, the batch-of-paths reference and the one-forward verify.

Run inside a copy of examples/mini-ddtree patched with hybrid-cache, crop-relative, cpu-timing and
hybrid-tree-verify (`run.py --device cuda ...` prepares one and calls this). No weights are downloaded: the target is
built from a config with random weights (what is timed does not depend on them), in bfloat16 on the device. Each
context is a random prompt, prefilled in chunks; each tree is DDTree's best-first tree at the budget over random
draft logits. The three methods run round-robin on a fresh copy of the same cache (the copy is not timed), and each
commits the same accepted path. Also prints how far the new verify's logits are from the reference's (bf16).

    python gpu.py --device cuda [--layout 27b|tiny] [--layers N] [--contexts 8192,32768] [--budgets 16,64]
        [--repeats 5] [--chain-block 16] [--dtype bfloat16|float32] [--time-limit 480]

--layout 27b is a Qwen3.5 ~27B dense hybrid layout (64 layers, every 4th full attention; written from the
published shape, not read from a config.json); when it does not fit, fewer layers are built and the report says
how many. --time-limit stops before starting a measurement that would run past it, and reports what it has.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

sys.path.insert(0, ".")

LAYOUTS = {
    # Qwen3.5 ~27B: hidden 5120, 64 layers (3 Gated DeltaNet : 1 full attention), 24 query / 4 key-value heads of
    # 256, Gated DeltaNet with 16 key heads and 48 value heads of 128, conv kernel 4.
    "27b": dict(vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4),
    # The same shape at toy size: for checking the script on a CPU.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="27b")
    parser.add_argument("--layers", type=int, help="build this many layers (a multiple of 4) instead of the layout's")
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--budgets", default="16,64")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill-chunk", type=int, default=4096)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                        help="default: bfloat16 on CUDA, float32 elsewhere")
    parser.add_argument("--chain-block", type=int, default=16, help="DFlash's block for the native-recording row")
    parser.add_argument("--time-limit", type=float, default=480.0, help="seconds for the whole script")
    args = parser.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.budgets = [int(b) for b in args.budgets.split(",")]
    if args.layers is not None and (args.layers < 4 or args.layers % 4):
        parser.error("--layers must be a positive multiple of 4 (3 linear-attention layers per full-attention one)")
    if min(args.contexts) < 1 or min(args.budgets) < 1 or args.repeats < 1:
        parser.error("--contexts, --budgets and --repeats must be positive")
    return args


def config_for(layout: str, layers: int | None):
    """The Qwen3.5 text config of the layout, optionally with fewer layers (the 3:1 pattern kept)."""
    from transformers import Qwen3_5TextConfig

    shape = dict(LAYOUTS[layout])
    if layers is not None:
        shape["num_hidden_layers"] = layers
    types_ = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(shape["num_hidden_layers"])]
    return Qwen3_5TextConfig(**shape, layer_types=types_, max_position_embeddings=max(65536, 2 * 32768))


def build_target(args, device, dtype):
    """The largest model of the layout that fits: the full layer count first, then 3/4, 1/2, ... of it."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    layers = args.layers or LAYOUTS[args.layout]["num_hidden_layers"]
    while True:
        try:
            torch.manual_seed(0)
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                with torch.device(device):
                    target = Qwen3_5ForCausalLM(config_for(args.layout, layers))
            finally:
                torch.set_default_dtype(previous)
            return target.eval(), layers
        except torch.OutOfMemoryError:
            target = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            smaller = (layers * 3 // 4) // 4 * 4
            if smaller < 4 or smaller == layers:
                raise
            layers = smaller


def peaked_draft_logits(depth: int, vocab: int, generator) -> torch.Tensor:
    """Draft logits shaped like a trained draft's: at each position 8 candidates, probabilities falling ~4.5x per
    rank, so that the best-first tree grows both deep (along the top choices) and wide, as DDTree's do."""
    import torch

    logits = torch.full((depth, vocab), -30.0)
    for position in range(depth):
        candidates = torch.randperm(vocab, generator=generator)[:8]
        logits[position, candidates] = -1.5 * torch.arange(8, dtype=torch.float32)
    return logits


def synchronize(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    began = time.monotonic()
    args = parse_args()  # before torch: bad arguments fail in a moment
    import torch
    from transformers import DynamicCache

    import ddops_hybrid_verify as hv
    import ddtree
    import dflash

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    target, layers = build_target(args, device, dtype)
    params = sum(p.numel() for p in target.parameters())
    print(json.dumps({"layout": args.layout, "layers": layers, "parameters": params, "dtype": str(dtype),
                      "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
                      "built_s": round(time.monotonic() - began, 1)}), flush=True)
    vocab = target.config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def out_of_time(estimate: float) -> bool:
        return time.monotonic() - began + estimate > args.time_limit

    with torch.inference_mode():
        for context in args.contexts:
            tick = time.monotonic()
            cache = DynamicCache(config=target.config)
            prompt = torch.randint(0, vocab, (1, context), generator=generator).to(device)
            for offset in range(0, context, args.prefill_chunk):
                if out_of_time(0):
                    print(json.dumps({"context": context, "stopped": "time limit, during the prefill"}))
                    return
                piece = prompt[:, offset:offset + args.prefill_chunk]
                target(piece, position_ids=torch.arange(offset, offset + piece.shape[1], device=device)[None],
                       past_key_values=cache, use_cache=True, logits_to_keep=1)
            dflash._ddops_record_past(cache, context)  # as crop-relative leaves it: recording from the prefill on
            synchronize(device)
            prefill_s = time.monotonic() - tick
            depth = 15  # DDTree's default block of 16: 15 drafted positions
            for budget in args.budgets:
                draft_logits = peaked_draft_logits(depth, vocab, generator)
                node_ids, depths, parents, child_maps, visibility, _ = ddtree.build_ddtree_tree(draft_logits, budget)
                root = prompt[0, -1]
                vin, vpos, vmask = ddtree.compile_ddtree_tree(root, context, node_ids, depths, visibility, context,
                                                              target.dtype, device)
                probe = copy.deepcopy(cache)
                new_out = hv.verify_tree(target, vin, vpos, vmask, probe, parents)
                mode = next(iter(hv.verify_paths(probe) or {None: 0}))
                del probe
                accepted = [0]
                while len(accepted) < 4 and accepted[-1] in parents[1:]:  # down the first children: tau 4
                    accepted.append(parents.index(accepted[-1]))
                try:
                    reference = hv._verify_tree_by_paths(target, vin, vpos, copy.deepcopy(cache), parents)
                    error = (new_out.logits.float() - reference.logits.float()).abs().max().item()
                    same = bool(torch.equal(new_out.logits.argmax(-1), reference.logits.argmax(-1)))
                    del reference
                except torch.OutOfMemoryError:
                    error, same = None, None
                del new_out

                def lossy(c):
                    target(vin, position_ids=vpos, attention_mask=vmask, past_key_values=c, use_cache=True,
                           output_hidden_states=True)
                    ddtree.compact_dynamic_cache(c, context, accepted)

                def paths(c):
                    hv._verify_tree_by_paths(target, vin, vpos, c, parents)
                    c._ddops_tree = "paths"
                    hv.commit_tree(target, c, context, accepted, vin, ddtree.compact_dynamic_cache)

                def new(c):
                    hv.verify_tree(target, vin, vpos, vmask, c, parents)
                    hv.commit_tree(target, c, context, accepted, vin, ddtree.compact_dynamic_cache)

                steps = {"lossy": lossy, "paths": paths, "new": new}
                times = {label: [] for label in steps}
                last = 0.0
                for repeat in range(args.repeats + 1):
                    for label in (list(steps) if repeat % 2 else list(steps)[::-1]):
                        if times[label] is None or out_of_time(3 * last):
                            continue
                        c = copy.deepcopy(cache)
                        synchronize(device)
                        tick = time.perf_counter()
                        try:
                            steps[label](c)
                            synchronize(device)
                        except torch.OutOfMemoryError:
                            times[label] = None  # reported as out of memory
                            continue
                        finally:
                            del c
                        last = max(last, time.perf_counter() - tick)
                        if repeat:  # the first round warms up
                            times[label].append(time.perf_counter() - tick)
                row = {"context": context, "prefill_s": round(prefill_s, 1), "budget": budget,
                       "nodes": len(parents), "paths": len(parents) - len(set(parents[1:])),
                       "depth": int(depths.max()), "new_mode": mode, "max_logit_diff_vs_paths": error,
                       "same_argmax_as_paths": same}
                for label, values in times.items():
                    row[f"{label}_ms"] = ("out of memory" if values is None else
                                          round(statistics.median(values) * 1e3, 2) if values else "time limit")
                print(json.dumps(row), flush=True)
            if not out_of_time(60):
                print(json.dumps(chain_row(args, target, cache, context, device, generator)), flush=True)
            del cache
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps({"total_s": round(time.monotonic() - began, 1)}))


def chain_row(args, target, cache, context, device, generator) -> dict:
    """DFlash's block (args.chain_block tokens, 4 accepted): transformers' native per-token recording (5.25+: the
    plain verify keeps each token's recurrent state, the crop puts back the accepted one) against the fold (verify_chain,
    then the same crop); each committed state against the reference (the accepted tokens run on the cache)."""
    import inspect

    import torch

    import ddops_hybrid_verify as hv
    import dflash

    block = torch.randint(0, target.config.vocab_size, (1, args.chain_block), generator=generator).to(device)
    positions = torch.arange(context, context + args.chain_block, device=device)[None]
    kept = min(4, args.chain_block)
    linear = list(hv.linear_layers(cache).values())
    native_there = "recurrent_states_to_keep" in inspect.signature(linear[0].activate_past_recording).parameters

    def held(c):
        total = sum(hv._state(layer, "conv_states").nbytes for layer in hv.linear_layers(c).values())
        for layer in hv.linear_layers(c).values():
            total += sum(s.nbytes for states in (getattr(layer, "recurrent_states_history", None) or {}).values()
                         for s in states)
        return total

    def run(verifier):
        c = copy.deepcopy(cache)
        synchronize(device)
        tick = time.perf_counter()
        verifier(c)(block, position_ids=positions, past_key_values=c, use_cache=True)
        size = held(c)
        dflash._ddops_crop_to(c, context + kept)
        synchronize(device)
        return c, time.perf_counter() - tick, size

    reference = copy.deepcopy(cache)
    target(block[:, :kept], position_ids=positions[:, :kept], past_key_values=reference, use_cache=True)
    dflash._ddops_crop_to(reference, context + kept)
    verifiers = {"fold": lambda c: hv.verify_chain(target, c)}
    if native_there:
        verifiers["native"] = lambda c: target
    row = {"context": context, "chain_block": args.chain_block, "accepted": kept, "native_recording": native_there}
    times = {label: [] for label in verifiers}
    for repeat in range(args.repeats + 1):
        for label, verifier in verifiers.items():
            c, seconds, size = run(verifier)
            if repeat:
                times[label].append(seconds)
            row[f"{label}_held_mib"] = round(size / 2**20, 2)
            row[f"{label}_max_state_diff"] = max(
                (hv._state(a, n).float() - hv._state(b, n).float()).abs().max().item()
                for a, b in zip(hv.linear_layers(c).values(), hv.linear_layers(reference).values())
                for n in ("recurrent_states", "conv_states"))
            del c
    for label, values in times.items():
        row[f"{label}_ms"] = round(statistics.median(values) * 1e3, 2)
    return row


if __name__ == "__main__":
    main()
