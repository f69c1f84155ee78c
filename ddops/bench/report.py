"""The bench report: method summaries from many hosts as rows, with speedups, best budgets and lossy flags; pure."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from ddops.bench.summary import MethodSummary
from ddops.bench.summarize_ddtree import BASELINE, method_order

BEST = "best"
NOT_LOSSLESS = "NOT LOSSLESS"


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
        """Why a row is flagged, in words."""
        if not self.lossy or self.fidelity is None:
            return ""
        pct = _pct(self.fidelity)
        if self.speedup is not None and self.speedup > 1:
            return f"{NOT_LOSSLESS}: {self.speedup:.2f}x faster than baseline but only {pct} of outputs match at T=0"
        return f"{NOT_LOSSLESS}: only {pct} of outputs match the baseline at T=0"


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
                best_budget=m is best, lossy=lossy, source=s.source,
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


# --- formatting --------------------------------------------------------------------------------------------------

FIELDS = ("host", "run", "model", "dataset", "temperature", "method", "engine", "n_responses", "tokens_per_s",
          "mean_tpot_s", "speedup", "acceptance_length", "mean_ttft_s", "fidelity", "tree_budget", "best_budget",
          "lossy", "source")


def to_json(report: Report) -> str:
    """One JSON document: {"rows": [...], "faster_but_lossy": n}."""
    rows = []
    for r in report.rows:
        d = asdict(r)
        d["flags"] = list(r.flags)
        d["note"] = r.note
        rows.append(d)
    return json.dumps({"rows": rows, "faster_but_lossy": len(report.faster_but_lossy)}, indent=2)


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


def to_markdown(report: Report) -> str:
    """A GitHub-flavoured table, best budgets in bold, lossy rows flagged, and the notes below."""
    headers, rows = report_columns(report)
    method_col = headers.index("Method")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r, cells in zip(report.rows, rows):
        cells = [c.replace("|", "\\|") for c in cells]
        if r.best_budget:
            cells[method_col] = f"**{cells[method_col]}**"
        if r.lossy:
            cells[-1] = cells[-1].replace(NOT_LOSSLESS, f"⚠ {NOT_LOSSLESS}")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r.host} {r.dataset} {r.method}: {r.note}" for r in report.rows if r.lossy]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


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
