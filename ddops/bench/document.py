"""`bench report`'s one value: collected runs read, their report built, the views chosen, and the engines compared;
each output format (JSON, CSV, markdown, the tables) is read from it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddops.bench.collect import Collected, collected_run_ids, load_collected
from ddops.bench.compare import ENGINE_VIEW, SideBySide, engines_csv, engines_markdown, side_by_side
from ddops.bench.report import (BY, DEFAULT_VIEWS, Report, aggregate, build_report, groups_markdown, pooling_note,
                                report_title, to_csv, to_json)
from ddops.errors import UsageError

FORMATS = ("table", "json", "csv", "md")
VIEWS = (*BY, ENGINE_VIEW)


@dataclass(frozen=True, slots=True)
class ReportDocument:
    """What `bench report` says of some collected runs: the report, the views it shows (`--by`, else host and
    method, or engine when the runs hold several engines), the engines side by side, and what produced nothing."""

    run_ids: tuple[str, ...]
    report: Report
    views: tuple[str, ...]
    comparisons: tuple[SideBySide, ...]
    collected: Collected
    title: str
    note: str | None

    @property
    def problems(self) -> list[str]:
        """Files that could not be read, and every host and run that produced nothing, one line each."""
        return [*self.collected.problems, *(g.line for g in self.collected.gaps)]

    @property
    def exit_code(self) -> int:
        return 1 if self.problems or not self.report.rows else 0

    def to_json(self) -> dict[str, Any]:
        return {"run_ids": list(self.run_ids), "title": self.title,
                **json.loads(to_json(self.report, [v for v in self.views if v != ENGINE_VIEW])),
                "views": list(self.views), "comparisons": [t.to_json() for t in self.comparisons],
                "problems": self.problems, "gaps": [g.to_json() for g in self.collected.gaps],
                **({"note": self.note} if self.note else {})}

    def csv(self, by: str | None) -> str:
        """`--by`: the aggregated rows of that table; without it, every result row."""
        return engines_csv(self.comparisons) if by == ENGINE_VIEW else to_csv(self.report, by)

    def markdown(self) -> str:
        return f"**{self.title}**\n\n" + "\n".join(
            engines_markdown(self.comparisons) if view == ENGINE_VIEW else groups_markdown(aggregate(self.report, view))
            for view in self.views)


def report_document(root: Path, run_ids: Sequence[str], by: str | None = None, fmt: str = "table") -> ReportDocument:
    """The document over these collected runs (default: the newest under root); UsageError for a format or view it
    does not know, or nothing collected."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: use {', '.join(FORMATS[:-1])} or {FORMATS[-1]}")
    if by is not None and by not in VIEWS:
        raise UsageError(f"--by {by}: use {', '.join(VIEWS)}")
    ids = list(run_ids) or collected_run_ids(root)[:1]
    if not ids:
        raise UsageError(f"nothing collected under {root}: run `ddops bench collect RUN` first")
    collected = load_collected(root, ids)
    report = build_report(collected.items)
    several_engines = len({r.engine for r in report.rows}) > 1
    views = (by,) if by else (ENGINE_VIEW,) if several_engines else DEFAULT_VIEWS
    tables = side_by_side(report) if ENGINE_VIEW in views or fmt == "json" else ()
    return ReportDocument(tuple(ids), report, views, tables, collected, report_title(report.rows, ids),
                          pooling_note(report))
