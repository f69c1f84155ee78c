"""Run baseline (autoregressive), DFlash and DDTree (one run per tree budget) over a local dataset; save one .pt.

    torchrun --nproc_per_node=1 benchmark.py --model-name-or-path models/target --draft-name-or-path models/draft \
        --dataset mini --max-samples 2 --max-new-tokens 16 --tree-budget 4,8 --save-path runs/mini.pt
"""

import argparse
import os
import random
from itertools import chain
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import distributed as dist  # noqa: E402
from ddtree import ddtree_generate, maybe_enable_cpp_compact  # noqa: E402
from dflash import dflash_generate  # noqa: E402
from model import ByteTokenizer, DFlashDraftModel, load_and_process_dataset, select_samples  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name-or-path", type=str, required=True)
    parser.add_argument("--draft-name-or-path", type=str, required=True)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--tree-budget", type=str, default="16,32,64,128,256,512,1024")
    parser.add_argument("--dataset", type=str, required=True)
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--flash-attn", action="store_true")
    parser.add_argument("--disable-cpp-compact-cache", action="store_true")
    parser.add_argument("--save-path", type=str, default=None)
    return parser.parse_args(argv)


def has_flash_attn() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    args = parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False

    dist.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.local_rank())
        device = torch.device(f"cuda:{dist.local_rank()}")
    else:
        device = torch.device("cpu")
    maybe_enable_cpp_compact(not args.disable_cpp_compact_cache)

    installed_flash_attn = has_flash_attn()
    if args.flash_attn and not installed_flash_attn:
        raise RuntimeError("--flash-attn needs the flash_attn package")
    target_attn_implementation = "flash_attention_2" if args.flash_attn else "sdpa"
    draft_attn_implementation = "flash_attention_2" if installed_flash_attn and device.type == "cuda" else "sdpa"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    target = AutoModelForCausalLM.from_pretrained(
        args.model_name_or_path,
        attn_implementation=target_attn_implementation,
        dtype=dtype,
    ).to(device).eval()
    draft_model = DFlashDraftModel.from_pretrained(
        args.draft_name_or_path,
        attn_implementation=draft_attn_implementation,
        dtype=dtype,
    ).to(device).eval()

    block_size = args.block_size if args.block_size is not None else draft_model.block_size
    tree_budgets = [int(budget) for budget in args.tree_budget.split(",") if budget.strip()]
    methods_to_run = ["dflash"]
    method_key_to_tree_budget: dict[str, int] = {}
    if not args.flash_attn:  # the tree attention mask needs sdpa on the target
        for budget in tree_budgets:
            methods_to_run.append(f"ddtree_tb{budget}")
            method_key_to_tree_budget[f"ddtree_tb{budget}"] = budget

    tokenizer = ByteTokenizer.from_pretrained(args.model_name_or_path)
    dataset = select_samples(load_and_process_dataset(args.dataset), args.max_samples)
    stop_token_ids = [tokenizer.eos_token_id]

    def run_method(method_key: str, input_ids: torch.Tensor, max_new_tokens: int):
        common = dict(
            model=draft_model,
            target=target,
            input_ids=input_ids,
            mask_token_id=draft_model.mask_token_id,
            max_new_tokens=max_new_tokens,
            stop_token_ids=stop_token_ids,
            temperature=args.temperature,
        )
        if method_key == "baseline":
            return dflash_generate(block_size=1, **common)
        if method_key == "dflash":
            return dflash_generate(block_size=block_size, **common)
        return ddtree_generate(block_size=block_size, tree_budget=method_key_to_tree_budget[method_key], **common)

    warmup_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Warmup"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    warmup_input_ids = tokenizer.encode(warmup_text, return_tensors="pt").to(device)
    for method_key in ["baseline", *methods_to_run]:
        run_method(method_key, warmup_input_ids, min(args.max_new_tokens, 16))

    responses = []
    for idx in tqdm(range(dist.rank(), len(dataset), dist.size()), disable=not dist.is_main()):
        messages = []
        for user_content in dataset[idx]["turns"]:
            messages.append({"role": "user", "content": user_content})
            input_text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
            input_ids = tokenizer.encode(input_text, return_tensors="pt").to(device)
            response = {key: run_method(key, input_ids, args.max_new_tokens) for key in ["baseline", *methods_to_run]}
            last = response[methods_to_run[-1]]
            reply = tokenizer.decode(last.output_ids[0, last.num_input_tokens :], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": reply})
            responses.append(response)

    if dist.size() > 1:
        gathered = dist.gather(responses, dst=0)
        if not dist.is_main():
            dist.destroy()
            return
        responses = list(chain(*gathered))

    run_data = {
        "responses": responses,
        "block_size": block_size,
        "draft_attn_implementation": draft_attn_implementation,
        "target_attn_implementation": target_attn_implementation,
        "args": vars(args),
    }
    if args.save_path is not None:
        save_path = Path(args.save_path)
        save_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(run_data, save_path)
    print_summary(responses, ["baseline", *methods_to_run], args.save_path)
    dist.destroy()


def print_summary(responses: list[dict], method_keys: list[str], save_path: str | None) -> None:
    """One line per method: tau, time per output token, speedup and how many outputs equal the baseline's."""
    if not responses:
        print("no responses")
        return

    def mean(values):
        values = list(values)
        return sum(values) / max(len(values), 1)

    base_tpot = mean(r["baseline"].time_per_output_token for r in responses)
    for key in method_keys:
        runs = [r[key] for r in responses]
        tau = mean(mean(run.acceptance_lengths) for run in runs)
        tpot = mean(run.time_per_output_token for run in runs)
        same = sum(torch.equal(r[key].output_ids, r["baseline"].output_ids) for r in responses)
        print(
            f"{key:>14}  tau={tau:5.2f}  tpot={tpot * 1e3:8.3f} ms  speedup={base_tpot / tpot:5.2f}x"
            f"  equals_baseline={same}/{len(runs)}"
        )
    if save_path is not None:
        print(f"saved {save_path}")


if __name__ == "__main__":
    main()
