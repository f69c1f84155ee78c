"""Helpers shared by the draft model, the generators and the benchmark."""

import json
import random
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Spread one target layer per draft layer over the target's depth (skipping the first and last layers)."""
    if num_draft_layers == 1 or num_target_layers <= 2:
        return [num_target_layers // 2]
    first, last = 1, max(num_target_layers - 2, 1)
    step = (last - first) / (num_draft_layers - 1)
    return [min(int(round(first + i * step)), num_target_layers - 1) for i in range(num_draft_layers)]


def extract_context_feature(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the outputs of the chosen target layers (hidden_states[0] is the embedding output)."""
    return torch.cat([hidden_states[layer_id + 1] for layer_id in layer_ids], dim=-1)


def sample(logits: torch.Tensor, temperature: float = 0.0) -> torch.Tensor:
    """Greedy below a tiny temperature, otherwise multinomial sampling; returns [batch, seq] token ids."""
    if temperature < 1e-5:
        return logits.argmax(dim=-1)
    batch, seq_len, vocab = logits.shape
    probs = torch.softmax(logits.reshape(-1, vocab).float() / temperature, dim=-1)
    return torch.multinomial(probs, num_samples=1).reshape(batch, seq_len)


def load_and_process_dataset(data_name: str) -> list[dict]:
    """Load a local JSONL of {"turns": [...]} rows: a path, or a name under data/ (mini -> data/mini.jsonl)."""
    candidate = Path(data_name)
    if candidate.suffix != ".jsonl" or not candidate.exists():
        candidate = DATA_DIR / f"{data_name}.jsonl"
    if not candidate.exists():
        known = sorted(path.stem for path in DATA_DIR.glob("*.jsonl"))
        raise FileNotFoundError(f"unknown dataset {data_name!r}: no {candidate} (local datasets: {known})")
    rows = []
    for line in candidate.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            turns = row["turns"]
            rows.append({"turns": [turns] if isinstance(turns, str) else list(turns)})
    return rows


def select_samples(dataset: list[dict], max_samples: int | None, seed: int = 0) -> list[dict]:
    """Deterministic shuffle-and-take, like datasets' shuffle(seed=0).select(range(n))."""
    if max_samples is None or len(dataset) <= max_samples:
        return dataset
    order = list(range(len(dataset)))
    random.Random(seed).shuffle(order)
    return [dataset[i] for i in order[:max_samples]]
