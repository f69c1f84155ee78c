"""A PNG of the report: speedup and acceptance length per method over every host and repeat, with error bars."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddops.bench.compare import SideBySide, side_by_side
from ddops.bench.report import REFERENCE_PATH, GroupRow, Report, aggregate, code_ids, code_label, reference_note


def plot_series(groups: Sequence[GroupRow]) -> dict[str, dict[str, GroupRow]]:
    """Bar series name (target, dataset, temperature, code: what varies) -> method -> its per-method row."""
    several = {name: len({getattr(g, name) for g in groups}) > 1 for name in ("model", "dataset", "temperature")}
    codes = code_ids(groups)  # different code is never one series: each commit and patch set gets its own bars
    series: dict[str, dict[str, GroupRow]] = {}
    for g in groups:
        parts = [g.model.rsplit("/", 1)[-1] if several["model"] and g.model else None,
                 g.dataset if several["dataset"] else None,
                 f"T={g.temperature:g}" if several["temperature"] and g.temperature is not None else None,
                 code_label(g.code, codes) if len(codes) > 1 else None]
        name = " ".join(p for p in parts if p) or "all hosts"
        # With several runs of one method in a series (sdpa and flash_attn, say), the plot keeps the fastest.
        have = series.setdefault(name, {}).get(g.method)
        if have is None or _mean(g, "tokens_per_s") > _mean(have, "tokens_per_s"):
            series[name][g.method] = g
    return series


def plot_report(report: Report, out_png: str | Path, *, title: str = "", caption: str = "") -> Path:
    """Bar charts of speedup and tau (and, with several engines, tokens/s against the best chain method): one bar
    per method and target, mean over hosts and runs, ± std as error bars; lossy bars hatched, reference-path bars
    cross-hatched; `title` on top and `caption` (what produced nothing) under the notes. Returns the path written."""
    # A bare Figure renders through Agg on savefig without touching pyplot's global backend or state.
    from matplotlib.figure import Figure

    groups = aggregate(report, "method")
    methods = list(dict.fromkeys(g.method for g in groups))
    series = plot_series(groups)
    engines = {g.engine for g in groups}
    chains = [t for t in side_by_side(report) if t.best_chain] if len(engines) > 1 else []
    panels = [("speedup", "Speedup over the same engine's baseline"), ("acceptance_length", "Acceptance length τ")]
    if chains:
        panels.append(("vs_best_chain", "tok/s against the best chain method"))

    lines = plot_notes(groups, bool(chains), caption)

    fig = Figure(figsize=(max(8.0, 2.0 + 0.8 * len(methods) * len(panels)), 4.2 + 0.18 * len(lines)))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (attr, panel_title) in zip(axes, panels):
        bars_of = _chain_bars(chains) if attr == "vs_best_chain" else {
            name: {m: _bar(getattr(g, attr), g) for m, g in by_method.items()} for name, by_method in series.items()}
        width = 0.8 / max(1, len(bars_of))
        for k, (name, by_method) in enumerate(bars_of.items()):
            present = {m: b for m, b in by_method.items() if b is not None}
            shown = [(j, present[m]) for j, m in enumerate(methods) if m in present]
            bars = ax.bar([j - 0.4 + width * (k + 0.5) for j, _ in shown], [b[0] for _, b in shown], width=width,
                          yerr=[b[1] for _, b in shown], capsize=3, label=name)
            for bar, (_, (_, _, hatch, star)) in zip(bars, shown):
                bar.set_hatch(hatch)
                if star:
                    ax.annotate("*", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
        if attr != "acceptance_length":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(panel_title, fontsize="medium")
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels(methods, rotation=45, ha="right")
        if attr != "acceptance_length":  # its series are the speedup panel's
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.text(0.01, 0.01, "\n".join(lines), fontsize="small", va="bottom")
    fig.tight_layout(rect=(0, min(0.6, 0.2 * (len(lines) + 1) / (4.2 + 0.18 * len(lines))), 1, 1))
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def plot_notes(groups: Sequence[GroupRow], chains: bool, caption: str = "") -> list[str]:
    """The lines under the charts: what the bars and marks mean, each reference-path method with why, and what
    produced nothing (`caption`), wrapped to the figure."""
    notes = [f"mean over hosts and repeats (up to n={max((g.runs for g in groups), default=0)} runs), "
             "error bars ± std"]
    if any(g.lossy for g in groups):
        notes.append("hatched //: output differs from baseline at T=0 (NOT LOSSLESS)")
    notes += [f"hatched xx: {g.method}: {reference_note(g.verify_paths)}" for g in groups if REFERENCE_PATH in g.flags]
    if chains:
        notes.append("*: faster or slower than the best chain prompt by prompt (sign test p < 0.05)")
    notes += caption.splitlines()
    return [piece for note in notes for piece in textwrap.wrap(note, 150)]


Bar = tuple[float, float, str, bool]  # height, error bar, hatch, starred


def _bar(value: Any, row: GroupRow, star: bool = False) -> Bar | None:
    """A bar for a value (a Spread: mean ± std; a float: no error bar), hatched as its row is flagged."""
    if value is None:
        return None
    height, error = (value, 0.0) if isinstance(value, float) else (value.mean, value.std)
    return height, error, "//" if row.lossy else "xx" if REFERENCE_PATH in row.flags else "", star


def _chain_bars(tables: Sequence[SideBySide]) -> dict[str, dict[str, Bar | None]]:
    """Series (host, target, dataset, temperature) -> method -> its tokens/s over the best chain's, starred where
    the paired test shows a difference."""
    return {t.title: {r.group.method: _bar(r.vs_best_chain, r.group, r.paired is not None and r.paired.shown)
                      for r in t.rows} for t in tables}


def _mean(g: GroupRow, attr: str) -> float:
    spread = getattr(g, attr)
    return spread.mean if spread is not None else 0.0
