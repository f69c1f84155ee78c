"""Summarize one DDTree `benchmark.py` result (the dict torch.save wrote) per method; pure, no torch import."""

from __future__ import annotations

import re
from collections.abc import Iterable
from statistics import fmean
from typing import Any, Literal, overload

from ddops.bench.summary import (Divergence, MethodSummary, ResultFileError, add_verify_paths, finite_number,
                                 output_digest)

BASELINE = "baseline"
_TREE = re.compile(r"ddtree_tb(\d+)\Z")


def method_order(method: str) -> tuple[int, int, str]:
    """baseline, dflash, ddtree_tb16 < ddtree_tb32 ..., then anything else by name."""
    if method == BASELINE:
        return (0, 0, "")
    if method == "dflash":
        return (1, 0, "")
    m = _TREE.match(method)
    return (2, int(m.group(1)), "") if m else (3, 0, method)


def tree_budget(method: str) -> int | None:
    m = _TREE.match(method)
    return int(m.group(1)) if m else None


def summarize_ddtree(data: dict[str, Any], source: str) -> list[MethodSummary]:
    """One MethodSummary per method in the file, in method_order; ResultFileError when the layout is wrong."""
    if not isinstance(data, dict):
        raise ResultFileError(f"{source}: not a DDTree result: holds {type(data).__name__}, not a dict")
    responses = data.get("responses")
    if not isinstance(responses, list):
        raise ResultFileError(f"{source}: not a DDTree result: no `responses` list")
    args = _args(data.get("args"))
    dataset = args.get("dataset")
    temperature: Any = args.get("temperature")
    model = args.get("model_name_or_path")
    attn = data.get("target_attn_implementation")

    per_method: dict[str, list[tuple[int, Any]]] = {}
    for i, response in enumerate(responses):
        if not isinstance(response, dict):
            raise ResultFileError(f"{source}: responses[{i}] is {type(response).__name__}, not a dict of methods")
        for method, value in response.items():
            if not isinstance(method, str):
                raise ResultFileError(f"{source}: responses[{i}]: method names must be strings")
            per_method.setdefault(method, []).append((i, value))

    baseline_tpot: float | None = None
    baseline_outputs: dict[int, list[int]] = {}
    prompt_lengths: dict[int, int] = {}
    for method, items in per_method.items():  # a prompt's length is the same whichever method ran it
        for i, v in items:
            prompt = _number(source, i, method, v, "num_input_tokens", optional=True)
            if prompt is not None:
                prompt_lengths.setdefault(i, int(prompt))
    if BASELINE in per_method:
        baseline_tpot = fmean(_number(source, i, BASELINE, v, "time_per_output_token") for i, v in per_method[BASELINE])
        for i, v in per_method[BASELINE]:
            tokens = _tokens(source, i, BASELINE, v)
            if tokens is not None:
                baseline_outputs[i] = tokens

    out: list[MethodSummary] = []
    for method in sorted(per_method, key=method_order):
        items = per_method[method]
        tpots = [_number(source, i, method, v, "time_per_output_token") for i, v in items]
        ttfts = [_number(source, i, method, v, "time_to_first_token", optional=True) for i, v in items]
        counts = [_number(source, i, method, v, "num_output_tokens", optional=True) for i, v in items]
        mean_tpot = fmean(tpots) if tpots else None
        ttft = [t for t in ttfts if t is not None]
        tokens_list = [_tokens(source, i, method, v) for i, v in items]
        digests = tuple(output_digest(t) for t in tokens_list if t is not None)

        tau = None
        if method != BASELINE:
            per_response = [fmean(a) for a in (_acceptance(source, i, method, v) for i, v in items) if a]
            tau = fmean(per_response) if per_response else None

        times: dict[int, float] = {i: t for (i, _), t in zip(items, tpots)}
        paths: dict[str, int] = {}
        for i, v in items:
            raw = _field(source, i, method, v, "verify_paths")
            if raw is not _MISSING and raw is not None:
                add_verify_paths(paths, {k: _scalar(n) for k, n in raw.items()} if isinstance(raw, dict) else raw,
                                 f"{source}: responses[{i}].{method}")

        speedup = baseline_tpot / mean_tpot if baseline_tpot is not None and mean_tpot else None

        fidelity, divergence = None, None
        compared = [(i, t, baseline_outputs[i]) for (i, _), t in zip(items, tokens_list)
                    if t is not None and i in baseline_outputs]
        if compared and len(compared) == len(items):
            fidelity = sum(1 for _, t, b in compared if t == b) / len(compared)
            differing = [(i, t, b) for i, t, b in compared if t != b]
            if differing:
                divergence = first_divergence(*differing[0], prompt_lengths.get(differing[0][0], 0))

        out.append(MethodSummary(
            method=method, source=source, engine="ddtree", n_responses=len(items),
            output_tokens=int(sum(c for c in counts if c is not None)),
            mean_tpot_s=mean_tpot, tokens_per_s=(1.0 / mean_tpot) if mean_tpot else None,
            mean_ttft_s=fmean(ttft) if ttft else None, acceptance_length=tau, speedup=speedup,
            fidelity=fidelity, tree_budget=tree_budget(method),
            dataset=str(dataset) if dataset is not None else None,
            temperature=float(temperature) if finite_number(temperature) else None,
            model=str(model) if model is not None else None,
            attn=str(attn) if attn is not None else None,
            output_digests=digests if len(digests) == len(items) else (),
            first_difference=divergence,
            prompt_times=tuple(times.get(i) for i in range(len(responses))),
            prompt_lengths=tuple(prompt_lengths.get(i) for i in range(len(responses))),
            verify_paths=tuple(sorted(paths.items())),
        ))
    return out


def first_divergence(response: int, tokens: list[int], baseline: list[int], prompt_length: int) -> Divergence:
    """The first position where two outputs (prompt included) differ, counted from the first generated token."""
    common = min(len(tokens), len(baseline))
    at = next((k for k in range(common) if tokens[k] != baseline[k]), common)
    return Divergence(response=response, position=max(at - prompt_length, 0),
                      baseline_token=baseline[at] if at < len(baseline) else None,
                      method_token=tokens[at] if at < len(tokens) else None)


def _args(args: Any) -> dict[str, Any]:
    """benchmark.py saves `vars(args)`; a fork may save the Namespace itself."""
    if isinstance(args, dict):
        return args
    if args is not None and hasattr(args, "__dict__"):
        return dict(vars(args))
    return {}


def _field(source: str, i: int, method: str, value: Any, name: str) -> Any:
    return value.get(name, _MISSING) if isinstance(value, dict) else getattr(value, name, _MISSING)


_MISSING = object()


@overload
def _number(source: str, i: int, method: str, value: Any, name: str, optional: Literal[False] = False) -> float: ...
@overload
def _number(source: str, i: int, method: str, value: Any, name: str, optional: bool) -> float | None: ...
def _number(source: str, i: int, method: str, value: Any, name: str, optional: bool = False) -> float | None:
    raw = _field(source, i, method, value, name)
    if raw is _MISSING or raw is None:
        if optional:
            return None
        raise ResultFileError(f"{source}: responses[{i}].{method}: no {name}")
    raw = _scalar(raw)
    if not finite_number(raw) or raw < 0:
        raise ResultFileError(f"{source}: responses[{i}].{method}.{name}: not a non-negative finite number")
    return float(raw)


def _acceptance(source: str, i: int, method: str, value: Any) -> list[float]:
    raw = _field(source, i, method, value, "acceptance_lengths")
    if raw is _MISSING or raw is None:
        return []
    seq = _tolist(raw)
    if not isinstance(seq, list) or not all(finite_number(x) for x in seq):
        raise ResultFileError(f"{source}: responses[{i}].{method}.acceptance_lengths: not a list of numbers")
    return [float(x) for x in seq]


def _tokens(source: str, i: int, method: str, value: Any) -> list[int] | None:
    raw = _field(source, i, method, value, "output_ids")
    if raw is _MISSING or raw is None:
        return None
    flat = list(_flatten(_tolist(raw)))
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in flat):
        raise ResultFileError(f"{source}: responses[{i}].{method}.output_ids: not token ids")
    return flat


def _tolist(raw: Any) -> Any:
    """Tensors (and numpy arrays) to nested lists without importing torch; lists and tuples as lists."""
    tolist = getattr(raw, "tolist", None)
    if callable(tolist) and not isinstance(raw, (list, tuple)):
        raw = tolist()
    if isinstance(raw, tuple):
        raw = list(raw)
    return raw


def _scalar(raw: Any) -> Any:
    """A 0-d tensor or numpy scalar as a Python number."""
    item = getattr(raw, "item", None)
    if callable(item) and not isinstance(raw, (int, float)):
        try:
            return item()
        except (ValueError, RuntimeError):
            return raw
    return raw


def _flatten(seq: Any) -> Iterable[Any]:
    if isinstance(seq, (list, tuple)):
        for x in seq:
            yield from _flatten(x)
    else:
        yield seq
