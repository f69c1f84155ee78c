"""A PNG of the report: speedup and acceptance length per method over every host and repeat, with error bars."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ddops.bench.report import GroupRow, Report, aggregate, code_ids, code_label


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


def plot_report(report: Report, out_png: str | Path) -> Path:
    """Two bar charts (speedup, tau): one bar per method and target, mean over hosts and runs, ± std as error
    bars; lossy bars hatched. Returns the path written."""
    # A bare Figure renders through Agg on savefig without touching pyplot's global backend or state.
    from matplotlib.figure import Figure

    groups = aggregate(report, "method")
    methods = list(dict.fromkeys(g.method for g in groups))
    series = plot_series(groups)

    fig = Figure(figsize=(max(8.0, 1.1 * len(methods) * 2), 4.8))
    axes = fig.subplots(1, 2, squeeze=False)
    width = 0.8 / max(1, len(series))
    for ax, attr, title in ((axes[0][0], "speedup", "Speedup over baseline"),
                            (axes[0][1], "acceptance_length", "Acceptance length τ")):
        for k, (name, by_method) in enumerate(series.items()):
            xs, heights, errors, hatches = [], [], [], []
            for j, method in enumerate(methods):
                row = by_method.get(method)
                spread = getattr(row, attr) if row is not None else None
                if spread is None:
                    continue
                xs.append(j - 0.4 + width * (k + 0.5))
                heights.append(spread.mean)
                errors.append(spread.std)
                hatches.append("//" if row.lossy else "")
            bars = ax.bar(xs, heights, width=width, yerr=errors, capsize=3, label=name)
            for bar, hatch in zip(bars, hatches):
                bar.set_hatch(hatch)
        if attr == "speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(title)
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels(methods, rotation=45, ha="right")
    axes[0][0].legend(fontsize="small")
    runs = max((g.runs for g in groups), default=0)
    caption = f"mean over hosts and repeats (up to n={runs} runs), error bars ± std"
    if any(g.lossy for g in groups):
        caption += "; hatched: output differs from baseline at T=0 (NOT LOSSLESS)"
    fig.text(0.01, 0.01, caption, fontsize="small")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def _mean(g: GroupRow, attr: str) -> float:
    spread = getattr(g, attr)
    return spread.mean if spread is not None else 0.0
