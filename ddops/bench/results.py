"""Result files from remote hosts are untrusted: read them without running code, into MethodSummary values."""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddops.errors import DdopsError

MAX_RESULT_BYTES = 2 * 1024**3
MIN_TORCH = (2, 6)  # weights_only loading had code-execution holes before 2.6 (CVE-2025-32434)
_LOAD_LOCK = threading.Lock()  # safe_globals() edits a process-wide allowlist


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

    @property
    def label(self) -> str:
        """`ddtree_tb64`, or `vllm:mtp` for a vLLM run (so both can share a table)."""
        return self.method if self.engine == "ddtree" else f"{self.engine}:{self.method}"


def output_digest(tokens_or_text: Any) -> str:
    """A short stable digest of one response's output (token list or text)."""
    if isinstance(tokens_or_text, str):
        data = tokens_or_text.encode("utf-8", "surrogatepass")
    else:
        data = ",".join(str(int(t)) for t in tokens_or_text).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def read_limited(path: str | Path, max_bytes: int = MAX_RESULT_BYTES) -> bytes:
    """The bytes of a regular file no bigger than max_bytes, else ResultFileError."""
    p = Path(path)
    try:
        if not p.is_file():
            raise ResultFileError(f"{p}: refused: not a regular file")
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ResultFileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ResultFileError(f"{p}: refused: larger than the {_size(max_bytes)} limit")
    return data


def load_result_pt(path: str | Path, *, max_bytes: int = MAX_RESULT_BYTES) -> dict[str, Any]:
    """torch.load an untrusted `.pt` with weights_only and a small allowlist; never unpickles arbitrary code."""
    import argparse
    import types

    try:
        import torch
    except ImportError:
        raise ResultFileError(f"{path}: reading .pt files needs torch (pip install 'ddops[bench]')") from None
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit())
    if version < MIN_TORCH:
        raise ResultFileError(f"{path}: refused: torch {torch.__version__} cannot load untrusted files safely "
                              f"(needs >= {'.'.join(map(str, MIN_TORCH))})")
    data = read_limited(path, max_bytes)
    # The DDTree layout: dicts, lists, tensors, floats, and SimpleNamespace per method (argparse.Namespace for
    # forks that save `args` unconverted). Nothing else is allowed to be rebuilt.
    allowed = [types.SimpleNamespace, argparse.Namespace]
    try:
        with _LOAD_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(allowed):
                obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - anything the unpickler raises means "not a safe result file"
        raise ResultFileError(f"{path}: refused: {_load_reason(exc)}") from None
    if not isinstance(obj, dict):
        raise ResultFileError(f"{path}: not a DDTree result: holds {type(obj).__name__}, not a dict")
    return obj


def load_result_json(path: str | Path, *, max_bytes: int = 256 * 1024**2) -> list[dict[str, Any]]:
    """A vLLM result file: one JSON object, or one per line (`--append-result`)."""
    raw = read_limited(path, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ResultFileError(f"{path}: not valid UTF-8") from None
    docs: list[Any] = []
    try:
        docs = [json.loads(text, parse_constant=_no_constant)]
    except ValueError:
        try:
            docs = [json.loads(line, parse_constant=_no_constant) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise ResultFileError(f"{path}: not JSON: {exc}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ResultFileError(f"{path}: entry {i + 1} is {type(doc).__name__}, not a JSON object")
    if not docs:
        raise ResultFileError(f"{path}: empty")
    return docs


def summarize_file(path: str | Path, summarizer: str, *, max_bytes: int = MAX_RESULT_BYTES,
                   **hints: Any) -> list[MethodSummary]:
    """Read one result file safely and summarize it; hints (dataset, temperature, method) go to vLLM's."""
    if summarizer == "ddtree":
        from ddops.bench.summarize_ddtree import summarize_ddtree

        return summarize_ddtree(load_result_pt(path, max_bytes=max_bytes), str(path))
    if summarizer == "vllm":
        from ddops.bench.summarize_vllm import summarize_vllm

        out: list[MethodSummary] = []
        for doc in load_result_json(path, max_bytes=min(max_bytes, 256 * 1024**2)):
            out.extend(summarize_vllm(doc, str(path), **hints))
        return out
    raise ValueError(f"unknown summarizer {summarizer!r}")


_GLOBAL = re.compile(r"(?:unsupported global: GLOBAL|load unsupported GLOBAL) ([\w.]+)", re.IGNORECASE)
_OPCODE = re.compile(r"Unsupported operand (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _load_reason(exc: BaseException) -> str:
    """One informative line out of torch's long weights_only message."""
    text = _ANSI.sub("", str(exc))
    m = _GLOBAL.search(text)
    if m:
        return f"it would import {m.group(1)}, which is not on the allowlist of result types"
    m = _OPCODE.search(text)
    if m:
        return f"pickle opcode {m.group(1)} is not allowed in a result file"
    boiler = ("weights only load failed", "(1)", "(2)", "in pytorch 2.6", "re-running", "please file an issue",
              "check the documentation", "do it only if")
    for line in text.splitlines():
        line = line.strip().removeprefix("WeightsUnpickler error:").strip()
        if line and not line.lower().startswith(boiler):
            return line[:300]
    return f"{type(exc).__name__}: not a loadable torch.save file"


def _no_constant(name: str) -> None:
    """Python's json writes NaN/Infinity for empty statistics; read them as "no value"."""
    return None


def _size(n: int) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:g} GiB"
    if n >= 1024**2:
        return f"{n / 1024**2:g} MiB"
    return f"{n} bytes"


def finite_number(value: Any) -> bool:
    """A real, finite number (bools are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
