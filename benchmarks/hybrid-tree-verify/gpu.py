"""GPU figures for hybrid-tree-verify: one verification step (verify + commit) on a random-initialised Qwen3.5-shaped
target at long contexts, for the lossy step on flash-linear-attention's kernels and on transformers' torch kernels,
the batch-of-paths reference and the one-forward verify; time, peak memory and exactness of each, in one JSON file.

Run inside a copy of examples/mini-ddtree patched with the hybrid playbooks (gpu_session.py runs it in the copy
gpu_prepare.py made): it imports the copy's ddtree, dflash and the verify through its public entry points
(verify_entry_points), and nothing of ddops. No weights are downloaded: the target is built from a config with random
weights (what is timed does not depend on them), bf16 on CUDA, fp32 on the CPU.

    python gpu.py [--device cuda] [--layout 27b|tiny] [--dtype auto] [--layers N] [--contexts 8192,32768]
        [--budgets 16,64] [--repeats 5] [--prefill-chunk 4096] [--chain-block 16] [--time-limit 300]
        [--profile-over 1.15] [--out DIR]
    python gpu.py --table hybrid-gpu.json   # the markdown tables of playbooks/README.md's "On a GPU"

In the order the time limit cuts it (each phase rewrites DIR/hybrid-gpu.json, so a killed run leaves the last one):
1. the target (all layers of the layout if they fit, else 3/4, 1/2... of them: the JSON says how many), each context's
   random prompt prefilled in chunks, recording for crops started as the patched copy starts it;
2. per context and budget, DDTree's best-first tree over draft logits shaped like a trained draft's (one draw per
   context, so the smaller tree is the top of the larger), the four steps round-robin on fresh copies of the cache,
   each committing the same 4-node accepted path: every sample (CUDA events), the median, the peak memory
   (max_memory_allocated, reset per step: in all, and above what the weights, the caches and the step's copy of one
   hold), and the ratios to the lossy step on flash-linear-attention; then per context DFlash's block of
   --chain-block tokens: the fold (verify_chain) and, on 5.25+, transformers' native per-token recording (time,
   bytes held between verify and crop, committed states against the accepted tokens run on the cache);
3. where the one-forward step costs more than --profile-over times that lossy step: one step of each timed per layer
   kind (CUDA events around each decoder layer's linear attention, full attention and MLP, and the commit) and a
   torch.profiler table of the one-forward step (DIR/profile-CONTEXT-BUDGET.txt);
4. exactness: for the largest tree's root-to-leaf paths (as many as the time left allows, most new nodes first), a
   cache-free forward of prompt + path; per step, the share of checked nodes whose next-token argmax agrees with it
   and the largest logit difference (each step's first run; bf16 on CUDA, so the reference's own top-1 margin is
   reported beside them).

The lossy step on torch kernels swaps transformers' torch_chunk_gated_delta_rule (which dispatches to
flash-linear-attention when that imports) for the reference PyTorch function it wraps, for that step only. Without
flash-linear-attention (on a CPU it cannot run: its kernels are Triton GPU kernels) its row says why, and the ratios
are taken to the torch lossy step.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import inspect
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, ".")

LAYOUTS = {
    # Qwen3.5/3.6-27B: hidden 5120, FFN 17408, vocab 248320, 64 layers (3 Gated DeltaNet : 1 full attention), 24
    # query / 4 key-value heads of 256, Gated DeltaNet with 16 key and 48 value heads of 128, conv kernel 4.
    "27b": dict(vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4),
    # The same shape at toy size: for checking the script on a CPU.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4),
}
METHODS = ("lossy-fla", "lossy-torch", "paths", "new")
DRAFT_DEPTH = 15  # DDTree's default block of 16: 15 drafted positions
ACCEPTED = 4  # nodes every step commits (down the first children): a typical tau
RESULT = "hybrid-gpu.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="27b")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="auto: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--layers", type=int, help="build this many layers (a multiple of 4) instead of the layout's")
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--budgets", default="16,64")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each step (after one warm-up)")
    parser.add_argument("--prefill-chunk", type=int, default=4096)
    parser.add_argument("--chain-block", type=int, default=16, help="DFlash's block for the chain rows")
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds for the whole script")
    parser.add_argument("--profile-over", type=float, default=1.15,
                        help="profile the cases where the one-forward step costs more than this times the lossy one")
    parser.add_argument("--out", type=Path, default=Path("."), help=f"folder for {RESULT} and the profiles")
    parser.add_argument("--table", type=Path, metavar="JSON", help=f"print the markdown tables of a {RESULT} and exit")
    args = parser.parse_args(argv)
    try:
        args.contexts = [int(c) for c in args.contexts.split(",")]
        args.budgets = sorted(int(b) for b in args.budgets.split(","))
    except ValueError:
        parser.error("--contexts and --budgets are comma-separated whole numbers")
    if args.layers is not None and (args.layers < 4 or args.layers % 4):
        parser.error("--layers must be a positive multiple of 4 (3 linear-attention layers per full-attention one)")
    if min(args.contexts) < 1 or min(args.budgets) < 1 or args.repeats < 1 or args.chain_block < 2:
        parser.error("--contexts, --budgets and --repeats must be positive, --chain-block at least 2")
    return args


# --- the patched copy's verify: the one place that knows its entry points -------------------------------------------

def verify_entry_points(ddtree, dflash):
    """The patched copy's verify, reached through hybrid-tree-verify's module (ddops_hybrid_verify) and the helpers
    crop-relative inserts; the benchmark calls nothing else of it."""
    import ddops_hybrid_verify as hv

    def reference(*args):
        """The same public verify with its route refused: it takes (and labels, and commits) the batch of paths."""
        route = hv.verify_route
        hv.verify_route = lambda *_: "forced: the reference"
        try:
            return hv.verify_tree(*args)
        finally:
            hv.verify_route = route

    def commit(target, cache, past, accepted, ids):
        hv.commit_tree(target, cache, past, accepted, ids, ddtree.compact_dynamic_cache)

    return SimpleNamespace(
        record_past=dflash._ddops_record_past, crop_to=dflash._ddops_crop_to, verify=hv.verify_tree,
        reference=reference, commit=commit, chain=hv.verify_chain, linear_layers=hv.linear_layers, state=hv._state,
        plain=hv._plain,
        path_taken=lambda cache: next(iter(hv.verify_paths(cache) or {"none": 0})))


# --- the target, its kernels, the trees -----------------------------------------------------------------------------

def config_for(layout: str, layers: int | None, context: int):
    """The Qwen3.5 text config of the layout, optionally with fewer layers (the 3:1 pattern kept)."""
    from transformers import Qwen3_5TextConfig

    shape = dict(LAYOUTS[layout])
    if layers is not None:
        shape["num_hidden_layers"] = layers
    types_ = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(shape["num_hidden_layers"])]
    return Qwen3_5TextConfig(**shape, layer_types=types_, max_position_embeddings=max(65536, 2 * context))


def build_target(args, device, dtype):
    """The largest model of the layout that fits: the full layer count first, then 3/4, 1/2... of it."""
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
                    target = Qwen3_5ForCausalLM(config_for(args.layout, layers, max(args.contexts)))
            finally:
                torch.set_default_dtype(previous)
            return target.eval(), layers
        except torch.OutOfMemoryError:
            target = None
            empty_cache(device)
            smaller = (layers * 3 // 4) // 4 * 4
            if smaller < 4 or smaller == layers:
                raise
            layers = smaller


def bound_kernel(wrapper) -> str:
    """The function transformers' kernel wrapper calls: use_kernel_func_from_hub_with_fallback binds, at import,
    the package's kernel when it imports (fla, causal_conv1d), else the torch reference it wraps; 5.25 wraps that
    again in a `kernels` function module."""
    import torch

    kernel = wrapper
    for _ in range(8):  # through the wrappers to the one that holds what it calls
        if isinstance(kernel, torch.nn.Module):
            kernel = type(kernel).forward
        code = getattr(kernel, "__code__", None)
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in kernel.__closure__ or ()))) if code else {}
        inner = cells.get("implementation") or cells.get("func") or cells.get("forward_func") or \
            getattr(kernel, "__wrapped__", None)
        if inner is None:
            break
        kernel = inner
        if "implementation" in cells:
            break
    return f"{getattr(kernel, '__module__', None) or '?'}.{getattr(kernel, '__qualname__', type(kernel).__name__)}"


def rule_kernels(target, device):
    """(modeling module, {what the lossy step's chunked rule and conv call}, why flash-linear-attention is not the
    rule's kernel, or None)."""
    layer = next(m for m in target.modules() if hasattr(m, "conv1d") and hasattr(m, "layer_idx"))
    home = sys.modules[type(layer).__module__]
    kernels = {name: bound_kernel(getattr(home, name)) for name in ("torch_chunk_gated_delta_rule",
                                                                     "causal_conv1d_fn") if hasattr(home, name)}
    rule = kernels.get("torch_chunk_gated_delta_rule", "?")
    if device.type != "cuda":
        return home, kernels, "no CUDA device: flash-linear-attention's kernels are Triton GPU kernels"
    if rule.split(".")[0] == "fla":
        return home, kernels, None
    try:
        importlib.import_module("fla.ops.gated_delta_rule")
    except Exception as error:  # noqa: BLE001 - the reason is the figure
        return home, kernels, f"flash-linear-attention does not import: {type(error).__name__}: {error}"[:300]
    return home, kernels, f"fla imports, but this transformers' lossy step calls {rule}"


@contextlib.contextmanager
def torch_kernels(home, plain):
    """transformers' reference PyTorch gated delta rules (plain: what a wrapper wraps) instead of the kernels they
    dispatch to, for the block."""
    names = [n for n in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule") if hasattr(home, n)]
    saved = {name: getattr(home, name) for name in names}
    try:
        for name, function in saved.items():
            setattr(home, name, plain(function))
        yield
    finally:
        for name, function in saved.items():
            setattr(home, name, function)


def peaked_draft_logits(depth: int, vocab: int, generator):
    """Draft logits shaped like a trained draft's: at each position 8 candidates, probabilities falling ~4.5x per
    rank, so that the best-first tree grows both deep (along the top choices) and wide, as DDTree's do."""
    import torch

    logits = torch.full((depth, vocab), -30.0)
    for position in range(depth):
        candidates = torch.randperm(vocab, generator=generator)[:8]
        logits[position, candidates] = -1.5 * torch.arange(8, dtype=torch.float32)
    return logits


def root_paths(parents: list[int]) -> list[list[int]]:
    """Each node's path from the root (parents precede children)."""
    paths: list[list[int]] = []
    for node, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else []) + [node])
    return paths


def leaves_by_coverage(parents: list[int], first: list[int]) -> list[list[int]]:
    """Root-to-leaf paths, the one through `first` (a path) first, then each covering the most nodes not yet covered."""
    paths = root_paths(parents)
    leaves = [paths[n] for n in range(len(parents)) if n not in set(parents[1:])]
    ordered, covered = [], set()
    leaves.sort(key=lambda p: p[:len(first)] != first)
    while leaves:
        best = leaves[0] if not ordered else max(leaves, key=lambda p: len(set(p) - covered))
        leaves.remove(best)
        ordered.append(best)
        covered |= set(best)
    return ordered


# --- measuring ------------------------------------------------------------------------------------------------------

def synchronize(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def empty_cache(device):
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


class Clock:
    """Elapsed time of what runs between start() and stop(): CUDA events on a GPU, the wall clock on a CPU."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.device = device
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self):
        if self.cuda:
            self.begin.record()
        else:
            self.tick = time.perf_counter()

    def stop(self) -> float:
        """Milliseconds (waits for the device)."""
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.begin.elapsed_time(self.end)
        return (time.perf_counter() - self.tick) * 1e3


def run_step(verify, commit, cache, device):
    """(ms, (peak bytes allocated, the part above what was allocated before it) or None on a CPU, the verify's
    output): verify + commit on a fresh copy of cache (the copy is not timed)."""
    import torch

    fresh = copy.deepcopy(cache)
    synchronize(device)
    before = None
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    clock = Clock(device)
    clock.start()
    output = verify(fresh)
    commit(fresh, output)
    ms = clock.stop()
    peak = None
    if before is not None:
        peak = torch.cuda.max_memory_allocated(device)
        peak = (peak, peak - before)
    del fresh
    return ms, peak, output


def tensor_bytes(value, seen=None) -> int:
    """Bytes of the tensors a cache (or anything) holds, each storage counted once."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        key = (value.untyped_storage().data_ptr(), value.device)
        if key in seen:
            return 0
        seen.add(key)
        return value.untyped_storage().nbytes()
    if isinstance(value, dict):
        return sum(tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in value)
    if hasattr(value, "__dict__"):
        return sum(tensor_bytes(v, seen) for v in vars(value).values())
    return 0


def gib(count) -> float | None:
    return None if count is None else round(count / 2**30, 3)


@contextlib.contextmanager
def layer_sections(target, device, totals: dict):
    """Adds to totals[kind] the milliseconds each decoder layer's linear attention, full attention and MLP take
    (CUDA events recorded around each, read once the block is over: the launches still overlap the GPU's work)."""
    import torch

    kinds = {"linear_attn": "linear_attention", "self_attn": "full_attention", "mlp": "mlp"}
    cuda = device.type == "cuda"
    marks, handles = [], []

    def now():
        if not cuda:
            return time.perf_counter() * 1e3
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    for layer in target.model.layers:
        for attribute, kind in kinds.items():
            module = getattr(layer, attribute, None)
            if module is not None:
                handles.append(module.register_forward_pre_hook(lambda *_, k=kind: marks.append([k, now(), None])))
                handles.append(module.register_forward_hook(lambda *_: marks[-1].__setitem__(2, now())))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        synchronize(device)
        for kind, begin, end in marks:
            totals[kind] = totals.get(kind, 0.0) + (begin.elapsed_time(end) if cuda else end - begin)


def profile_case(target, steps, cache, device, baseline, out: Path, name: str) -> dict:
    """Per layer kind, the one-forward step and the baseline lossy step; and a torch.profiler table of the first."""
    import torch

    sections = {}
    for label in ("new", baseline):
        verify, commit = steps[label]
        fresh = copy.deepcopy(cache)
        totals: dict[str, float] = {}
        synchronize(device)
        clock = Clock(device)
        clock.start()
        with layer_sections(target, device, totals):
            output = verify(fresh)
        totals["verify"] = clock.stop()
        clock.start()
        commit(fresh, output)
        totals["commit"] = clock.stop()
        totals["other"] = totals["verify"] - sum(totals.get(k, 0.0) for k in ("linear_attention", "full_attention",
                                                                              "mlp"))
        sections[label] = {k: round(v, 3) for k, v in totals.items()}
        del fresh, output
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fresh = copy.deepcopy(cache)
    with torch.profiler.profile(activities=activities) as profiler:
        verify, commit = steps["new"]
        commit(fresh, verify(fresh))
        synchronize(device)
    path = out / f"profile-{name}.txt"
    with path.open("w") as text:  # where the device's time goes, and where the host's (launches) goes
        for sort in (["self_device_time_total"] if device.type == "cuda" else []) + ["self_cpu_time_total"]:
            table = profiler.key_averages().table(sort_by=sort, row_limit=40)
            text.write(f"one-forward step (verify + commit), {name}, sorted by {sort}\n\n{table}\n\n")
    return {"sections_ms": sections, "baseline": baseline, "table": path.name}


def exactness(logits, references: dict, keys: list) -> dict | None:
    """Next-token argmax agreement and largest logit difference of one step's logits against the cache-free ones."""
    checked = [(node, references[key]) for node, key in enumerate(keys) if key in references]
    if logits is None or not checked:
        return None
    agree, gap = 0, 0.0
    for node, reference in checked:
        mine = logits[node].float()
        agree += int(mine.argmax() == reference.argmax())
        gap = max(gap, (mine - reference.float()).abs().max().item())
    return {"nodes": len(checked), "agree": agree, "share": round(agree / len(checked), 4), "max_logit_gap": gap}


# --- the run --------------------------------------------------------------------------------------------------------

def versions(device) -> dict:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "triton", "flash-linear-attention", "fla-core", "accelerate"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["driver"] = None
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        found["driver"] = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        found["device"] = properties.name
        found["capability"] = f"{properties.major}.{properties.minor}"
        found["device_memory_gib"] = gib(properties.total_memory)
    else:
        found["device"] = f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
    return found


def tables(report: dict) -> str:
    """The markdown tables of playbooks/README.md's GPU section, from one result file."""

    def cell(method, key, digits=2):
        value = method.get(key) if isinstance(method, dict) else None
        return "—" if value is None else f"{value:.{digits}f}"

    time_rows, exact_rows = [], []
    for case in report["cases"]:
        methods, ratios, exact = case["methods"], case["ratios"], case.get("exactness") or {}
        shape = f"{case['context']} | {case['budget']} | {case['nodes']} ({case['paths']} × {case['depth']})"
        base = case["baseline"]
        time_rows.append(
            f"| {shape} | " + " | ".join(cell(methods[m], "median_ms", 1) for m in METHODS) + " | "
            + " | ".join(f"{ratios[f'{m}/{base}']:.2f}x" if f"{m}/{base}" in ratios else "—"
                         for m in ("new", "paths")) + " | "
            + " / ".join(cell(methods[m], "peak_above_cache_gib") for m in METHODS) + " |")
        exact_rows.append(
            f"| {shape} | {exact.get('nodes_checked', 0)}/{case['nodes']} | "
            + " | ".join(f"{exact[m]['agree']}/{exact[m]['nodes']}, {exact[m]['max_logit_gap']:.3g}"
                         if exact.get(m) else "—" for m in METHODS)
            + f" | {cell(exact, 'reference_top1_margin_median', 3)} |")
    def pair(chain, key):
        return " / ".join("—" if chain.get(f"{label}_{key}") is None else f"{chain[f'{label}_{key}']:.3g}"
                          for label in ("native", "fold"))

    chain_rows = [f"| {c['context']} | {c['chain_block']} | "
                  + " | ".join(pair(c, key) for key in ("ms", "held_mib", "max_state_diff")) + " |"
                  for c in report.get("chains", [])]
    model, found = report["model"], report["versions"]
    return "\n".join([
        f"{found['device']}, {model['layers']} of {model['of_layers']} layers ({model['linear_attention_layers']} "
        f"Gated DeltaNet + {model['full_attention_layers']} full attention), {model['dtype']}; torch {found['torch']}, "
        f"transformers {found['transformers']}, triton {found['triton']}, fla {found['fla-core']}, CUDA "
        f"{found['cuda']}, driver {found['driver']}; baseline of the ratios: {report['cases'][0]['baseline']}"
        if report["cases"] else "no cases measured", "",
        "| context | budget | nodes (paths × depth) | lossy fla ms | lossy torch ms | paths ms | new ms | "
        "new / lossy | paths / lossy | peak above the cache, GiB (fla / torch / paths / new) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *time_rows, "",
        "| context | budget | nodes (paths × depth) | nodes checked | lossy fla: argmax agree, max logit gap | "
        "lossy torch | paths | new | reference top-1 margin (median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |", *exact_rows, "",
        "| context | DFlash block | ms, native / fold | held MiB, native / fold | states vs reference, native / fold |",
        "| --- | --- | --- | --- | --- |", *chain_rows])


def main() -> None:
    began = time.monotonic()
    args = parse_args()  # before torch: bad arguments fail in a moment
    if args.table:
        print(tables(json.loads(args.table.read_text())))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    import ddtree
    import dflash
    import torch
    from transformers import DynamicCache

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else \
        torch.bfloat16 if device.type == "cuda" else torch.float32
    api = verify_entry_points(ddtree, dflash)
    report = {"argv": sys.argv[1:], "versions": versions(device), "time_limit_s": args.time_limit, "stopped": None,
              "errors": [], "phases": {}, "contexts": [], "cases": [], "chains": []}

    def save(phase):
        report["phases"][phase] = round(time.monotonic() - began, 1)
        report["controller_imports"] = sorted({m.split(".")[0] for m in sys.modules} & {"ddops", "libcst", "paramiko"})
        partial = args.out / f".{RESULT}"
        partial.write_text(json.dumps(report, indent=1) + "\n")
        partial.replace(args.out / RESULT)

    def left() -> float:
        return args.time_limit - (time.monotonic() - began)

    target, layers = build_target(args, device, dtype)
    synchronize(device)
    home, kernels, no_fla = rule_kernels(target, device)
    kernel = kernels.get("torch_chunk_gated_delta_rule")
    config = target.config
    report["model"] = {
        "layout": args.layout, "layers": layers, "of_layers": LAYOUTS[args.layout]["num_hidden_layers"],
        "linear_attention_layers": config.layer_types.count("linear_attention"),
        "full_attention_layers": config.layer_types.count("full_attention"), "dtype": str(dtype).split(".")[-1],
        "parameters": sum(p.numel() for p in target.parameters()), "weights_gib": gib(tensor_bytes(list(
            target.parameters()))), "built_s": round(time.monotonic() - began, 1)}
    report["kernels"] = {**kernels, "lossy-fla_skipped": no_fla,
                         "lossy-torch": f"{home.__name__}.torch_chunk_gated_delta_rule (its torch reference)"}
    save("model")
    vocab = config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prefill_estimate = 0.0

    with torch.inference_mode():
        # 1. prompts and prefilled caches, kept for the whole run (they are small next to the weights)
        contexts = []
        for context in args.contexts:
            if left() < 2 * prefill_estimate * context:
                report["stopped"] = f"time limit, before the {context}-token prefill"
                break
            tick = time.monotonic()
            prompt = torch.randint(0, vocab, (1, context), generator=generator).to(device)
            draft_logits = peaked_draft_logits(DRAFT_DEPTH, vocab, generator)
            with recorded(report, f"prefill {context}", device):
                cache = DynamicCache(config=config)
                for offset in range(0, context, args.prefill_chunk):
                    piece = prompt[:, offset:offset + args.prefill_chunk]
                    chunk = time.monotonic()
                    target(piece, position_ids=torch.arange(offset, offset + piece.shape[1], device=device)[None],
                           past_key_values=cache, use_cache=True, logits_to_keep=1)
                    synchronize(device)
                    # seconds per token of the fastest chunk (the first ones compile kernels) for the time guards
                    rate = (time.monotonic() - chunk) / piece.shape[1]
                    prefill_estimate = min(prefill_estimate or rate, rate)
                api.record_past(cache, context + max(args.budgets) + 1)  # as the patched crop-relative does
                synchronize(device)
                seconds = time.monotonic() - tick
                contexts.append(SimpleNamespace(context=context, prompt=prompt, cache=cache,
                                                draft_logits=draft_logits))
                report["contexts"].append({"context": context, "prefill_s": round(seconds, 2),
                                           "cache_gib": gib(tensor_bytes(cache))})
            save("prefill")

        # 2. the four steps, round-robin, per context and budget
        cases = []
        for ctx in contexts:
            for budget in args.budgets:
                case = measure(args, target, home, api, ddtree, ctx, budget, device, no_fla, left)
                cases.append(case)
                report["cases"].append(case.row)
                save("steps")
                if case.row.get("stopped"):
                    report["stopped"] = case.row["stopped"]
                    break
            if report["stopped"]:
                break

        # 2b. DFlash's block: the fold, and transformers' native per-token recording where it has one (5.25+)
        for ctx in contexts:
            if left() > 60:
                with recorded(report, f"chain {ctx.context}", device):
                    report["chains"].append(chain_row(args, target, api, ctx, device, generator))
                save("chains")

        # 3. where the one-forward step costs more than --profile-over times the lossy one: where its time goes
        for case in cases:
            ratio = case.row["ratios"].get(f"new/{case.row['baseline']}")
            if ratio is not None and ratio > args.profile_over and left() > 30:
                with recorded(report, f"profile {case.ctx.context}-{case.row['budget']}", device):
                    case.row["profile"] = profile_case(target, case.steps, case.ctx.cache, device,
                                                       case.row["baseline"], args.out,
                                                       f"{case.ctx.context}-{case.row['budget']}")
                save("profiles")

        # 4. exactness against cache-free forwards of prompt + path (the largest tree's paths, while time is left)
        for ctx in contexts:
            mine = [case for case in cases if case.ctx is ctx]
            if not mine:
                continue
            with recorded(report, f"exactness {ctx.context}", device):
                check_exactness(ctx, mine, contexts, target, kernel, left, prefill_estimate)
            save("exactness")
    report["total_s"] = round(time.monotonic() - began, 1)
    save("done")
    print(json.dumps({"result": str(args.out / RESULT), "stopped": report["stopped"], "total_s": report["total_s"]}))


@contextlib.contextmanager
def recorded(report, phase, device):
    """An error goes into the report, and what comes after still runs (a one-shot run keeps what it can)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - the figures so far are kept (out of memory included)
        report["errors"].append(f"{phase}: {type(error).__name__}: {error}"[:1000])
        empty_cache(device)


def check_exactness(ctx, mine, contexts, target, kernel, left, prefill_estimate):
    """Phase 4 for one context: cache-free forwards of prompt + path for the largest tree's paths (while this
    context's share of the time left lasts), then each case's steps against them."""
    import torch

    largest = max(mine, key=lambda case: case.row["budget"])
    references, done, tick = {}, 0, time.monotonic()
    share = (left() - 10) / (len(contexts) - contexts.index(ctx))  # this context's part of the time left
    for path in leaves_by_coverage(largest.parents, largest.accepted):
        spent = time.monotonic() - tick
        each = spent / done if done else prefill_estimate * ctx.context
        if spent + 1.5 * each > share:  # no time for one more path
            break
        tokens = largest.vin[0, path]
        ids = torch.cat([ctx.prompt[0], tokens]).unsqueeze(0)
        logits = target(ids, use_cache=False, logits_to_keep=len(path)).logits[0]
        for depth in range(len(path)):
            references[tuple(tokens[:depth + 1].tolist())] = logits[depth]
        done += 1
    for case in mine:
        keys = [tuple(case.vin[0, path].tolist()) for path in root_paths(case.parents)]
        margins = [float(top[0] - top[1]) for top in
                   (references[key].float().topk(2).values for key in keys if key in references)]
        case.row["exactness"] = {
            "reference": f"cache-free forward of prompt + path (chunked rule: {kernel})",
            "paths_checked": done, "nodes_checked": len(margins), "of_nodes": len(keys),
            "reference_top1_margin_min": min(margins, default=None),
            "reference_top1_margin_median": statistics.median(margins) if margins else None,
            **{label: exactness(case.logits.get(label), references, keys) for label in METHODS}}
        case.logits.clear()


def chain_row(args, target, api, ctx, device, generator) -> dict:
    """DFlash's block (--chain-block tokens, 4 accepted): the fold (verify_chain, then the crop) and, on 5.25+,
    transformers' native recording (the plain verify keeps each token's recurrent state, the crop puts back the
    accepted one): verify + crop time, the bytes the linear layers hold between the two, and each committed state
    against the reference (the accepted tokens run on the cache)."""
    import torch

    context, cache = ctx.context, ctx.cache
    block = torch.randint(0, target.config.vocab_size, (1, args.chain_block), generator=generator).to(device)
    positions = torch.arange(context, context + args.chain_block, device=device)[None]
    kept = min(ACCEPTED, args.chain_block)
    linear = list(api.linear_layers(cache).values())
    native = "recurrent_states_to_keep" in inspect.signature(linear[0].activate_past_recording).parameters

    def held(c):
        layers = api.linear_layers(c).values()
        return sum(api.state(layer, "conv_states").nbytes for layer in layers) + sum(
            state.nbytes for layer in layers
            for states in (getattr(layer, "recurrent_states_history", None) or {}).values() for state in states)

    reference = copy.deepcopy(cache)
    target(block[:, :kept], position_ids=positions[:, :kept], past_key_values=reference, use_cache=True)
    api.crop_to(reference, context + kept)
    verifiers = {"fold": lambda c: api.chain(target, c), **({"native": lambda c: target} if native else {})}
    row = {"context": context, "chain_block": args.chain_block, "accepted": kept, "native_recording": native}
    samples = {label: [] for label in verifiers}
    for repeat in range(args.repeats + 1):
        for label, verifier in verifiers.items():
            fresh = copy.deepcopy(cache)
            synchronize(device)
            clock = Clock(device)
            clock.start()
            verifier(fresh)(block, position_ids=positions, past_key_values=fresh, use_cache=True)
            size = held(fresh)
            api.crop_to(fresh, context + kept)
            ms = clock.stop()
            if repeat:
                samples[label].append(round(ms, 4))
            row[f"{label}_held_mib"] = round(size / 2**20, 2)
            row[f"{label}_max_state_diff"] = max(
                (api.state(a, n).float() - api.state(b, n).float()).abs().max().item()
                for a, b in zip(api.linear_layers(fresh).values(), api.linear_layers(reference).values())
                for n in ("recurrent_states", "conv_states"))
            del fresh
    for label, values in samples.items():
        row[f"{label}_ms"], row[f"{label}_samples_ms"] = round(statistics.median(values), 4), values
    return row


def measure(args, target, home, api, ddtree, ctx, budget, device, no_fla, left):
    """One context and budget: the tree, the four steps timed round-robin (warm-up first), their memory and logits."""
    import torch

    context, cache = ctx.context, ctx.cache
    node_ids, depths, parents, child_maps, visibility, _ = ddtree.build_ddtree_tree(ctx.draft_logits, budget)
    vin, vpos, vmask = ddtree.compile_ddtree_tree(ctx.prompt[0, -1], context, node_ids, depths, visibility, context,
                                                  target.dtype, device)
    parents = [int(p) for p in parents]
    accepted = [0]
    while len(accepted) < ACCEPTED and accepted[-1] in parents[1:]:  # down the first children
        accepted.append(parents.index(accepted[-1]))

    def lossy(c):
        return target(vin, position_ids=vpos, attention_mask=vmask, past_key_values=c, use_cache=True,
                      output_hidden_states=True)

    def lossy_commit(c, _):
        ddtree.compact_dynamic_cache(c, context, accepted)

    def commit(c, _):
        api.commit(target, c, context, accepted, vin)

    paths_taken = {}

    def new(c):
        output = api.verify(target, vin, vpos, vmask, c, parents)
        paths_taken["new"] = api.path_taken(c)
        return output

    def lossy_torch(c):
        with torch_kernels(home, api.plain):
            return lossy(c)

    steps = {"lossy-fla": (lossy, lossy_commit), "lossy-torch": (lossy_torch, lossy_commit),
             "paths": (lambda c: api.reference(target, vin, vpos, vmask, c, parents), commit), "new": (new, commit)}
    skipped = {"lossy-fla": no_fla} if no_fla else {}
    labels = [m for m in METHODS if m not in skipped]
    samples = {label: [] for label in labels}
    peaks, logits, failed, stopped = {}, {}, {}, None
    slowest = 0.0
    for repeat in range(args.repeats + 1):
        for label in (labels if repeat % 2 else labels[::-1]):
            if label in failed:
                continue
            if left() < 3 * slowest / 1e3 + 5:
                stopped = stopped or f"time limit, at context {context} budget {budget}"
                continue
            try:
                ms, peak, output = run_step(*steps[label], cache, device)
            except torch.OutOfMemoryError:
                failed[label] = "out of memory"
                empty_cache(device)
                continue
            except Exception as error:  # noqa: BLE001 - one step failing must not cost the others' figures
                failed[label] = f"failed: {type(error).__name__}: {error}"[:500]
                continue
            slowest = max(slowest, ms)
            if repeat == 0:  # the warm-up (kernels compile): its logits, for exactness
                logits[label] = output.logits[0].detach()
            else:
                samples[label].append(round(ms, 4))
                peaks[label] = None if peak is None else max(peak, peaks.get(label) or (0, 0))
            del output
    medians = {label: statistics.median(values) for label, values in samples.items() if values}
    baseline = "lossy-fla" if "lossy-fla" in medians else "lossy-torch"
    methods = {}
    for label in METHODS:
        if label in skipped or label in failed:
            methods[label] = {"skipped": skipped.get(label) or failed[label]}
            continue
        methods[label] = {"median_ms": round(medians[label], 4) if label in medians else None,
                          "samples_ms": samples[label], "peak_gib": gib((peaks.get(label) or (None,))[0]),
                          "peak_above_cache_gib": gib((peaks.get(label) or (None, None))[1])}
    ratios = {f"{label}/{baseline}": round(medians[label] / medians[baseline], 4)
              for label in medians if baseline in medians and label != baseline}
    if "lossy-fla" in medians and "lossy-torch" in medians:
        ratios["new/lossy-torch"] = round(medians["new"] / medians["lossy-torch"], 4) if "new" in medians else None
    row = {"context": context, "budget": budget, "nodes": len(parents),
           "paths": len(parents) - len(set(parents[1:])), "depth": int(depths.max()), "accepted": len(accepted),
           "new_verify_path": paths_taken.get("new"), "baseline": baseline, "methods": methods, "ratios": ratios,
           "stopped": stopped}
    return SimpleNamespace(row=row, ctx=ctx, steps=steps, logits=logits, parents=parents, accepted=accepted,
                           vin=vin)


if __name__ == "__main__":
    main()
