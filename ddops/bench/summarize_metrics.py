"""Summarize a team's own metrics file (JSON or CSV) into MethodSummary values, by the key paths a plan names; pure.

The plan says where things are (`metrics:` in a bench plan, playbooks/BENCH.md): `tokens_per_s` and/or `tpot_s`
(seconds per output token), `ttft_s`, `output` (the generated text, compared with the baseline's), `method` (which
method a record measured; the one named `baseline` is the reference), `records` (where the list of records sits in
a JSON document), and `dataset`, `temperature`, `model`. A key path is dotted (`stats.0.tok_s`); in a CSV file it is
a column name."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from ddops.bench.summary import MethodSummary, ResultFileError, finite_number, output_digest

ENGINE = "metrics"
_MISSING = object()


def metric_format(config: Mapping[str, str], path: str) -> str:
    """`json` or `csv`: the plan's `format`, else the file's extension."""
    return config.get("format") or ("csv" if str(path).lower().endswith(".csv") else "json")


def csv_records(text: str, source: str) -> list[dict[str, Any]]:
    """The rows of a CSV file with a header line, as dicts of strings."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ResultFileError(f"{source}: no rows under the CSV header")
    return rows


def records_of(docs: Sequence[Any], config: Mapping[str, str], source: str) -> list[Any]:
    """The records of the parsed JSON documents: each document, each item of a top-level list, or the list at
    `records` in each document."""
    out: list[Any] = []
    for i, doc in enumerate(docs):
        if "records" in config:
            found = lookup(doc, config["records"])
            if not isinstance(found, list):
                raise ResultFileError(
                    f"{source}: document {i + 1} has no list at {config['records']!r} (metrics.records)")
            out.extend(found)
        elif isinstance(doc, list):
            out.extend(doc)
        else:
            out.append(doc)
    if not out:
        raise ResultFileError(f"{source}: no records")
    return out


def lookup(record: Any, path: str, *, flat: bool = False) -> Any:
    """The value at a dotted key path (list items by index), or _MISSING; flat: the path is one key (CSV)."""
    if flat:
        return record.get(path, _MISSING) if isinstance(record, dict) else _MISSING
    value = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def summarize_metrics(records: Sequence[Any], source: str, config: Mapping[str, str], *,
                      flat: bool = False) -> list[MethodSummary]:
    """One MethodSummary per method in the records (record order kept within each)."""
    by_method: dict[str, list[tuple[int, Any]]] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise ResultFileError(f"{source}: record {i + 1} is {type(record).__name__}, not an object")
        method = _text(lookup(record, config["method"], flat=flat)) if "method" in config else "run"
        if method is None:
            raise ResultFileError(f"{source}: record {i + 1} has no {config['method']!r} (metrics.method)")
        by_method.setdefault(method, []).append((i, record))

    def numbers(items: list[tuple[int, Any]], key: str) -> list[float]:
        return [v for v in (_number(source, i, r, config, key, flat) for i, r in items) if v is not None]

    out = []
    for method, items in by_method.items():
        speeds, tpots, ttfts = numbers(items, "tokens_per_s"), numbers(items, "tpot_s"), numbers(items, "ttft_s")
        tpot = fmean(tpots) if tpots else None
        speed = fmean(speeds) if speeds else None
        if tpot is None and speed:
            tpot = 1.0 / speed
        if speed is None and tpot:
            speed = 1.0 / tpot
        if tpot is None and speed is None:
            raise ResultFileError(
                f"{source}: {method}: no record has {config.get('tokens_per_s') or config.get('tpot_s')!r}")
        texts = [lookup(r, config["output"], flat=flat) for _, r in items] if "output" in config else []
        digests = tuple(output_digest(t) for t in texts if isinstance(t, str))
        first = items[0][1]
        temperature = _number(source, items[0][0], first, config, "temperature", flat)
        out.append(MethodSummary(
            method=method, source=source, engine=ENGINE, n_responses=len(items),
            mean_tpot_s=tpot, tokens_per_s=speed, mean_ttft_s=fmean(ttfts) if ttfts else None,
            dataset=_text(lookup(first, config["dataset"], flat=flat)) if "dataset" in config else None,
            temperature=temperature,
            model=_text(lookup(first, config["model"], flat=flat)) if "model" in config else None,
            output_digests=digests if len(digests) == len(items) else (),
        ))
    return out


def _number(source: str, index: int, record: Any, config: Mapping[str, str], key: str, flat: bool) -> float | None:
    if key not in config:
        return None
    raw = lookup(record, config[key], flat=flat)
    if raw is _MISSING or raw is None or raw == "":
        return None
    if isinstance(raw, str):
        try:
            raw = float(raw)
        except ValueError:
            raw = None
    if not finite_number(raw) or raw < 0 or raw > 1e12:
        raise ResultFileError(f"{source}: record {index + 1}: {config[key]} (metrics.{key}) is not a plausible "
                              "non-negative number")
    return float(raw)


def _text(value: Any) -> str | None:
    if value is _MISSING or value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
