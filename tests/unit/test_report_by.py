"""`bench report --by` picks the grouping for every output, not only the table: --json names the views the table
shows and holds their rows under `by_<view>` in the table's order; `--format csv` with --by has one line per
aggregated row (without it, one per result row, as before)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from ddops.bench.report import aggregate, build_report, group_columns, to_csv, to_json
from tests.conftest import run_ddops
from tests.unit.test_report import PLAIN, two_runs


def test_json_holds_the_rows_of_each_view_in_the_tables_order():
    report = build_report(two_runs())
    default = json.loads(to_json(report))
    assert default["views"] == ["host", "method"] and "by_run" not in default and "by_patchset" not in default
    doc = json.loads(to_json(report, ["patchset"]))
    assert doc["views"] == ["patchset"]
    headers, table = group_columns(aggregate(report, "patchset"))  # what the --by patchset table shows
    assert [(g["method"], g["code_label"]) for g in doc["by_patchset"]] == [
        (row[headers.index("Method")], row[headers.index("Code")]) for row in table]
    assert [(g["method"], g["code_label"]) for g in doc["by_patchset"]] == [
        ("baseline", "73068c9 no patches"), ("baseline", "73068c9 +hybrid-tree-verify"),
        ("ddtree_tb32", "73068c9 no patches"), ("ddtree_tb32", "73068c9 +hybrid-tree-verify")]
    assert {g["by"] for g in doc["by_patchset"]} == {"patchset"}
    assert len(doc["by_host"]) == 4 and len(doc["by_method"]) == 4  # always there, as docs/json.md promises


def test_csv_with_by_has_one_line_per_aggregated_row_and_without_it_one_per_result_row():
    report = build_report(two_runs(second=PLAIN))
    lines = list(csv.DictReader(io.StringIO(to_csv(report, "method"))))
    assert [(r["by"], r["hosts"], r["method"], r["runs"]) for r in lines] == [
        ("method", "h1", "baseline", "2"), ("method", "h1", "ddtree_tb32", "2")]
    assert float(lines[1]["speedup_mean"]) == pytest.approx(3.0) and lines[1]["speedup_std"] == "0.0"
    by_run = list(csv.DictReader(io.StringIO(to_csv(report, "run"))))
    assert [(r["run_id"], r["host"], r["method"]) for r in by_run] == [
        ("r1", "h1", "baseline"), ("r1", "h1", "ddtree_tb32"), ("r2", "h1", "baseline"), ("r2", "h1", "ddtree_tb32")]
    assert len(list(csv.DictReader(io.StringIO(to_csv(report))))) == len(report.rows) == 4


def _collected_vllm_run(root: Path, run_id: str, *, patches: list[str]) -> None:
    """One collected run of host h1 (vLLM JSON results: read without torch): a baseline and an MTP method."""
    run = root / run_id
    (run / "h1").mkdir(parents=True)
    base = {"completed": 2, "total_output_tokens": 100, "mean_tpot_ms": 10.0, "mean_ttft_ms": 50.0,
            "output_throughput": 90.0, "model_id": "m", "dataset": "gsm8k", "temperature": "0",
            "generated_texts": ["x", "y"]}
    (run / "h1" / "base.json").write_text(json.dumps(base))
    (run / "h1" / "mtp.json").write_text(json.dumps(dict(base, mean_tpot_ms=5.0, spec_decode_acceptance_length=2.0,
                                                         method="mtp")))
    entry = {"files": [{"path": "base.json"}, {"path": "mtp.json"}], "status": "completed",
             "repo_commit": PLAIN.commit, "torch": "2.13.0", "transformers": "5.23.0", "python": "3.11",
             "patches": [{"id": p, "sha256": "ab" * 32, "in_place": True} for p in patches]}
    (run / "manifest.json").write_text(json.dumps({"run_id": run_id, "summarizer": "vllm", "hosts": {"h1": entry}}))


def table_rows(stdout: str) -> list[dict[str, str]]:
    """The rich table's rows as {header: cell} (one line per row at 200 columns)."""
    lines = [line.strip() for line in stdout.splitlines()]
    split = lambda line: [c.strip() for c in line[1:-1].split(line[0])]  # noqa: E731
    headers = split(next(line for line in lines if line.startswith("┃")))
    return [dict(zip(headers, split(line))) for line in lines if line.startswith("│")]


@pytest.fixture
def two_collected_runs(tmp_path: Path) -> tuple[str, ...]:
    _collected_vllm_run(tmp_path, "r1", patches=[])
    _collected_vllm_run(tmp_path, "r2", patches=["hybrid-tree-verify"])
    return ("bench", "report", "r1", "r2", "--results-dir", str(tmp_path))


@pytest.mark.parametrize("by", ["run", "patchset"])
def test_bench_report_json_holds_the_rows_the_by_table_shows_in_its_order(two_collected_runs, by):
    table = table_rows(run_ddops(*two_collected_runs, "--by", by).stdout)
    proc = run_ddops("--json", *two_collected_runs, "--by", by)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["views"] == [by] and {g["by"] for g in doc[f"by_{by}"]} == {by}
    shown = [(row.get("Run", ""), row["Code"], row["Method"]) for row in table]
    assert [(g["run_id"], g["code_label"], g["method"]) for g in doc[f"by_{by}"]] == shown
    assert len(shown) == 4 and len({s[1] for s in shown}) == 2  # two codes, never pooled


def test_bench_report_csv_with_by_has_the_by_tables_rows(two_collected_runs):
    proc = run_ddops(*two_collected_runs, "--by", "patchset", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    lines = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["by"], r["host"], r["method"], r["code"]) for r in lines] == [
        ("patchset", "all", "vllm:baseline", "73068c9 no patches"),
        ("patchset", "all", "vllm:baseline", "73068c9 +hybrid-tree-verify"),
        ("patchset", "all", "vllm:mtp", "73068c9 no patches"),
        ("patchset", "all", "vllm:mtp", "73068c9 +hybrid-tree-verify")]
    assert [float(r["speedup_mean"]) for r in lines] == [1.0, 1.0, 2.0, 2.0]
    every_row = list(csv.DictReader(io.StringIO(run_ddops(*two_collected_runs, "--format", "csv").stdout)))
    assert len(every_row) == 4 and "by" not in every_row[0]  # without --by: one line per result row, as before
