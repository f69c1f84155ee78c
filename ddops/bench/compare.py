"""Engines side by side: per host, model, dataset and temperature, each engine's baseline and methods, every method's
throughput against the best chain method, and per-prompt paired statistics against it (the median time ratio with a
bootstrap 95% interval, an exact sign test); pure, standard library only.

The question this answers is the project's: does DDTree's tree walk beat the chain verification a team already has
(DFlash, vLLM's MTP or n-gram)? Rows of different engines or code are never pooled; only compared."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from ddops.bench.report import GroupRow, Report, aggregate, group_columns, groups_csv, md_notes, md_table
from ddops.bench.summarize_ddtree import BASELINE

ENGINE_VIEW = "engine"  # `--by engine`: this module's table, the default when the rows hold several engines
ALPHA = 0.05  # a sign test below this shows a difference
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20261130  # fixed: the same results give the same interval on every run


@dataclass(frozen=True, slots=True)
class Paired:
    """One method against another over the prompts both timed: per prompt, this method's seconds per output token
    over the other's."""

    method: str
    against: str
    prompts: int  # prompts timed on both sides
    faster: int  # prompts on which this method took less time per token
    slower: int
    median_ratio: float
    low: float  # the bootstrap 95% interval of the median ratio
    high: float
    p_value: float  # exact two-sided sign test (ties left out)

    @property
    def shown(self) -> bool:
        return self.p_value < ALPHA

    @property
    def p_text(self) -> str:
        return "p < 0.001" if self.p_value < 0.001 else f"p = {self.p_value:.3f}"

    @property
    def short(self) -> str:
        """`41/48 faster, p < 0.001` (this method against the other), or `no difference shown (...)`."""
        if not self.shown:
            return f"no difference shown ({self.faster}/{self.prompts} faster, {self.p_text})"
        if self.faster >= self.slower:
            return f"{self.faster}/{self.prompts} faster, {self.p_text}"
        return f"{self.slower}/{self.prompts} slower, {self.p_text}"

    @property
    def verdict(self) -> str:
        """`ddtree_tb64 faster than vllm:mtp on 41/48 prompts, p < 0.001`, or `no difference shown (...)`."""
        p = self.p_text
        if not self.shown:
            return f"no difference shown ({self.method} faster on {self.faster}/{self.prompts} prompts, {p})"
        if self.faster >= self.slower:
            return f"{self.method} faster than {self.against} on {self.faster}/{self.prompts} prompts, {p}"
        return f"{self.against} faster than {self.method} on {self.slower}/{self.prompts} prompts, {p}"

    @property
    def ratio_text(self) -> str:
        return f"median time ratio {self.median_ratio:.2f} (95% CI {self.low:.2f}–{self.high:.2f})"

    def to_json(self) -> dict:
        return {"method": self.method, "against": self.against, "prompts": self.prompts, "faster": self.faster,
                "slower": self.slower, "median_ratio": self.median_ratio, "ci95": [self.low, self.high],
                "p_value": self.p_value, "verdict": self.verdict}


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One engine's method on one host, target, dataset and temperature, against the best chain method there."""

    group: GroupRow
    vs_best_chain: float | None = None  # this method's tokens/s over the best chain method's
    paired: Paired | None = None
    unpaired: str = ""  # why no paired statistic, when there is a best chain to pair with
    best_chain: bool = False

    @property
    def paired_cell(self) -> str:
        """`41/48 faster, p < 0.001`, `no difference shown (4/8, p = 0.727)`, or `—`."""
        if self.best_chain:
            return "best chain"
        return self.paired.short if self.paired is not None else "—"

    def to_json(self) -> dict:
        return {"method": self.group.method, "engine": self.group.engine, "vs_best_chain": self.vs_best_chain,
                "best_chain": self.best_chain, "paired": self.paired.to_json() if self.paired else None,
                "unpaired": self.unpaired or None}


@dataclass(frozen=True, slots=True)
class SideBySide:
    host: str
    model: str | None  # the target's last path component: engines name the same model by different paths
    dataset: str | None
    temperature: float | None
    rows: tuple[EngineRow, ...]
    best_chain: str | None  # its method label

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.group.engine for r in self.rows))

    @property
    def title(self) -> str:
        t = "" if self.temperature is None else f" T={self.temperature:g}"
        return f"{self.host} {self.model or '—'} {self.dataset or '—'}{t}"

    def to_json(self) -> dict:
        return {"host": self.host, "model": self.model, "dataset": self.dataset, "temperature": self.temperature,
                "engines": list(self.engines), "best_chain": self.best_chain, "rows": [r.to_json() for r in self.rows]}


def method_name(g: GroupRow) -> str:
    return g.method.rsplit(":", 1)[-1]


def is_chain(g: GroupRow) -> bool:
    """A speculative method that verifies one draft chain per step: anything but a baseline and a DDTree budget."""
    return method_name(g) != BASELINE and g.tree_budget is None


def side_by_side(report: Report) -> tuple[SideBySide, ...]:
    """Per host x model x dataset x temperature: every engine's rows (repeats pooled per host, never engines or
    code), each against the fastest lossless chain method there."""
    buckets: dict[tuple, list[GroupRow]] = {}
    for g in aggregate(report, "host"):
        model = g.model.rstrip("/").rsplit("/", 1)[-1] if g.model else None
        buckets.setdefault((g.host, model, g.dataset, g.temperature), []).append(g)
    out = []
    for (host, model, dataset, temperature), groups in buckets.items():
        groups.sort(key=lambda g: g.engine != "ddtree")  # stable: each engine's rows in the report's order
        chains = [g for g in groups if is_chain(g) and not g.lossy and g.tokens_per_s is not None]
        best = max(chains, key=lambda g: g.tokens_per_s.mean) if chains else None  # type: ignore[union-attr]
        rows = [_against(g, best) for g in groups]
        out.append(SideBySide(host, model, dataset, temperature, tuple(rows), best.method if best else None))
    return tuple(out)


def _against(g: GroupRow, best: GroupRow | None) -> EngineRow:
    if best is None or g.tokens_per_s is None or best.tokens_per_s is None or not best.tokens_per_s.mean:
        return EngineRow(g)
    ratio = g.tokens_per_s.mean / best.tokens_per_s.mean
    if g is best or method_name(g) == BASELINE:
        return EngineRow(g, ratio, best_chain=g is best)
    paired = pair(g, best)
    return EngineRow(g, ratio, paired if isinstance(paired, Paired) else None,
                     paired if isinstance(paired, str) else "")


def pair(a: GroupRow, b: GroupRow) -> Paired | str:
    """a against b prompt by prompt, or why they cannot be paired."""
    if not a.prompt_times or not b.prompt_times:
        missing = a if not a.prompt_times else b
        hint = " (vLLM keeps them with --save-detailed)" if missing.engine == "vllm" else ""
        return f"{missing.method} has no per-prompt times{hint}"
    if len(a.prompt_times) != len(b.prompt_times):
        return f"not the same prompts: {a.method} ran {len(a.prompt_times)}, {b.method} {len(b.prompt_times)}"
    for i, (x, y) in enumerate(zip(a.prompt_lengths, b.prompt_lengths)):
        if x is not None and y is not None and x != y:
            return f"not the same prompts: prompt {i} is {x} tokens for {a.method}, {y} for {b.method}"
    ratios = [x / y for x, y in zip(a.prompt_times, b.prompt_times) if x is not None and y]
    if not ratios:
        return "no prompt was timed on both sides"
    faster = sum(1 for r in ratios if r < 1)
    slower = sum(1 for r in ratios if r > 1)
    low, high = bootstrap_median_interval(ratios)
    return Paired(a.method, b.method, len(ratios), faster, slower, median(ratios), low, high, sign_test(faster, slower))


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided binomial p-value of wins against losses under a fair coin (ties already left out)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def bootstrap_median_interval(values: Sequence[float], samples: int = BOOTSTRAP_SAMPLES,
                              seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the medians of `samples` resamples, drawn with a fixed seed."""
    rng = random.Random(seed)
    medians = sorted(median(rng.choices(values, k=len(values))) for _ in range(samples))
    return medians[int(0.025 * samples)], medians[math.ceil(0.975 * samples) - 1]


def verdicts(tables: Sequence[SideBySide]) -> list[str]:
    """One line per paired comparison: where, which methods, the verdict and the median ratio with its interval;
    and where a method could not be paired with the best chain, why."""
    lines = []
    for t in tables:
        for r in t.rows:
            if r.paired is not None:
                lines.append(f"{t.title}: {r.paired.verdict}; {r.paired.ratio_text}")
            elif r.unpaired:
                lines.append(f"{t.title}: {r.group.method} against {t.best_chain}: no paired statistic: {r.unpaired}")
    return lines


def engine_columns(tables: Sequence[SideBySide]) -> tuple[list[str], list[list[str]]]:
    """The per-host table's columns for every engine's rows, then throughput against the best chain method and the
    paired verdict against it."""
    rows = [r for t in tables for r in t.rows]
    headers, cells = group_columns([r.group for r in rows])
    for r, row_cells in zip(rows, cells):
        row_cells += ["—" if r.vs_best_chain is None else f"{r.vs_best_chain:.2f}x", r.paired_cell]
    return headers + ["vs best chain", "Paired (per prompt)"], cells


def engines_markdown(tables: Sequence[SideBySide]) -> str:
    """The engine table as GitHub-flavoured markdown, flagged rows' notes and the verdicts below."""
    groups = [r.group for t in tables for r in t.rows]
    text = md_table(*engine_columns(tables), groups) + md_notes(groups)
    return text + "".join(f"\n- {line}" for line in verdicts(tables)) + ("\n" if tables else "")


PAIRED_FIELDS = ("vs_best_chain", "best_chain", "paired_against", "paired_prompts", "faster", "slower",
                 "median_time_ratio", "ci95_low", "ci95_high", "p_value", "unpaired")


def engines_csv(tables: Sequence[SideBySide]) -> str:
    """One line per engine row: the per-host columns, then the comparison with the best chain method."""
    rows = [r for t in tables for r in t.rows]
    cells = [[r.vs_best_chain, r.best_chain] + ([p.against, p.prompts, p.faster, p.slower, p.median_ratio, p.low,
                                                 p.high, p.p_value] if (p := r.paired) else [None] * 8)
             + [r.unpaired] for r in rows]
    return groups_csv([r.group for r in rows], PAIRED_FIELDS, cells)
