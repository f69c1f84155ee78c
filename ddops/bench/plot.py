"""A PNG of the report: speedup and acceptance length by method, one bar series per host and dataset."""

from __future__ import annotations

from pathlib import Path

from ddops.bench.report import Report, ReportRow


def plot_report(report: Report, out_png: str | Path) -> Path:
    """Write two bar charts (speedup, tau) side by side; lossy bars hatched; returns the path written."""
    # A bare Figure renders through Agg on savefig without touching pyplot's global backend or state.
    from matplotlib.figure import Figure

    methods: list[str] = []
    several_models = len({r.model for r in report.rows}) > 1
    series: dict[str, dict[str, ReportRow]] = {}
    for r in report.rows:
        if r.method not in methods:
            methods.append(r.method)
        temp = f"T={r.temperature:g}" if r.temperature is not None else None
        model = r.model.rsplit("/", 1)[-1] if several_models and r.model else None
        name = " ".join(str(x) for x in (r.host, model, r.dataset, temp) if x)
        # With several runs of one method in a series (sdpa and flash_attn, say), the plot keeps the fastest.
        have = series.setdefault(name, {}).get(r.method)
        if have is None or (r.tokens_per_s or 0) > (have.tokens_per_s or 0):
            series[name][r.method] = r

    fig = Figure(figsize=(max(8.0, 1.1 * len(methods) * 2), 4.8))
    axes = fig.subplots(1, 2, squeeze=False)
    width = 0.8 / max(1, len(series))
    for ax, attr, title in ((axes[0][0], "speedup", "Speedup over baseline"),
                            (axes[0][1], "acceptance_length", "Acceptance length τ")):
        for k, (name, by_method) in enumerate(series.items()):
            xs, heights, hatches = [], [], []
            for j, method in enumerate(methods):
                row = by_method.get(method)
                value = getattr(row, attr) if row is not None else None
                if value is None:
                    continue
                xs.append(j - 0.4 + width * (k + 0.5))
                heights.append(value)
                hatches.append("//" if row.lossy else "")
            bars = ax.bar(xs, heights, width=width, label=name)
            for bar, hatch in zip(bars, hatches):
                bar.set_hatch(hatch)
        if attr == "speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(title)
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels(methods, rotation=45, ha="right")
    axes[0][0].legend(fontsize="small")
    if report.lossy_rows:
        fig.text(0.01, 0.01, "hatched: output differs from baseline at T=0 (not lossless)", fontsize="small")
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out

