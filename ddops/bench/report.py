"""The bench report: method summaries from many hosts as rows, with speedups, best budgets and lossy flags, and the
same rows aggregated per host (over repeats) or per method (over hosts and repeats) with their spread; pure."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from statistics import fmean, pstdev
from typing import Any, Iterable, Sequence

from ddops.bench.summary import Divergence, MethodSummary
from ddops.bench.summarize_ddtree import BASELINE, method_order

BEST = "best"
NOT_LOSSLESS = "NOT LOSSLESS"
BY = ("host", "method")  # what `--by` aggregates over: repeats on each host, or every host and repeat


@dataclass(frozen=True, slots=True)
class Labeled:
    """A MethodSummary and where it came from: the host, and the run (plan run id or file name)."""

    host: str
    run: str
    summary: MethodSummary


@dataclass(frozen=True, slots=True)
class ReportRow:
    host: str
    run: str
    model: str | None
    dataset: str | None
    temperature: float | None
    method: str  # MethodSummary.label: ddtree_tb64, dflash, vllm:mtp ...
    engine: str
    n_responses: int
    tokens_per_s: float | None
    mean_tpot_s: float | None
    speedup: float | None  # the fastest same-host, same-engine baseline's mean tpot / this method's
    acceptance_length: float | None
    mean_ttft_s: float | None
    fidelity: float | None  # share of responses equal to the baseline's
    tree_budget: int | None
    best_budget: bool  # the fastest DDTree tree budget for this host, model, dataset and temperature
    lossy: bool  # greedy (temperature 0) and fidelity < 1: the speed is not for the same output
    source: str
    attn: str | None = None  # the target's attention implementation: runs with another one are not repeats
    divergence: Divergence | None = None  # a response that differs from the baseline's, and where

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def flags(self) -> tuple[str, ...]:
        out = []
        if self.best_budget:
            out.append(BEST)
        if self.lossy:
            out.append(NOT_LOSSLESS)
        return tuple(out)

    @property
    def note(self) -> str:
        """Why a row is flagged, in words, with the first differing token of one response as the example."""
        if not self.lossy or self.fidelity is None:
            return ""
        return _lossy_note(self.fidelity, self.speedup, self.divergence)


@dataclass(frozen=True, slots=True)
class Report:
    rows: tuple[ReportRow, ...]

    @property
    def lossy_rows(self) -> tuple[ReportRow, ...]:
        return tuple(r for r in self.rows if r.lossy)

    @property
    def faster_but_lossy(self) -> tuple[ReportRow, ...]:
        """The rows whose speedup is not a lossless speedup: what a reader must not quote."""
        return tuple(r for r in self.rows if r.lossy and r.speedup is not None and r.speedup > 1)


def build_report(items: Iterable[Labeled | tuple[str, str, MethodSummary]]) -> Report:
    """Rows per host x model x dataset x temperature x method (x run), each against its host's baseline."""
    labeled = [x if isinstance(x, Labeled) else Labeled(*x) for x in items]
    groups: dict[tuple, list[Labeled]] = {}
    for item in labeled:
        groups.setdefault(_group_key(item), []).append(item)

    host_rank = _first_seen(x.host for x in labeled)
    rows: list[ReportRow] = []
    for key, members in groups.items():
        baselines = [m for m in members if m.summary.method == BASELINE and m.summary.mean_tpot_s]
        # The fastest baseline: never flatter a method by choosing a slow reference (as the DDTree paper's table).
        reference = min(baselines, key=lambda m: m.summary.mean_tpot_s) if baselines else None
        best = _best_budget(members)
        for m in members:
            s = m.summary
            speedup = None
            if reference is not None and s.mean_tpot_s:
                speedup = reference.summary.mean_tpot_s / s.mean_tpot_s
            fidelity = s.fidelity
            if fidelity is None and s.output_digests:
                fidelity = _digest_fidelity(s, [b.summary for b in baselines])
            lossy = s.temperature == 0 and fidelity is not None and fidelity < 1.0
            rows.append(ReportRow(
                host=m.host, run=m.run, model=s.model, dataset=s.dataset, temperature=s.temperature,
                method=s.label, engine=s.engine, n_responses=s.n_responses, tokens_per_s=s.tokens_per_s,
                mean_tpot_s=s.mean_tpot_s, speedup=speedup, acceptance_length=s.acceptance_length,
                mean_ttft_s=s.mean_ttft_s, fidelity=fidelity, tree_budget=s.tree_budget,
                best_budget=m is best, lossy=lossy, source=s.source, attn=s.attn, divergence=s.first_difference,
            ))
    order_of = _first_seen((r.model, r.dataset, r.temperature) for r in rows)
    rows.sort(key=lambda r: (host_rank[r.host], order_of[(r.model, r.dataset, r.temperature)],
                             r.engine != "ddtree", r.engine, method_order(r.method.split(":")[-1]), r.run))
    return Report(rows=tuple(rows))


def _group_key(item: Labeled) -> tuple:
    s = item.summary
    return (item.host, s.engine, s.model, s.dataset, s.temperature)


def _best_budget(members: Sequence[Labeled]) -> Labeled | None:
    trees = [m for m in members if m.summary.tree_budget is not None and m.summary.tokens_per_s]
    return max(trees, key=lambda m: m.summary.tokens_per_s) if trees else None


def _digest_fidelity(summary: MethodSummary, baselines: Sequence[MethodSummary]) -> float | None:
    """Across runs (vLLM): compare outputs prompt by prompt with a baseline run over the same prompts."""
    for b in sorted(baselines, key=lambda b: b.mean_tpot_s or 0):
        if len(b.output_digests) == len(summary.output_digests):
            same = sum(1 for x, y in zip(summary.output_digests, b.output_digests) if x == y)
            return same / len(summary.output_digests)
    return None


def _first_seen(keys: Iterable[Any]) -> dict[Any, int]:
    rank: dict[Any, int] = {}
    for k in keys:
        rank.setdefault(k, len(rank))
    return rank


def _lossy_note(fidelity: float, speedup: float | None, divergence: Divergence | None) -> str:
    pct = _pct(fidelity)
    if speedup is not None and speedup > 1:
        text = f"{NOT_LOSSLESS}: {speedup:.2f}x faster than baseline but only {pct} of outputs match at T=0"
    else:
        text = f"{NOT_LOSSLESS}: only {pct} of outputs match the baseline at T=0"
    return text + (f"; {describe_divergence(divergence)}" if divergence is not None else "")


def describe_divergence(d: Divergence) -> str:
    """`response 3 first differs at generated token 17 (baseline 101, this method 32)`."""
    def tok(t: int | None) -> str:
        return "end of output" if t is None else str(t)

    return (f"response {d.response} first differs at generated token {d.position} "
            f"(baseline {tok(d.baseline_token)}, this method {tok(d.method_token)})")


# --- aggregation: per host over repeats, per method over hosts and repeats -----------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    """A number measured n times: mean, population standard deviation, min and max."""

    mean: float
    std: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> "Spread | None":
        xs = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not xs:
            return None
        try:
            return cls(mean=fmean(xs), std=pstdev(xs) if len(xs) > 1 else 0.0, low=min(xs), high=max(xs), n=len(xs))
        except OverflowError:  # numbers near 1e308 from a file: no spread worth showing, and no crash
            return None


@dataclass(frozen=True, slots=True)
class GroupRow:
    """Report rows of one method aggregated: on one host over its repeats, or over every host and repeat."""

    by: str  # "host" or "method"
    host: str  # the host, or "all" for a row over every host
    hosts: tuple[str, ...]
    model: str | None
    dataset: str | None
    temperature: float | None
    attn: str | None
    method: str
    engine: str
    runs: int  # how many result rows (host x run) went into this one: the n of the spreads
    n_responses: int  # responses over all those runs
    tokens_per_s: Spread | None
    speedup: Spread | None  # each run's speedup is over its own host's baseline
    acceptance_length: Spread | None
    mean_ttft_s: Spread | None
    equal_responses: int | None  # responses whose output equals the baseline's, over all runs
    compared_responses: int | None
    tree_budget: int | None
    best_budget: bool  # the fastest (mean tokens/s) DDTree budget of its group
    divergence: tuple[str, Divergence] | None  # (host, where) for one response that differs

    @property
    def fidelity(self) -> float | None:
        if not self.compared_responses:
            return None
        return (self.equal_responses or 0) / self.compared_responses

    @property
    def lossy(self) -> bool:
        fidelity = self.fidelity
        return self.temperature == 0 and fidelity is not None and fidelity < 1.0

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(flag for flag, on in ((BEST, self.best_budget), (NOT_LOSSLESS, self.lossy)) if on)

    @property
    def note(self) -> str:
        if not self.lossy:
            return ""
        speed = self.speedup.mean if self.speedup is not None else None
        where = self.divergence[1] if self.divergence is not None else None
        text = _lossy_note(self.fidelity or 0.0, speed, where)
        if self.divergence is not None and len(self.hosts) > 1:
            text += f" on {self.divergence[0]}"
        return text


def aggregate(report: Report, by: str) -> tuple[GroupRow, ...]:
    """Rows grouped per host (over repeated runs) or per method (over every host and run), in report order."""
    if by not in BY:
        raise ValueError(f"by={by!r}: use one of {BY}")
    groups: dict[tuple, list[ReportRow]] = {}
    for r in report.rows:
        key = (r.model, r.dataset, r.temperature, r.attn, r.engine, r.method)
        groups.setdefault(((r.host,) if by == "host" else ()) + key, []).append(r)
    out = []
    for key, rows in groups.items():
        compared = [r for r in rows if r.fidelity is not None]
        example = next(((r.host, r.divergence) for r in rows if r.divergence is not None), None)
        out.append(GroupRow(
            by=by, host=rows[0].host if by == "host" else "all", hosts=tuple(dict.fromkeys(r.host for r in rows)),
            model=rows[0].model, dataset=rows[0].dataset, temperature=rows[0].temperature, attn=rows[0].attn,
            method=rows[0].method, engine=rows[0].engine, runs=len(rows), n_responses=sum(r.n_responses for r in rows),
            tokens_per_s=Spread.of(r.tokens_per_s for r in rows), speedup=Spread.of(r.speedup for r in rows),
            acceptance_length=Spread.of(r.acceptance_length for r in rows),
            mean_ttft_s=Spread.of(r.mean_ttft_s for r in rows),
            equal_responses=sum(round((r.fidelity or 0.0) * r.n_responses) for r in compared) if compared else None,
            compared_responses=sum(r.n_responses for r in compared) if compared else None,
            tree_budget=rows[0].tree_budget, best_budget=False, divergence=example,
        ))
    out = _mark_best(out, by)
    if by == "method":  # each target's methods together, in the report's order of models, datasets, temperatures
        order = _first_seen((g.model, g.dataset, g.temperature) for g in out)
        out.sort(key=lambda g: (order[(g.model, g.dataset, g.temperature)], g.engine != "ddtree", g.engine,
                                method_order(g.method.split(":")[-1]), g.attn or ""))
    return tuple(out)


def _mark_best(groups: list[GroupRow], by: str) -> list[GroupRow]:
    best: dict[tuple, GroupRow] = {}
    for g in groups:
        if g.tree_budget is None or g.tokens_per_s is None:
            continue
        key = (g.host if by == "host" else None, g.model, g.dataset, g.temperature, g.engine)
        if key not in best or g.tokens_per_s.mean > best[key].tokens_per_s.mean:  # type: ignore[union-attr]
            best[key] = g
    chosen = {id(g) for g in best.values()}
    return [_replace_best(g) if id(g) in chosen else g for g in groups]


def _replace_best(g: GroupRow) -> GroupRow:
    from dataclasses import replace

    return replace(g, best_budget=True)


# --- formatting --------------------------------------------------------------------------------------------------

FIELDS = ("host", "run", "model", "dataset", "temperature", "method", "engine", "n_responses", "tokens_per_s",
          "mean_tpot_s", "speedup", "acceptance_length", "mean_ttft_s", "fidelity", "tree_budget", "best_budget",
          "lossy", "source")


def to_json(report: Report) -> str:
    """One JSON document: every result row, the rows aggregated per host and per method, and the lossy notes."""
    def doc(row: Any) -> dict[str, Any]:
        d = asdict(row)
        if isinstance(row, GroupRow):
            d["fidelity"] = row.fidelity
            d["lossy"] = row.lossy
        d["flags"] = list(row.flags)
        d["note"] = row.note
        return d

    by_host, by_method = aggregate(report, "host"), aggregate(report, "method")
    return json.dumps({
        "rows": [doc(r) for r in report.rows],
        "by_host": [doc(g) for g in by_host],
        "by_method": [doc(g) for g in by_method],
        "not_lossless": [f"{g.model} {g.dataset} {g.method}: {g.note}" for g in by_method if g.lossy],
        "faster_but_lossy": len(report.faster_but_lossy),
    }, indent=2)


def to_csv(report: Report) -> str:
    """Every field, one row per ReportRow; empty cells for unknown values."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(FIELDS + ("flags",))
    for r in report.rows:
        cells = ["" if getattr(r, f) is None else getattr(r, f) for f in FIELDS]
        writer.writerow(cells + [";".join(r.flags)])
    return buf.getvalue()


def report_columns(report: Report) -> tuple[list[str], list[list[str]]]:
    """Headers and string cells for a table; Model and Run columns only when they tell rows apart."""
    show_model = len({r.model for r in report.rows}) > 1
    keys = [(r.host, r.model, r.dataset, r.temperature, r.method) for r in report.rows]
    show_run = len(set(keys)) < len(keys)
    headers = ["Host"] + (["Run"] if show_run else []) + (["Model"] if show_model else []) + [
        "Dataset", "T", "Method", "tok/s", "Speedup", "τ", "TTFT", "N", "Fidelity", "Flags"]
    rows = []
    for r in report.rows:
        cells = [r.host] + ([r.run] if show_run else []) + ([_short_model(r.model)] if show_model else []) + [
            _s(r.dataset), _num(r.temperature, "g"), r.method, _num(r.tokens_per_s, ".1f"),
            _num(r.speedup, ".2f", "x"), _num(r.acceptance_length, ".2f"),
            _num(None if r.mean_ttft_s is None else r.mean_ttft_s * 1000, ".1f", " ms"), str(r.n_responses),
            _fidelity_cell(r), ", ".join(r.flags)]
        rows.append(cells)
    return headers, rows


def group_columns(groups: Sequence[GroupRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells for aggregated rows: each number as mean ± std over its n runs (n shown once per row)."""
    show_model = len({g.model for g in groups}) > 1
    show_attn = len({g.attn for g in groups}) > 1
    by_host = bool(groups) and groups[0].by == "host"
    headers = (["Host"] if by_host else ["Hosts"]) + (["Model"] if show_model else []) + [
        "Dataset", "T"] + (["Attn"] if show_attn else []) + [
        "Method", "tok/s", "Speedup", "τ", "TTFT", "n", "Resp", "Fidelity", "Flags"]
    rows = []
    for g in groups:
        ttft = _scaled(g.mean_ttft_s, 1000)
        cells = ([g.host] if by_host else [str(len(g.hosts))]) + ([_short_model(g.model)] if show_model else []) + [
            _s(g.dataset), _num(g.temperature, "g")] + ([_s(g.attn)] if show_attn else []) + [
            g.method, _spread(g.tokens_per_s, ".1f"), _spread(g.speedup, ".2f", "x"),
            _spread(g.acceptance_length, ".2f"), _spread(ttft, ".1f", " ms"), str(g.runs), str(g.n_responses),
            _group_fidelity(g), ", ".join(g.flags)]
        rows.append(cells)
    return headers, rows


def _group_fidelity(g: GroupRow) -> str:
    if g.temperature not in (None, 0) and g.method != "baseline":
        return "— (sampled)"
    if g.fidelity is None:
        return "—"
    return f"{_pct(g.fidelity)} ({g.equal_responses}/{g.compared_responses})"


def _spread(s: Spread | None, fmt: str, suffix: str = "") -> str:
    if s is None:
        return "—"
    if s.n == 1:
        return f"{s.mean:{fmt}}{suffix}"
    return f"{s.mean:{fmt}} ± {s.std:{fmt}}{suffix}"


def _scaled(s: Spread | None, k: float) -> Spread | None:
    return None if s is None else Spread(s.mean * k, s.std * k, s.low * k, s.high * k, s.n)


def groups_markdown(groups: Sequence[GroupRow]) -> str:
    """Aggregated rows as a GitHub-flavoured table, lossy rows flagged, their notes below."""
    headers, rows = group_columns(groups)
    return _md_table(headers, rows, groups) + _md_notes(groups)


def _md_table(headers: list[str], rows: list[list[str]], items: Sequence[Any]) -> str:
    method_col = headers.index("Method")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r, cells in zip(items, rows):
        cells = [c.replace("|", "\\|") for c in cells]
        if r.best_budget:
            cells[method_col] = f"**{cells[method_col]}**"
        if r.lossy:
            cells[-1] = cells[-1].replace(NOT_LOSSLESS, f"⚠ {NOT_LOSSLESS}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _md_notes(items: Sequence[Any]) -> str:
    notes = [f"- {note_label(r)}: {r.note}" for r in items if r.lossy]
    return ("\n" + "\n".join(notes) + "\n") if notes else ""


def note_label(row: Any) -> str:
    """Who a lossy note is about: host (or "all hosts"), target and dataset, method."""
    where = row.host if row.host != "all" else "all hosts"
    model = f" {_short_model(row.model)}" if row.model else ""
    return f"{where}{model} {row.dataset} {row.method}"


def to_markdown(report: Report) -> str:
    """A GitHub-flavoured table, best budgets in bold, lossy rows flagged, and the notes below."""
    headers, rows = report_columns(report)
    text = _md_table(headers, rows, report.rows)
    notes = [f"- {r.host} {r.dataset} {r.method}: {r.note}" for r in report.rows if r.lossy]
    return text + ("\n" + "\n".join(notes) + "\n" if notes else "")


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "—" if value is None else f"{value:{fmt}}{suffix}"


def _fidelity_cell(row: "ReportRow") -> str:
    """Sampled runs draw different tokens by design: an output match rate only means something when greedy."""
    if row.temperature not in (None, 0) and row.method != "baseline":
        return "— (sampled)"
    return _pct(row.fidelity)


def _pct(value: float | None) -> str:
    if value is None:
        return "—"
    return "100%" if value == 1 else f"{value * 100:.1f}%"


def _s(value: str | None) -> str:
    return "—" if value is None else value


def _short_model(model: str | None) -> str:
    return "—" if model is None else model.rsplit("/", 1)[-1]
