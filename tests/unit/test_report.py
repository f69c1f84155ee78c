"""The report: per host x dataset x method rows, speedups against the host's baseline, best budgets, lossy flags."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest

from ddops.bench.report import (Labeled, aggregate, build_report, group_columns, groups_markdown, to_csv,
                                to_json)
from ddops.bench.results import summarize_file
from ddops.bench.summarize_vllm import summarize_vllm
from ddops.bench.summary import MethodSummary


def summary(method, tpot, *, tau=None, fidelity=1.0, temperature=0.0, dataset="gsm8k", engine="ddtree",
            digests=(), ttft=0.1, n=4):
    budget = int(method.removeprefix("ddtree_tb")) if method.startswith("ddtree_tb") else None
    return MethodSummary(method=method, source=f"{dataset}.pt", engine=engine, n_responses=n, mean_tpot_s=tpot,
                         tokens_per_s=1 / tpot, mean_ttft_s=ttft, acceptance_length=tau, fidelity=fidelity,
                         tree_budget=budget, dataset=dataset, temperature=temperature, model="Qwen/Qwen3-8B",
                         output_digests=digests)


def fleet():
    """Two hosts, same dataset; h2's tree budget 64 is fastest but changes the output at temperature 0."""
    return [
        Labeled("h1", "r1", summary("baseline", 0.030)),
        Labeled("h1", "r1", summary("dflash", 0.015, tau=4.0)),
        Labeled("h1", "r1", summary("ddtree_tb32", 0.012, tau=5.0)),
        Labeled("h1", "r1", summary("ddtree_tb64", 0.010, tau=6.0)),
        Labeled("h2", "r1", summary("baseline", 0.020)),
        Labeled("h2", "r1", summary("ddtree_tb32", 0.010, tau=5.0)),
        Labeled("h2", "r1", summary("ddtree_tb64", 0.008, tau=6.5, fidelity=0.75)),
    ]


def rows_by(report):
    return {(r.host, r.dataset, r.temperature, r.method): r for r in report.rows}


def test_speedup_is_against_the_same_hosts_baseline():
    rows = rows_by(build_report(fleet()))
    assert rows["h1", "gsm8k", 0.0, "dflash"].speedup == pytest.approx(0.030 / 0.015)
    assert rows["h1", "gsm8k", 0.0, "ddtree_tb64"].speedup == pytest.approx(3.0)
    assert rows["h2", "gsm8k", 0.0, "ddtree_tb32"].speedup == pytest.approx(0.020 / 0.010)  # not h1's 0.030
    assert rows["h2", "gsm8k", 0.0, "ddtree_tb64"].speedup == pytest.approx(2.5)
    assert rows["h1", "gsm8k", 0.0, "baseline"].speedup == pytest.approx(1.0)
    assert rows["h1", "gsm8k", 0.0, "ddtree_tb64"].tokens_per_s == pytest.approx(100.0)


def test_rows_keep_host_order_then_method_order():
    report = build_report(reversed(fleet()))
    assert [(r.host, r.method) for r in report.rows] == [
        ("h2", "baseline"), ("h2", "ddtree_tb32"), ("h2", "ddtree_tb64"),
        ("h1", "baseline"), ("h1", "dflash"), ("h1", "ddtree_tb32"), ("h1", "ddtree_tb64")]


def test_the_fastest_tree_budget_is_marked_per_host_and_dataset():
    items = fleet() + [Labeled("h1", "r2", summary("baseline", 0.030, dataset="math500")),
                       Labeled("h1", "r2", summary("ddtree_tb32", 0.009, dataset="math500")),
                       Labeled("h1", "r2", summary("ddtree_tb64", 0.011, dataset="math500"))]
    best = {(r.host, r.dataset, r.method) for r in build_report(items).rows if r.best_budget}
    # h2's tb64 is faster than its tb32 but NOT LOSSLESS: best goes to the fastest budget whose output is the baseline's
    assert best == {("h1", "gsm8k", "ddtree_tb64"), ("h2", "gsm8k", "ddtree_tb32"), ("h1", "math500", "ddtree_tb32")}


def test_a_faster_method_whose_greedy_output_differs_is_flagged_not_lossless():
    report = build_report(fleet())
    (lossy,) = [r for r in report.rows if r.lossy]
    assert (lossy.host, lossy.method, lossy.fidelity) == ("h2", "ddtree_tb64", 0.75)
    assert report.faster_but_lossy == (lossy,)
    assert lossy.flags == ("NOT LOSSLESS",)
    assert lossy.note == "NOT LOSSLESS: 2.50x faster than baseline but only 75.0% of outputs match at T=0"


def test_sampled_runs_are_not_flagged_when_outputs_differ():
    items = [Labeled("h1", "r", summary("baseline", 0.03, temperature=1.0)),
             Labeled("h1", "r", summary("dflash", 0.01, temperature=1.0, fidelity=0.0))]
    report = build_report(items)
    assert not any(r.lossy for r in report.rows) and rows_by(report)["h1", "gsm8k", 1.0, "dflash"].fidelity == 0.0


def test_with_two_runs_the_fastest_baseline_is_the_reference():
    items = [Labeled("h1", "sdpa", summary("baseline", 0.030)),
             Labeled("h1", "sdpa", summary("ddtree_tb32", 0.010)),
             Labeled("h1", "flash", summary("baseline", 0.025)),
             Labeled("h1", "flash", summary("dflash", 0.0125))]
    rows = {(r.run, r.method): r for r in build_report(items).rows}
    assert rows["sdpa", "ddtree_tb32"].speedup == pytest.approx(2.5)
    assert rows["sdpa", "baseline"].speedup == pytest.approx(0.025 / 0.030)
    assert rows["flash", "dflash"].speedup == pytest.approx(2.0)
    headers, _ = group_columns(aggregate(build_report(items), "run"))
    assert "Run" in headers  # two baselines on one host and dataset: --by run tells them apart


def test_a_vllm_mtp_run_sits_beside_ddtree_and_is_compared_with_vllms_own_baseline():
    base = summary("baseline", 0.010, engine="vllm", digests=("a", "b", "c", "d"), fidelity=1.0)
    mtp = summary("mtp", 0.004, tau=2.6, engine="vllm", digests=("a", "b", "x", "d"), fidelity=None)
    items = fleet()[:4] + [Labeled("h1", "vllm-base", base), Labeled("h1", "vllm-mtp", mtp)]
    rows = rows_by(build_report(items))
    row = rows["h1", "gsm8k", 0.0, "vllm:mtp"]
    assert row.speedup == pytest.approx(2.5)  # 10 ms / 4 ms, not against the HF baseline's 30 ms
    assert row.fidelity == 0.75 and row.lossy and row.acceptance_length == 2.6
    assert [r.method for r in build_report(items).rows][-2:] == ["vllm:baseline", "vllm:mtp"]


def test_a_vllm_method_without_a_vllm_baseline_has_no_speedup():
    items = fleet()[:1] + [Labeled("h1", "m", summary("mtp", 0.004, engine="vllm", fidelity=None))]
    row = rows_by(build_report(items))["h1", "gsm8k", 0.0, "vllm:mtp"]
    assert row.speedup is None and row.fidelity is None and not row.lossy


# --- formatters ---------------------------------------------------------------------------------------------------


def test_json_holds_every_row_with_flags_and_parses_back():
    doc = json.loads(to_json(build_report(fleet())))
    assert doc["faster_but_lossy"] == 1 and len(doc["rows"]) == 7
    lossy = [r for r in doc["rows"] if r["lossy"]]
    assert lossy[0]["flags"] == ["NOT LOSSLESS"] and lossy[0]["speedup"] == pytest.approx(2.5)
    assert doc["rows"][0]["acceptance_length"] is None


def test_csv_has_a_header_and_one_line_per_row_with_empty_unknowns():
    rows = list(csv.DictReader(io.StringIO(to_csv(build_report(fleet())))))
    assert len(rows) == 7
    assert rows[0]["method"] == "baseline" and rows[0]["acceptance_length"] == ""
    assert float(rows[3]["speedup"]) == pytest.approx(3.0) and rows[3]["flags"] == "best"
    assert rows[6]["flags"] == "NOT LOSSLESS" and rows[5]["flags"] == "best"


def test_table_columns_are_strings_and_omit_columns_that_do_not_vary():
    headers, cells = group_columns(aggregate(build_report(fleet()), "host"))
    assert headers == ["Host", "Dataset", "T", "Method", "tok/s", "Speedup", "τ", "TTFT", "n", "Resp", "Fidelity",
                       "Flags"]
    assert cells[3] == ["h1", "gsm8k", "0", "ddtree_tb64", "100.0", "3.00x", "6.00", "100.0 ms", "1", "4",
                        "100% (4/4)", "best"]
    assert cells[6][-2:] == ["75.0% (3/4)", "NOT LOSSLESS"]
    assert cells[0][6] == "—"  # no tau for the baseline
    assert all(isinstance(c, str) for row in cells for c in row)


def test_markdown_bolds_the_best_budget_and_flags_the_lossy_row_with_a_note():
    md = groups_markdown(aggregate(build_report(fleet()), "host"))
    lines = md.splitlines()
    assert lines[0].startswith("| Host | Dataset | T | Method |") and lines[1].startswith("|---|")
    assert "| **ddtree_tb64** | 100.0 | 3.00x |" in md
    assert "⚠ NOT LOSSLESS" in lines[8]
    assert lines[-1] == "- h2 Qwen3-8B gsm8k ddtree_tb64: NOT LOSSLESS: 2.50x faster than baseline but only 75.0% " \
                        "of outputs match at T=0"


def test_an_empty_report_formats_without_error():
    report = build_report([])
    assert report.rows == () and json.loads(to_json(report))["rows"] == []
    assert to_csv(report).startswith("host,run,") and groups_markdown(aggregate(report, "host")).count("\n") == 2


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from ddops.bench.plot import plot_report

    out = plot_report(build_report(fleet()), tmp_path / "out" / "report.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- end to end: .pt files from two hosts to report numbers ----------------------------------------------------------


def _ns(tpot, acc, new_tokens, torch):
    return SimpleNamespace(output_ids=torch.tensor([[1, 2] + new_tokens]), num_input_tokens=2,
                           num_output_tokens=len(new_tokens), time_to_first_token=0.05,
                           time_per_output_token=tpot, acceptance_lengths=acc, decode_rounds=len(acc),
                           stage_times={}, round_timestamps=[])


@pytest.mark.torch
def test_pt_files_from_two_hosts_become_the_report_computed_by_hand(tmp_path):
    torch = pytest.importorskip("torch")
    args = {"dataset": "gsm8k", "temperature": 0.0, "model_name_or_path": "m"}
    h1 = {"responses": [
        {"baseline": _ns(0.02, [1, 1], [7, 8], torch), "dflash": _ns(0.01, [2], [7, 8], torch),
         "ddtree_tb16": _ns(0.008, [2], [7, 8], torch), "ddtree_tb32": _ns(0.009, [2], [7, 8], torch)},
        {"baseline": _ns(0.04, [1], [9], torch), "dflash": _ns(0.02, [1], [9], torch),
         "ddtree_tb16": _ns(0.012, [1], [9], torch), "ddtree_tb32": _ns(0.011, [1], [9], torch)}],
        "args": args, "target_attn_implementation": "sdpa"}
    h2 = {"responses": [
        {"baseline": _ns(0.01, [1], [7], torch), "ddtree_tb16": _ns(0.004, [3], [7], torch)},
        {"baseline": _ns(0.01, [1], [7], torch), "ddtree_tb16": _ns(0.006, [3], [6], torch)}],
        "args": args, "target_attn_implementation": "sdpa"}
    items = []
    for host, data in (("h1", h1), ("h2", h2)):
        path = tmp_path / host / "gsm8k__t0.0__sdpa.pt"
        path.parent.mkdir()
        torch.save(data, path)
        items += [Labeled(host, path.stem, s) for s in summarize_file(path, "ddtree")]
    rows = rows_by(build_report(items))

    # h1: baseline mean tpot (0.02 + 0.04) / 2 = 0.03; tb16 (0.008 + 0.012) / 2 = 0.010; tb32 0.010 as well.
    assert rows["h1", "gsm8k", 0.0, "ddtree_tb16"].speedup == pytest.approx(3.0)
    assert rows["h1", "gsm8k", 0.0, "dflash"].speedup == pytest.approx(2.0)
    assert rows["h1", "gsm8k", 0.0, "dflash"].acceptance_length == pytest.approx(1.5)  # (mean[2] + mean[1]) / 2
    assert rows["h1", "gsm8k", 0.0, "ddtree_tb16"].fidelity == 1.0
    # h2: baseline 0.01; tb16 (0.004 + 0.006) / 2 = 0.005 -> 2x, but the second prompt's output differs.
    h2_tree = rows["h2", "gsm8k", 0.0, "ddtree_tb16"]
    assert h2_tree.speedup == pytest.approx(2.0) and h2_tree.tokens_per_s == pytest.approx(200.0)
    assert h2_tree.fidelity == 0.5 and h2_tree.lossy and not h2_tree.best_budget  # never best when NOT LOSSLESS
    assert h2_tree.acceptance_length == pytest.approx(3.0) and h2_tree.n_responses == 2
    assert "NOT LOSSLESS" in groups_markdown(aggregate(build_report(items), "host"))


def test_vllm_summaries_from_json_feed_the_report(tmp_path):
    base = {"completed": 2, "total_output_tokens": 100, "mean_tpot_ms": 10.0, "mean_ttft_ms": 50.0,
            "output_throughput": 90.0, "model_id": "m", "dataset": "gsm8k", "temperature": "0",
            "generated_texts": ["x", "y"]}
    mtp = dict(base, mean_tpot_ms=5.0, spec_decode_acceptance_length=2.0, method="mtp")
    items = [Labeled("h1", "b", s) for s in summarize_vllm(base, "b.json")]
    items += [Labeled("h1", "m", s) for s in summarize_vllm(mtp, "m.json")]
    rows = rows_by(build_report(items))
    assert rows["h1", "gsm8k", 0.0, "vllm:mtp"].speedup == pytest.approx(2.0)
    assert rows["h1", "gsm8k", 0.0, "vllm:mtp"].fidelity == 1.0


def test_sampled_runs_show_no_output_match_rate_in_the_table():
    from ddops.bench.report import GroupRow, _group_fidelity

    fields = {f: None for f in GroupRow.__dataclass_fields__}
    greedy = GroupRow(**{**fields, "method": "ddtree_tb4", "temperature": 0.0, "equal_responses": 1,
                         "compared_responses": 2})
    sampled = GroupRow(**{**fields, "method": "ddtree_tb4", "temperature": 1.0, "equal_responses": 0,
                          "compared_responses": 2})
    assert _group_fidelity(greedy) == "50.0% (1/2)"
    assert _group_fidelity(sampled) == "— (sampled)"


# --- different code is never pooled -----------------------------------------------------------------------------------

from ddops.bench.report import CodeId, pooling_note  # noqa: E402

PLAIN = CodeId("73068c9d16b7" + "0" * 28, (), (("torch", "2.13.0"), ("transformers", "5.23.0"), ("python", "3.11")))
VERIFIED = CodeId(PLAIN.commit, (("hybrid-tree-verify", "ab" * 32),), PLAIN.versions)


def two_runs(second=VERIFIED, incomplete=False):
    """The same host and methods, run once without hybrid-tree-verify and once with it."""
    items = []
    for run_id, code, fidelity in (("r1", PLAIN, 0.5), ("r2", second, 1.0)):
        for method, tpot in (("baseline", 0.03), ("ddtree_tb32", 0.01)):
            items.append(Labeled("h1", f"{run_id}:gsm8k", summary(method, tpot, fidelity=fidelity), code=code,
                                 run_id=run_id, incomplete=incomplete and run_id == "r2"))
    return items


@pytest.mark.parametrize("by", ["host", "method", "patchset"])
def test_runs_of_different_patch_sets_are_reported_side_by_side_never_pooled(by):
    report = build_report(two_runs())
    groups = [g for g in aggregate(report, by) if g.method == "ddtree_tb32"]
    assert [(g.code, g.runs, g.fidelity) for g in groups] == [(PLAIN, 1, 0.5), (VERIFIED, 1, 1.0)]
    headers, cells = group_columns(aggregate(report, by))
    labels = {row[headers.index("Code")] for row in cells}
    assert labels == {"73068c9 no patches", "73068c9 +hybrid-tree-verify"}
    assert pooling_note(report) == ("not pooled: these runs differ in patch set (73068c9 no patches; 73068c9 "
                                    "+hybrid-tree-verify): each code's rows are reported side by side")


def test_runs_that_differ_only_in_library_versions_are_not_pooled_and_the_versions_tell_them_apart():
    newer = CodeId(PLAIN.commit, (), (("torch", "2.14.0"), ("transformers", "5.23.0"), ("python", "3.11")))
    report = build_report(two_runs(second=newer))
    assert len([g for g in aggregate(report, "method") if g.method == "baseline"]) == 2
    assert "differ in library versions" in pooling_note(report)
    assert "73068c9 no patches (torch 2.14.0, transformers 5.23.0, python 3.11)" in pooling_note(report)


def test_repeats_of_the_same_code_are_pooled_and_no_note_is_given():
    report = build_report(two_runs(second=PLAIN))
    (tree,) = [g for g in aggregate(report, "method") if g.method == "ddtree_tb32"]
    assert tree.runs == 2 and pooling_note(report) is None
    assert "Code" not in group_columns(aggregate(report, "method"))[0]


def test_by_run_gives_each_run_its_own_rows():
    report = build_report(two_runs(second=PLAIN))
    groups = aggregate(report, "run")
    assert [(g.run_id, g.method, g.runs) for g in groups] == [
        ("r1", "baseline", 1), ("r1", "ddtree_tb32", 1), ("r2", "baseline", 1), ("r2", "ddtree_tb32", 1)]
    assert group_columns(groups)[0][:2] == ["Run", "Host"]


def test_a_run_collected_while_still_going_is_marked_incomplete():
    report = build_report(two_runs(second=PLAIN, incomplete=True))
    assert {r.run_id: "incomplete" in r.flags for r in report.rows} == {"r1": False, "r2": True}
    (tree,) = [g for g in aggregate(report, "method") if g.method == "ddtree_tb32"]
    assert "incomplete" in tree.flags


def test_the_best_budget_skips_a_faster_budget_that_is_not_lossless():
    items = [Labeled("h1", "r", summary("baseline", 0.03)), Labeled("h1", "r", summary("ddtree_tb32", 0.012)),
             Labeled("h1", "r", summary("ddtree_tb64", 0.010, fidelity=0.75))]
    report = build_report(items)
    assert {r.method: r.flags for r in report.rows if r.tree_budget} == {
        "ddtree_tb32": ("best",), "ddtree_tb64": ("NOT LOSSLESS",)}
    assert {g.method: g.flags for g in aggregate(report, "method") if g.tree_budget} == {
        "ddtree_tb32": ("best",), "ddtree_tb64": ("NOT LOSSLESS",)}


def _collected_run(root, run_id, *, patches, status="completed"):
    run = root / run_id
    (run / "h1").mkdir(parents=True)
    doc = {"responses": [{"baseline": {"time_per_output_token": 0.03, "output_ids": [1, 2]},
                          "ddtree_tb32": {"time_per_output_token": 0.01, "output_ids": [1, 2],
                                          "acceptance_lengths": [2]}}], "args": {"dataset": "gsm8k",
                                                                                  "temperature": 0.0}}
    import torch

    torch.save(doc, run / "h1" / "gsm8k.pt")
    entry = {"files": [{"path": "gsm8k.pt"}], "status": status, "repo_commit": PLAIN.commit, "torch": "2.13.0",
             "transformers": "5.23.0", "python": "3.11",
             "patches": [{"id": p, "sha256": "ab" * 32, "in_place": True} for p in patches]}
    (run / "manifest.json").write_text(json.dumps({"run_id": run_id, "summarizer": "ddtree", "hosts": {"h1": entry}}))


@pytest.mark.torch
def test_bench_report_of_two_runs_with_different_patches_says_so_and_shows_them_side_by_side(tmp_path):
    from tests.conftest import run_ddops

    pytest.importorskip("torch")
    _collected_run(tmp_path, "r1", patches=[])
    _collected_run(tmp_path, "r2", patches=["hybrid-tree-verify"], status="running")
    proc = run_ddops("bench", "report", "r1", "r2", "--by", "patchset", "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "not pooled: these runs differ in patch set" in proc.stderr
    assert "73068c9 no patches" in proc.stdout and "73068c9 +hybrid-tree-verify" in proc.stdout
    assert "incomplete" in proc.stdout
    doc = json.loads(run_ddops("bench", "report", "r1", "r2", "--format", "json", "--results-dir",
                               str(tmp_path)).stdout)
    assert doc["pooling"].startswith("not pooled") and len(doc["by_method"]) == 4


def test_the_plot_gives_each_code_its_own_bars():
    from ddops.bench.plot import plot_series

    series = plot_series(aggregate(build_report(two_runs()), "method"))
    assert set(series) == {"73068c9 no patches", "73068c9 +hybrid-tree-verify"}
    assert series["73068c9 +hybrid-tree-verify"]["ddtree_tb32"].code == VERIFIED
