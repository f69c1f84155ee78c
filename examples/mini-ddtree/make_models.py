"""Build the tiny random-initialised target and draft, seeded, and save them with save_pretrained.

The target is a Qwen3.5 hybrid (Gated DeltaNet linear attention + full attention), the layout that breaks the
upstream cache handling; the draft is a one-layer DFlash-style block drafter reading two target layers. The draft is
then briefly distilled on the target's own greedy continuations, so that it agrees with the target often enough for
acceptance lengths above 1 (a purely random draft almost never does). Nothing is downloaded.

    python make_models.py --out models                       # -> models/target, models/draft (~8 s CPU)
    python make_models.py --out models --distill-steps 0     # random draft, ~3 s
"""

import argparse
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config  # noqa: E402

from model import ByteTokenizer, DFlashDraftModel, extract_context_feature  # noqa: E402
from model.tokenizer import VOCAB_SIZE  # noqa: E402

# Layer 0 is full attention on purpose: the first cache layer then decides which error a positive crop() raises
# (DynamicLayer: ValueError), as described in PATCH_SITES.md. Real Qwen3.5 checkpoints start with linear layers.
TARGET_LAYER_TYPES = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
HIDDEN_SIZE = 64
BLOCK_SIZE = 4


def build_target(seed: int) -> Qwen3_5ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=len(TARGET_LAYER_TYPES),
        layer_types=list(TARGET_LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=ByteTokenizer().eos_token_id,
        pad_token_id=ByteTokenizer().pad_token_id,
    )
    return Qwen3_5ForCausalLM(config).eval()


def build_draft(seed: int, num_target_layers: int) -> DFlashDraftModel:
    torch.manual_seed(seed + 1)
    tokenizer = ByteTokenizer()
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,  # must equal the target's: the draft reads its embeddings and feeds its lm_head
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        architectures=["DFlashDraftModel"],
        block_size=BLOCK_SIZE,
        num_target_layers=num_target_layers,
        dflash_config={"mask_token_id": tokenizer.mask_token_id, "target_layer_ids": [1, 2]},
    )
    return DFlashDraftModel(config).eval()


def greedy_continuations(target, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """[batch, prompt + new_tokens]: the target's own greedy continuations of equal-length prompts."""
    cache = DynamicCache(config=target.config)
    logits = target(prompts, cache=cache, use_cache=True).logits
    tokens = [logits[:, -1].argmax(-1)]
    for _ in range(new_tokens - 1):
        tokens.append(target(tokens[-1][:, None], cache=cache, use_cache=True).logits[:, -1].argmax(-1))
    return torch.cat([prompts, torch.stack(tokens, dim=1)], dim=1)


def distill_draft(target, draft: DFlashDraftModel, steps: int, seed: int, batch: int = 64) -> None:
    """Teach the draft the target's next block: at a random anchor s it sees the target features of tokens < s and
    the block [token s, mask, ...], and must predict tokens s+1.. of the target's greedy continuation."""
    if steps <= 0:
        return
    rng = random.Random(seed)
    tokenizer = ByteTokenizer()
    letters = "abcdefghijklmnopqrstuvwxyz      ,.?0123456789"
    texts = ["".join(rng.choice(letters) for _ in range(48)) for _ in range(batch)]  # equal token counts
    chats = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        for text in texts
    ]
    prompts = torch.cat([tokenizer.encode(chat, return_tensors="pt") for chat in chats])
    with torch.inference_mode():
        sequences = greedy_continuations(target, prompts, new_tokens=48)
        hidden_states = target(sequences, output_hidden_states=True).hidden_states
        features = extract_context_feature(hidden_states, draft.target_layer_ids)
    sequences, features = sequences.clone(), features.clone()  # leave inference mode for training

    for parameter in target.parameters():
        parameter.requires_grad_(False)
    block_size, prompt_length = draft.block_size, prompts.shape[1]
    optimizer = torch.optim.AdamW(draft.parameters(), lr=5e-3)
    draft.train()
    for _ in range(steps):
        anchor = rng.randint(prompt_length, sequences.shape[1] - block_size)
        block = sequences[:, anchor : anchor + block_size].clone()
        labels = block[:, 1:].clone()
        block[:, 1:] = draft.mask_token_id
        hidden = draft(
            position_ids=torch.arange(anchor + block_size).unsqueeze(0),
            noise_embedding=target.model.embed_tokens(block),
            target_hidden=features[:, :anchor],
        )
        logits = target.lm_head(hidden[:, 1:])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    draft.eval()
    print(f"distilled draft: {steps} steps, last loss {loss.item():.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distill-steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(min(torch.get_num_threads(), 4))

    target = build_target(args.seed)
    draft = build_draft(args.seed, target.config.num_hidden_layers)
    distill_draft(target, draft, args.distill_steps, args.seed)
    tokenizer = ByteTokenizer()
    for name, module in (("target", target), ("draft", draft)):
        path = args.out / name
        path.mkdir(parents=True, exist_ok=True)
        module.save_pretrained(path)
        tokenizer.save_pretrained(path)
        print(f"saved {name}: {sum(p.numel() for p in module.parameters())} parameters -> {path}")


if __name__ == "__main__":
    main()
