"""Build the mini targets and their drafts from scratch, seeded, and save them with save_pretrained.

Two targets of the same size (4 layers, hidden size 64, the byte-level 264-token vocabulary):
  qwen3.5-hybrid  Qwen3.5: full attention, Gated DeltaNet, Gated DeltaNet, full attention (the layout that breaks
                  the upstream cache handling, and whose recurrent state tree verification cannot roll back)
  qwen3-attn      Qwen3: four full-attention layers (every cache layer can be cropped: speculation is lossless)
Each target is first trained briefly on data/corpus.txt (chat replies that cycle through a few sentences), so its
greedy continuations are structured text a draft can learn, as a real model's are; each draft (a one-layer
DFlash-style block drafter reading two target layers) is then distilled on its target's own greedy outputs.
Nothing is downloaded; the same seed gives the same weights.

    python make_models.py --out models     # -> models/{qwen3.5-hybrid,qwen3-attn}{,-draft} (~30-50 s of CPU)
    python make_models.py --out models --target-steps 0 --distill-steps 0    # untrained, ~3 s (tests of plumbing)

From Python, `ensure_models(directory)` builds once and reuses the build while the recipe is unchanged.
"""

import argparse
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from model import ByteTokenizer, DFlashDraftModel, extract_context_feature  # noqa: E402
from model.tokenizer import VOCAB_SIZE  # noqa: E402
from model.utils import DATA_DIR  # noqa: E402

HERE = Path(__file__).resolve().parent
# Layer 0 is full attention on purpose: the first cache layer then decides which error a positive crop() raises
# (DynamicLayer: ValueError), as described in PATCH_SITES.md. Real Qwen3.5 checkpoints start with linear layers.
TARGET_LAYER_TYPES = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
HIDDEN_SIZE = 64
BLOCK_SIZE = 8
TARGETS = ("qwen3.5-hybrid", "qwen3-attn")  # directory names under --out; each draft is <name>-draft
# Per target: the pure-attention one needs more steps to keep to the corpus past a long prompt.
DEFAULT_TARGET_STEPS = {"qwen3.5-hybrid": 200, "qwen3-attn": 300}
TARGET_LR = {"qwen3.5-hybrid": 2e-2, "qwen3-attn": 1e-2}
# The hybrid's draft needs more: a rejected draft token stays in the Gated DeltaNet state, so every miss costs more.
DEFAULT_DISTILL_STEPS = {"qwen3.5-hybrid": 1000, "qwen3-attn": 600}
REPLY_CHARS = 200  # longer than any benchmark reply (max_new_tokens <= 128), so no reply is seen ending


def build_target(seed: int, kind: str = "qwen3.5-hybrid"):
    """An untrained target: the Qwen3.5 hybrid, or (kind="qwen3-attn") a Qwen3 of the same size."""
    torch.manual_seed(seed)
    tokenizer = ByteTokenizer()
    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=len(TARGET_LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if kind == "qwen3-attn":
        return Qwen3ForCausalLM(Qwen3Config(**common)).eval()
    if kind != "qwen3.5-hybrid":
        raise ValueError(f"unknown target kind {kind!r}: use one of {TARGETS}")
    config = Qwen3_5TextConfig(
        **common,
        layer_types=list(TARGET_LAYER_TYPES),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
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


# --- the corpus -----------------------------------------------------------------------------------------------------


def corpus_sentences(path: Path = DATA_DIR / "corpus.txt") -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def reply_text(sentences: list[str], first: int, chars: int = REPLY_CHARS) -> str:
    """The sentences in cyclic order from `first`, joined by spaces, cut to `chars` characters."""
    text, i = "", first
    while len(text) < chars:
        text += sentences[i % len(sentences)] + " "
        i += 1
    return text[:chars]


def training_prompts(rng: random.Random, count: int) -> list[str]:
    """Prompts of 1-120 characters, half word salad and half random characters, so the target learns to answer any
    prompt (the benchmark's own prompts are never trained on)."""
    words = ("how many what is the sum of apples pens she sold half in may why does a cache hold keys explain "
             "write a function that returns list three tips rewrite your answer fix the bug prime numbers below "
             "step by step give two sentences about decoding trees drafts").split()
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789      ,.?!'^()-+*/="
    prompts = []
    for _ in range(count):
        length = rng.randint(1, 120)
        if rng.random() < 0.5:
            text = " ".join(rng.choice(words) for _ in range(length // 5 + 1)).capitalize()
        else:
            text = "".join(rng.choice(chars) for _ in range(length))
        prompts.append(text[:length])
    return prompts


def training_chats(rng: random.Random, count: int, sentences: list[str]) -> list[tuple[list[int], int]]:
    """(token ids, reply start) per chat: a user prompt and an assistant reply from the corpus."""
    tokenizer = ByteTokenizer()
    chats = []
    for prompt in training_prompts(rng, count):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer.encode(text)
        reply = tokenizer.encode(reply_text(sentences, rng.randrange(len(sentences))))
        chats.append((ids + reply, len(ids)))
    return chats


def pad_batch(chats: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels (-100 outside the replies)."""
    pad = ByteTokenizer().pad_token_id
    width = max(len(ids) for ids, _ in chats)
    ids = torch.full((len(chats), width), pad, dtype=torch.long)
    labels = torch.full((len(chats), width), -100, dtype=torch.long)
    for row, (tokens, reply_start) in enumerate(chats):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, reply_start : len(tokens)] = torch.tensor(tokens[reply_start:])
    return ids, labels


# --- training -------------------------------------------------------------------------------------------------------


def train_target(target, steps: int, seed: int, batch: int = 8, lr: float = 2e-2, reply: int = 80) -> float | None:
    """Teach the target the corpus replies (next-token loss on the reply tokens); returns the last loss."""
    if steps <= 0:
        return None
    rng = random.Random(seed)
    sentences = corpus_sentences()
    optimizer = torch.optim.AdamW(target.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    target.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        ids, labels = pad_batch([(ids[: start + reply], start) for ids, start in training_chats(rng, batch, sentences)])
        logits = target(ids).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    target.eval()
    return loss.item()


def greedy_continuations(target, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """[batch, prompt + new_tokens]: the target's own greedy continuations of equal-length prompts."""
    cache = DynamicCache(config=target.config)
    logits = target(prompts, past_key_values=cache, use_cache=True).logits
    tokens = [logits[:, -1].argmax(-1)]
    for _ in range(new_tokens - 1):
        tokens.append(target(tokens[-1][:, None], past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1))
    return torch.cat([prompts, torch.stack(tokens, dim=1)], dim=1)


def distill_draft(target, draft: DFlashDraftModel, steps: int, seed: int, batch: int = 32,
                  new_tokens: int = 80, lr: float = 5e-3) -> float | None:
    """Teach the draft the target's next block: at a random anchor s it sees the target features of tokens < s and
    the block [token s, mask, ...], and must predict tokens s+1.. of the target's greedy continuation."""
    if steps <= 0:
        return None
    rng = random.Random(seed + 2)
    tokenizer = ByteTokenizer()
    prompts = []
    for text in training_prompts(rng, batch):
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer.encode(chat))
    # Equal lengths for batched greedy decoding: left-trim every prompt to the shortest (they all end the same way).
    shortest = min(len(p) for p in prompts)
    prompt_ids = torch.tensor([p[len(p) - shortest:] for p in prompts])
    with torch.inference_mode():
        sequences = greedy_continuations(target, prompt_ids, new_tokens=new_tokens)
        hidden_states = target(sequences, output_hidden_states=True).hidden_states
        features = extract_context_feature(hidden_states, draft.target_layer_ids)
    sequences, features = sequences.clone(), features.clone()  # leave inference mode for training

    for parameter in target.parameters():
        parameter.requires_grad_(False)
    block_size, prompt_length = draft.block_size, prompt_ids.shape[1]
    optimizer = torch.optim.AdamW(draft.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    draft.train()
    loss = torch.tensor(0.0)
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
        schedule.step()
    draft.eval()
    for parameter in target.parameters():
        parameter.requires_grad_(True)
    return loss.item()


# --- building and caching -------------------------------------------------------------------------------------------


def recipe(seed: int, target_steps: int | None, distill_steps: int | None) -> dict:
    """Everything the weights depend on: the settings and the bytes of the code and corpus that make them."""
    digest = hashlib.sha256()
    for path in [HERE / "make_models.py", DATA_DIR / "corpus.txt", *sorted((HERE / "model").glob("*.py"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"seed": seed, "target_steps": target_steps, "distill_steps": distill_steps,
            "torch": torch.__version__.split("+")[0], "code": digest.hexdigest()[:16]}


def build_pair(out: Path, kind: str, seed: int, target_steps: int | None, distill_steps: int | None) -> str:
    """Train and save one target and its draft under out/<kind> and out/<kind>-draft; returns a line for the log."""
    # One thread: these models are too small to share out, and on a busy host extra threads only spin.
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    began = time.process_time()
    tokenizer = ByteTokenizer()
    target = build_target(seed, kind)
    target_steps = DEFAULT_TARGET_STEPS[kind] if target_steps is None else target_steps
    target_loss = train_target(target, target_steps, seed, lr=TARGET_LR[kind])
    distill_steps = DEFAULT_DISTILL_STEPS[kind] if distill_steps is None else distill_steps
    draft = build_draft(seed, target.config.num_hidden_layers)
    draft_loss = distill_draft(target, draft, distill_steps, seed)
    for name, module in ((kind, target), (f"{kind}-draft", draft)):
        path = out / name
        path.mkdir(parents=True, exist_ok=True)
        module.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return (f"{kind}: target {target_steps} steps (loss {_loss(target_loss)}), draft {distill_steps} steps "
            f"(loss {_loss(draft_loss)}), {time.process_time() - began:.1f} s CPU -> {out / kind}")


def build_models(out: Path, seed: int = 0, target_steps: int | None = None,
                 distill_steps: int | None = None, log=print, jobs: int = 2) -> dict[str, Path]:
    """Train and save both targets and their drafts under out (one process per target when jobs > 1)."""
    out = Path(out)
    args = [(out, kind, seed, target_steps, distill_steps) for kind in TARGETS]
    # Untrained models build faster than a process starts.
    if jobs > 1 and (target_steps is None or target_steps or distill_steps is None or distill_steps):
        # spawn, not fork: a forked torch can hang in its thread pools.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(jobs, len(args)), mp_context=context) as pool:
            lines = list(pool.map(build_pair, *zip(*args)))
    else:
        lines = [build_pair(*a) for a in args]
    for line in lines:
        log(line)
    (out / "recipe.json").write_text(json.dumps(recipe(seed, target_steps, distill_steps), indent=2) + "\n")
    return {name: out / name for kind in TARGETS for name in (kind, f"{kind}-draft")}


def ensure_models(out: Path, seed: int = 0, target_steps: int | None = None,
                  distill_steps: int | None = None, log=print, jobs: int = 2) -> dict[str, Path]:
    """build_models, unless out already holds a build of the same recipe (the code, corpus and settings)."""
    out = Path(out)
    stamp = out / "recipe.json"
    want = recipe(seed, target_steps, distill_steps)
    names = [*TARGETS, *(f"{kind}-draft" for kind in TARGETS)]
    if stamp.is_file() and json.loads(stamp.read_text()) == want and \
            all((out / name / "config.json").is_file() for name in names):
        return {name: out / name for name in names}
    if stamp.exists():
        stamp.unlink()  # a half-rebuilt directory must never pass for the old build
    return build_models(out, seed, target_steps, distill_steps, log, jobs)


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=None,
                        help=f"training steps of every target (default: {DEFAULT_TARGET_STEPS})")
    parser.add_argument("--distill-steps", type=int, default=None,
                        help=f"distillation steps of every draft (default: {DEFAULT_DISTILL_STEPS})")
    parser.add_argument("--jobs", type=int, default=2, help="targets built at once, one process each")
    parser.add_argument("--force", action="store_true", help="rebuild even when --out holds the same recipe")
    args = parser.parse_args()
    build = build_models if args.force else ensure_models
    paths = build(args.out, args.seed, args.target_steps, args.distill_steps, jobs=args.jobs)
    print("models: " + ", ".join(str(path) for path in paths.values()))


if __name__ == "__main__":
    main()
