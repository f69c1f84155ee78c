"""Result files from remote hosts are untrusted: read them without running code, into MethodSummary values."""

from __future__ import annotations

import argparse
import io
import json
import re
import threading
import types
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddops.bench.summarize_ddtree import summarize_ddtree
from ddops.bench.summarize_metrics import csv_records, metric_format, records_of, summarize_metrics
from ddops.bench.summarize_vllm import summarize_vllm
from ddops.bench.summary import MethodSummary, ResultFileError

MAX_RESULT_BYTES = 2 * 1024**3
# torch.save stores its archive entries uncompressed: a genuine result never inflates to more than its own size.
# A little slack for a fork that re-zips with deflate; more than that is a decompression bomb.
MAX_INFLATION = 4
MIN_TORCH = (2, 6)  # weights_only loading had code-execution holes before 2.6 (CVE-2025-32434)
_LOAD_LOCK = threading.Lock()  # safe_globals() edits a process-wide allowlist
_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)


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
    try:
        import torch
    except ImportError:
        raise ResultFileError(f"{path}: reading .pt files needs torch (pip install 'ddops[bench]')") from None
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit())
    if version < MIN_TORCH:
        raise ResultFileError(f"{path}: refused: torch {torch.__version__} cannot load untrusted files safely "
                              f"(needs >= {'.'.join(map(str, MIN_TORCH))})")
    data = read_limited(path, max_bytes)
    check_archive(data, path, max_bytes)
    # The DDTree layout: dicts, lists, tensors, floats, and SimpleNamespace per method (argparse.Namespace for
    # forks that save `args` unconverted). Nothing else is allowed to be rebuilt.
    try:
        with _LOAD_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(list(_NAMESPACES)):
                obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - anything the unpickler raises means "not a safe result file"
        raise ResultFileError(f"{path}: refused: {_load_reason(exc)}") from None
    if not isinstance(obj, dict):
        raise ResultFileError(f"{path}: not a DDTree result: holds {type(obj).__name__}, not a dict")
    check_reach(obj, len(data), path, torch)
    return obj


def check_archive(data: bytes, path: str | Path, max_bytes: int = MAX_RESULT_BYTES) -> None:
    """ResultFileError when a torch.save zip archive's directory declares more inflated bytes than the budget.

    Read from the central directory alone, before anything is inflated: torch's reader allocates what each entry
    declares, so a 1 MB file of deflated zeros would otherwise cost a 1 GiB buffer before any other check ran."""
    if not data.startswith(b"PK"):
        return  # the legacy (pre-1.6) torch.save format is a bare pickle: nothing in it inflates
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise ResultFileError(f"{path}: refused: not a readable torch.save archive ({exc})") from None
    budget = min(max_bytes, MAX_INFLATION * len(data))
    declared = sum(e.file_size for e in entries)
    if declared > budget:
        biggest = max(entries, key=lambda e: e.file_size)
        raise ResultFileError(f"{path}: refused: its archive declares {_size(declared)} inflated "
                              f"(entry {biggest.filename!r}: {_size(biggest.file_size)}) out of {_size(len(data))}, "
                              f"over the {_size(budget)} it may take")


def check_reach(obj: Any, budget: int, path: str | Path, torch: Any) -> None:
    """ResultFileError unless reading `obj` costs work in proportion to the `budget` bytes it came from.

    A tensor may claim more elements than its storage holds (a stride-0 or overlapping view: 1e8 elements over one
    stored number), and pickle memo references let one list appear a thousand times in a list that appears a
    thousand times. Every item a genuine file reaches costs it at least one opcode byte, and every tensor element
    at least one storage byte, so a file that reaches more items than it has bytes is multiplying work, not data."""
    reached = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        reached += 1
        if isinstance(item, torch.Tensor):
            reached += _tensor_elements(item, path)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, _NAMESPACES):
            stack.extend(vars(item).values())
        if reached + len(stack) > budget:
            raise ResultFileError(f"{path}: refused: it reaches more items and tensor elements than its {budget} "
                                  "bytes hold (objects shared over and over to multiply the work)")


def _tensor_elements(tensor: Any, path: str | Path) -> int:
    """The tensor's element count, refused when it is more than its storage actually holds."""
    try:
        stored = tensor.untyped_storage().nbytes() // max(1, tensor.element_size())
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested or other storage-less layouts
        raise ResultFileError(f"{path}: refused: a {tensor.layout} tensor is not a result tensor") from None
    count = tensor.numel()
    if count > stored:
        raise ResultFileError(f"{path}: refused: a tensor of shape {tuple(tensor.shape)} claims {count} elements "
                              f"over a storage of {stored} (a stride-0 or overlapping view)")
    return count


def load_result_json(path: str | Path, *, max_bytes: int = 256 * 1024**2) -> list[dict[str, Any]]:
    """A vLLM result file: one JSON object, or one per line (`--append-result`)."""
    raw = read_limited(path, max_bytes)
    try:
        docs = _json_docs(path, raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ResultFileError(f"{path}: not valid UTF-8") from None
    except RecursionError:
        raise ResultFileError(f"{path}: refused: {_TOO_DEEP}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ResultFileError(f"{path}: entry {i + 1} is {type(doc).__name__}, not a JSON object")
    if not docs:
        raise ResultFileError(f"{path}: empty")
    return docs


def _json_docs(path: str | Path, text: str) -> list[Any]:
    """One JSON document, or one per line (JSON lines); NaN and Infinity read as no value."""
    try:
        return [json.loads(text, parse_constant=_no_constant)]
    except ValueError:
        try:
            return [json.loads(line, parse_constant=_no_constant) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise ResultFileError(f"{path}: not JSON: {exc}") from None


def summarize_metrics_file(path: str | Path, metrics: Mapping[str, str], *,
                           max_bytes: int = 256 * 1024**2) -> list[MethodSummary]:
    """A team's own JSON or CSV metrics file, read by the key paths of the plan's `metrics:`."""
    raw = read_limited(path, max_bytes)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ResultFileError(f"{path}: not valid UTF-8") from None
    if metric_format(metrics, str(path)) == "csv":
        return summarize_metrics(csv_records(text, str(path)), str(path), metrics, flat=True)
    return summarize_metrics(records_of(_json_docs(path, text), metrics, str(path)), str(path), metrics)


def summarize_file(path: str | Path, summarizer: str, *, max_bytes: int = MAX_RESULT_BYTES,
                   metrics: Mapping[str, str] | None = None, **hints: Any) -> list[MethodSummary]:
    """Read one result file safely and summarize it; hints (dataset, temperature, method) go to vLLM's.

    Whatever a hostile file makes the reader run out of (memory, stack) is that file's ResultFileError, so the
    report goes on with the other files."""
    if summarizer not in ("ddtree", "vllm", "metrics"):
        raise ValueError(f"unknown summarizer {summarizer!r}")
    try:
        if summarizer == "metrics":
            if not metrics:
                raise ResultFileError(f"{path}: the run's plan names no `metrics:` key paths to read it by")
            return summarize_metrics_file(path, metrics, max_bytes=min(max_bytes, 256 * 1024**2))
        if summarizer == "ddtree":
            return summarize_ddtree(load_result_pt(path, max_bytes=max_bytes), str(path))
        out: list[MethodSummary] = []
        for doc in load_result_json(path, max_bytes=min(max_bytes, 256 * 1024**2)):
            out.extend(summarize_vllm(doc, str(path), **hints))
        return out
    except MemoryError:
        raise ResultFileError(f"{path}: refused: reading it ran out of memory") from None
    except ArithmeticError:  # e.g. means of 1e308 overflow: a number no real run measured
        raise ResultFileError(f"{path}: refused: its numbers are too large to average") from None
    except RecursionError:
        raise ResultFileError(f"{path}: refused: {_TOO_DEEP}") from None


_TOO_DEEP = "nested too deeply to read"
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
