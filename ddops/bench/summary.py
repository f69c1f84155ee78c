"""What a result file says, as values: one MethodSummary per method, and the checks every summarizer shares.

The summarizers (summarize_ddtree.py, summarize_vllm.py) build these; results.py reads the files and calls them."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from ddops.errors import DdopsError


class ResultFileError(DdopsError):
    """A result file was refused (unsafe, too big) or does not hold what its summarizer expects."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where one response first differs from the baseline's: the example a NOT LOSSLESS flag points at."""

    response: int  # index in the result file's responses
    position: int  # generated-token index (0 = the first token after the prompt)
    baseline_token: int | None  # None where that output had already ended
    method_token: int | None


@dataclass(frozen=True, slots=True)
class MethodSummary:
    """One method's numbers from one result file; times in seconds, None where the file cannot say."""

    method: str  # baseline, dflash, ddtree_tb64; for vLLM the served method (baseline, mtp, ...)
    source: str
    engine: str = "ddtree"  # ddtree: the reference HF code; vllm: a `vllm bench serve` result
    n_responses: int = 0
    output_tokens: int = 0
    mean_tpot_s: float | None = None
    tokens_per_s: float | None = None  # 1 / mean_tpot_s: one stream's decode speed
    mean_ttft_s: float | None = None
    acceptance_length: float | None = None  # tau; None for baseline
    speedup: float | None = None  # mean baseline tpot / mean tpot, same file; None without a baseline there
    fidelity: float | None = None  # share of responses whose output equals the baseline's, same file
    tree_budget: int | None = None
    dataset: str | None = None
    temperature: float | None = None
    model: str | None = None
    attn: str | None = None  # target attention implementation (sdpa, flash_attention_2)
    output_throughput: float | None = None  # vLLM: output tok/s over all concurrent requests
    failed: int = 0  # vLLM: failed requests
    output_digests: tuple[str, ...] = ()  # per response, in prompt order: lets the report compare runs
    first_difference: Divergence | None = None  # the first response whose output differs from the baseline's
    # Per prompt, in prompt order: seconds per output token (None where that prompt has no time: a failed request)
    # and input tokens (None where the file does not say); what pairs this method with another prompt by prompt.
    prompt_times: tuple[float | None, ...] = ()
    prompt_lengths: tuple[int | None, ...] = ()
    verify_paths: tuple[tuple[str, int], ...] = ()  # (path label, verify rounds) over all responses, sorted

    @property
    def label(self) -> str:
        """`ddtree_tb64`, or `vllm:mtp` for a vLLM run (so both can share a table)."""
        return self.method if self.engine == "ddtree" else f"{self.engine}:{self.method}"


ONE_FORWARD = "one-forward"
REFERENCE = "reference"  # a label `reference: <reason>`: the one-forward route was refused, for that reason


def add_verify_paths(total: dict[str, int], raw: Any, where: str) -> None:
    """Add one response's `verify_paths` ({label: rounds}, TEAM.md's contract) to total; ResultFileError unless it
    holds exactly labels `one-forward` or `reference: <reason>` and round counts."""
    if not isinstance(raw, dict):
        raise ResultFileError(f"{where}.verify_paths: not a dict of verify path -> rounds")
    for label, rounds in raw.items():
        if not isinstance(label, str) or len(label) > 300 or not (
                label == ONE_FORWARD or label.startswith(f"{REFERENCE}: ")):
            raise ResultFileError(f"{where}.verify_paths: {str(label)[:80]!r} is not `{ONE_FORWARD}` or "
                                  f"`{REFERENCE}: <reason>`")
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
            raise ResultFileError(f"{where}.verify_paths[{label[:80]!r}]: not a count of rounds")
        total[label] = total.get(label, 0) + rounds


def output_digest(tokens_or_text: Any) -> str:
    """A short stable digest of one response's output (token list or text)."""
    if isinstance(tokens_or_text, str):
        data = tokens_or_text.encode("utf-8", "surrogatepass")
    else:
        data = ",".join(str(int(t)) for t in tokens_or_text).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def finite_number(value: Any) -> bool:
    """A real, finite number (bools are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
