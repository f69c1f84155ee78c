"""Fidelity, measured from hand-made result files: a method whose greedy output differs from the baseline's is caught
and flagged NOT LOSSLESS with the first differing token as the example; a lossless one is not flagged. And the
aggregated report: one row per host over repeats, one per method over hosts, each number with its spread and n."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ddops.bench.report import Labeled, Spread, aggregate, build_report, group_columns, groups_markdown, to_json
from ddops.bench.results import summarize_file
from ddops.bench.summarize_ddtree import summarize_ddtree
from ddops.bench.summary import Divergence

PROMPT = [257, 10, 11, 12]  # four prompt tokens: generated position 0 is index 4


def response(tokens, tpot=0.01, acc=None, ttft=0.05):
    acc = acc if acc is not None else [1] * len(tokens)
    return SimpleNamespace(output_ids=[PROMPT + list(tokens)], num_input_tokens=len(PROMPT),
                           num_output_tokens=len(tokens), time_to_first_token=ttft, time_per_output_token=tpot,
                           acceptance_lengths=acc, decode_rounds=len(acc), stage_times={}, round_timestamps=[])


def result_file(model="models/qwen3.5-hybrid", *, tree_tokens=None, scale=1.0):
    """Three greedy prompts; dflash reproduces the baseline, ddtree_tb8 changes the second prompt from token 2 on."""
    base = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9]]
    tree = tree_tokens or [[1, 2, 3, 4], [5, 6, 70, 80], [9, 9, 9]]
    return {
        "responses": [
            {"baseline": response(b, 0.02 * scale),
             "dflash": response(b, 0.01 * scale, acc=[2, 2]),
             "ddtree_tb8": response(t, 0.005 * scale, acc=[4] if len(t) == 4 else [3])}
            for b, t in zip(base, tree)
        ],
        "args": {"dataset": "mini", "temperature": 0.0, "model_name_or_path": model},
        "target_attn_implementation": "sdpa",
    }


def by_method(summaries):
    return {s.method: s for s in summaries}


def test_a_method_whose_greedy_output_differs_is_caught_with_where_it_first_differs():
    s = by_method(summarize_ddtree(result_file(), "h1/mini.pt"))
    assert s["ddtree_tb8"].fidelity == pytest.approx(2 / 3)
    assert s["ddtree_tb8"].first_difference == Divergence(response=1, position=2, baseline_token=7, method_token=70)
    assert s["dflash"].fidelity == 1.0 and s["dflash"].first_difference is None
    assert s["baseline"].fidelity == 1.0 and s["baseline"].first_difference is None


def test_an_output_that_stops_early_differs_where_it_ends():
    data = result_file(tree_tokens=[[1, 2, 3, 4], [5, 6, 7, 8], [9]])
    d = by_method(summarize_ddtree(data, "x.pt"))["ddtree_tb8"].first_difference
    assert d == Divergence(response=2, position=1, baseline_token=9, method_token=None)


def test_the_report_flags_the_lossy_method_not_lossless_and_names_the_example():
    items = [Labeled("h1", "r", s) for s in summarize_ddtree(result_file(), "h1/mini.pt")]
    report = build_report(items)
    rows = {r.method: r for r in report.rows}
    assert [r.method for r in report.rows if r.lossy] == ["ddtree_tb8"]
    assert rows["ddtree_tb8"].flags == ("NOT LOSSLESS",)
    assert rows["ddtree_tb8"].note == (
        "NOT LOSSLESS: 4.00x faster than baseline but only 66.7% of outputs match at T=0; "
        "response 1 first differs at generated token 2 (baseline 7, this method 70)")
    assert rows["dflash"].flags == () and rows["dflash"].note == ""


def test_json_carries_the_flag_and_the_example_for_rows_and_aggregates():
    items = [Labeled("h1", "r", s) for s in summarize_ddtree(result_file(), "h1/mini.pt")]
    doc = json.loads(to_json(build_report(items)))
    (lossy,) = [r for r in doc["rows"] if r["lossy"]]
    assert lossy["method"] == "ddtree_tb8" and "NOT LOSSLESS" in lossy["flags"]
    assert lossy["divergence"] == {"response": 1, "position": 2, "baseline_token": 7, "method_token": 70}
    (agg,) = [g for g in doc["by_method"] if g["lossy"]]
    assert agg["fidelity"] == pytest.approx(2 / 3) and agg["equal_responses"] == 2 and agg["compared_responses"] == 3
    assert doc["not_lossless"] == [
        "models/qwen3.5-hybrid mini ddtree_tb8: " + agg["note"]]
    assert not [g for g in doc["by_method"] if g["method"] == "dflash" and g["lossy"]]


def test_a_pure_attention_target_whose_methods_all_match_is_not_flagged(tmp_path):
    torch = pytest.importorskip("torch")
    same = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9]]
    data = result_file("models/qwen3-attn", tree_tokens=same)
    for r in data["responses"]:
        for ns in r.values():
            ns.output_ids = torch.tensor(ns.output_ids)
    path = tmp_path / "mini__qwen3-attn.pt"
    torch.save(data, path)
    report = build_report(Labeled("h1", "r", s) for s in summarize_file(path, "ddtree"))
    assert not any(r.lossy for r in report.rows)
    assert all(g.fidelity == 1.0 and not g.lossy for g in aggregate(report, "method"))
    assert "NOT LOSSLESS" not in groups_markdown(aggregate(report, "method"))


def fleet():
    """Two hosts, h1 run twice (repeats); h2 twice as slow; both targets."""
    items = []
    for host, run, scale in (("h1", "r1", 1.0), ("h1", "r2", 1.25), ("h2", "r1", 2.0)):
        for model in ("models/qwen3.5-hybrid", "models/qwen3-attn"):
            same = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9]] if model.endswith("attn") else None
            summaries = summarize_ddtree(result_file(model, tree_tokens=same, scale=scale), f"{host}/{run}.pt")
            items += [Labeled(host, run, s) for s in summaries]
    return build_report(items)


def test_per_host_rows_aggregate_repeats_with_their_spread():
    groups = {(g.host, g.model, g.method): g for g in aggregate(fleet(), "host")}
    h1 = groups["h1", "models/qwen3-attn", "baseline"]
    assert h1.runs == 2 and h1.n_responses == 6
    spread = h1.tokens_per_s  # 1/0.02 and 1/0.025 tokens/s
    assert (spread.mean, spread.std, spread.low, spread.high, spread.n) == pytest.approx((45.0, 5.0, 40.0, 50.0, 2))
    # Speedup is each run's over its host's fastest baseline (h1's 0.02): 0.02/0.005 = 4 and 0.02/0.00625 = 3.2.
    assert groups["h1", "models/qwen3-attn", "ddtree_tb8"].speedup.low == pytest.approx(3.2)
    assert groups["h1", "models/qwen3-attn", "ddtree_tb8"].speedup.high == pytest.approx(4.0)
    assert groups["h2", "models/qwen3-attn", "ddtree_tb8"].speedup == Spread(4.0, 0.0, 4.0, 4.0, 1)


def test_one_row_per_method_and_target_across_hosts_and_repeats():
    groups = aggregate(fleet(), "method")
    assert [(g.model.rsplit("/", 1)[-1], g.method) for g in groups] == [
        ("qwen3.5-hybrid", "baseline"), ("qwen3.5-hybrid", "dflash"), ("qwen3.5-hybrid", "ddtree_tb8"),
        ("qwen3-attn", "baseline"), ("qwen3-attn", "dflash"), ("qwen3-attn", "ddtree_tb8")]
    tree = {g.model: g for g in groups if g.method == "ddtree_tb8"}
    hybrid, attn = tree["models/qwen3.5-hybrid"], tree["models/qwen3-attn"]
    assert hybrid.runs == 3 and hybrid.hosts == ("h1", "h2") and hybrid.n_responses == 9
    assert (hybrid.equal_responses, hybrid.compared_responses) == (6, 9) and hybrid.lossy
    assert hybrid.divergence == ("h1", Divergence(1, 2, 7, 70)) and hybrid.note.endswith("on h1")
    assert attn.fidelity == 1.0 and not attn.lossy
    # Every run: (mean[4] + mean[4] + mean[3]) / 3 responses; the same in all three runs, so no spread.
    tau = attn.acceptance_length
    assert tau.mean == pytest.approx(11 / 3) and tau.std == 0 and tau.n == 3


def test_aggregated_cells_show_mean_and_std_and_the_number_of_runs():
    headers, cells = group_columns(aggregate(fleet(), "method"))
    assert headers == ["Hosts", "Model", "Dataset", "T", "Method", "tok/s", "Speedup", "τ", "TTFT", "n", "Resp",
                       "Fidelity", "Flags"]
    row = dict(zip(headers, cells[2]))
    assert row["Model"] == "qwen3.5-hybrid" and row["Method"] == "ddtree_tb8" and row["Hosts"] == "2"
    assert row["Speedup"] == "3.73 ± 0.38x" and row["n"] == "3" and row["Resp"] == "9"
    assert row["Fidelity"] == "66.7% (6/9)" and row["Flags"] == "NOT LOSSLESS"
    assert dict(zip(headers, cells[5]))["Fidelity"] == "100% (9/9)"


def test_plot_draws_speedup_and_tau_with_error_bars(tmp_path):
    pytest.importorskip("matplotlib")
    from ddops.bench.plot import plot_report

    out = plot_report(fleet(), tmp_path / "report.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
