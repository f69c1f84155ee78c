"""Summarize a `vllm bench serve --save-result` JSON into the same MethodSummary shape as a DDTree run."""

from __future__ import annotations

from typing import Any

from ddops.bench.summary import MethodSummary, ResultFileError, finite_number, output_digest

# vLLM does not save the dataset name or the sampling temperature in its result; pass them with
# `--metadata dataset=gsm8k temperature=0 method=mtp` (metadata keys land at the top level of the JSON),
# or as hints from the bench plan's run parameters.
SPEC_KEY = "spec_decode_acceptance_length"


def summarize_vllm(data: dict[str, Any], source: str, *, method: str | None = None, dataset: str | None = None,
                   temperature: float | str | None = None, model: str | None = None) -> list[MethodSummary]:
    """One MethodSummary for one vLLM result; keyword hints win over what the file says."""
    if not isinstance(data, dict):
        raise ResultFileError(f"{source}: not a vLLM result: holds {type(data).__name__}, not a JSON object")
    if "completed" not in data or not any(k in data for k in ("mean_tpot_ms", "output_throughput")):
        raise ResultFileError(f"{source}: not a `vllm bench serve` result (no completed / mean_tpot_ms)")
    completed = _int(source, data, "completed")
    tpot_ms = _num(source, data, "mean_tpot_ms")
    ttft_ms = _num(source, data, "mean_ttft_ms")
    tau = _num(source, data, SPEC_KEY)
    spec = tau is not None or any(str(k).startswith("spec_decode_") for k in data)

    name = method or _str(data.get("method"))
    if not name:
        name = "baseline" if not spec else (_str(data.get("label")) or "spec")
    is_baseline = name == "baseline"

    digests: tuple[str, ...] = ()
    texts = data.get("generated_texts")  # only with --save-detailed
    if isinstance(texts, list) and all(isinstance(t, str) for t in texts):
        digests = tuple(output_digest(t) for t in texts)

    times, lengths = _per_prompt(source, data)
    temp = temperature if temperature is not None else data.get("temperature")
    return [MethodSummary(
        method=name, source=source, engine="vllm", n_responses=completed,
        output_tokens=_int(source, data, "total_output_tokens"),
        mean_tpot_s=tpot_ms / 1000 if tpot_ms is not None else None,
        tokens_per_s=1000 / tpot_ms if tpot_ms else None,
        mean_ttft_s=ttft_ms / 1000 if ttft_ms is not None else None,
        acceptance_length=None if is_baseline else tau,
        speedup=1.0 if is_baseline else None,
        fidelity=1.0 if is_baseline else None,
        dataset=dataset or _str(data.get("dataset")) or _str(data.get("dataset_name")),
        temperature=_temperature(source, temp),
        model=model or _str(data.get("model_id")),
        output_throughput=_num(source, data, "output_throughput"),
        failed=_int(source, data, "failed"),
        output_digests=digests,
        prompt_times=times,
        prompt_lengths=lengths,
    )]


# What `--save-detailed` keeps, one item per request in prompt order: input_lens, output_lens, ttfts (s), itls (s,
# one list per request), errors (empty where it succeeded), and in newer clients latencies (s, end to end).
def _per_prompt(source: str, data: dict) -> tuple[tuple[float | None, ...], tuple[int | None, ...]]:
    """Per request: seconds per output token after the first (as vLLM's own TPOT), and input tokens."""
    ttfts = data.get("ttfts")
    if not isinstance(ttfts, list):
        return (), ()
    n = len(ttfts)
    inputs = _list(source, data, "input_lens", n, _is_count)
    outputs = _list(source, data, "output_lens", n, _is_count)
    itls = _list(source, data, "itls", n, lambda x: isinstance(x, list) and all(_is_seconds(t) for t in x))
    latencies = _list(source, data, "latencies", n, _is_seconds)
    errors = _list(source, data, "errors", n, lambda x: x is None or isinstance(x, str))
    if not all(_is_seconds(t) for t in ttfts):
        raise ResultFileError(f"{source}: ttfts: not a list of non-negative seconds")
    times: list[float | None] = []
    for i in range(n):
        decode = latencies[i] - ttfts[i] if latencies else sum(itls[i]) if itls else None
        failed = bool(errors and errors[i])
        tokens = outputs[i] if outputs else 0
        times.append(decode / (tokens - 1) if decode is not None and decode > 0 and tokens > 1 and not failed else None)
    return tuple(times), tuple(inputs) if inputs else (None,) * n


def _list(source: str, data: dict, key: str, n: int, valid) -> list:
    """The per-request list at key (empty when absent); ResultFileError when it is not one valid item per request."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) != n or not all(valid(x) for x in value):
        raise ResultFileError(f"{source}: {key}: not one valid item per request ({n} requests)")
    return value


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _is_seconds(x: Any) -> bool:
    return finite_number(x) and x >= 0


def _num(source: str, data: dict, key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if not finite_number(value) or value < 0:
        raise ResultFileError(f"{source}: {key}: not a non-negative number")
    return float(value)


def _int(source: str, data: dict, key: str) -> int:
    value = data.get(key, 0)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ResultFileError(f"{source}: {key}: not a count")
    return value


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _temperature(source: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ResultFileError(f"{source}: temperature: {value!r} is not a number") from None
    if not finite_number(t) or t < 0:
        raise ResultFileError(f"{source}: temperature: {value!r} is not a non-negative number")
    return t
