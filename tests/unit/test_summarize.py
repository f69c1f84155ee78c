"""Summarizers: DDTree `.pt` dicts and vLLM result JSON into MethodSummary, with numbers checked by hand."""

from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

import pytest

from ddops.bench.results import summarize_file
from ddops.bench.summarize_ddtree import method_order, summarize_ddtree
from ddops.bench.summarize_vllm import summarize_vllm
from ddops.bench.summary import MethodSummary, ResultFileError

PROMPT = [101, 102, 103]


def gen(tpot, ttft, acc, new_tokens, tensor=None):
    """One method's response in the DDTree layout (output_ids = prompt + new tokens, shape [1, n])."""
    ids = [PROMPT + list(new_tokens)]
    return SimpleNamespace(
        output_ids=tensor(ids) if tensor else ids, num_input_tokens=len(PROMPT), num_output_tokens=len(new_tokens),
        time_to_first_token=ttft, time_per_output_token=tpot, acceptance_lengths=list(acc),
        decode_rounds=len(acc), stage_times={"draft": 0.0, "verify": 0.0, "commit": 0.0}, round_timestamps=[],
    )


def ddtree_run(tensor=None, temperature=0.0):
    """Two prompts; every number below is used by hand in the expectations."""
    return {
        "responses": [
            {
                "baseline": gen(0.020, 0.10, [1, 1, 1], [5, 6, 7], tensor),
                "dflash": gen(0.010, 0.12, [3, 5], [5, 6, 7], tensor),
                "ddtree_tb32": gen(0.008, 0.14, [4, 4], [5, 6, 7], tensor),
                "ddtree_tb64": gen(0.005, 0.16, [6, 2], [5, 6, 8], tensor),  # differs from baseline
            },
            {
                "baseline": gen(0.040, 0.30, [1, 1], [9, 9], tensor),
                "dflash": gen(0.020, 0.32, [4], [9, 9], tensor),
                "ddtree_tb32": gen(0.016, 0.34, [2, 6, 4], [9, 9], tensor),
                "ddtree_tb64": gen(0.015, 0.36, [5], [9, 9], tensor),
            },
        ],
        "block_size": 16,
        "target_attn_implementation": "sdpa",
        "draft_attn_implementation": "flash_attention_2",
        "args": {"dataset": "gsm8k", "temperature": temperature, "model_name_or_path": "Qwen/Qwen3-8B",
                 "tree_budget": "32,64"},
    }


def by_method(summaries: list[MethodSummary]) -> dict[str, MethodSummary]:
    return {s.method: s for s in summaries}


# --- DDTree -------------------------------------------------------------------------------------------------------


def test_ddtree_numbers_match_the_definitions_computed_by_hand():
    got = by_method(summarize_ddtree(ddtree_run(), "h1/gsm8k.pt"))
    assert list(got) == ["baseline", "dflash", "ddtree_tb32", "ddtree_tb64"]

    base = got["baseline"]
    assert base.n_responses == 2 and base.output_tokens == 5
    assert base.mean_tpot_s == pytest.approx(0.030)  # (0.020 + 0.040) / 2
    assert base.tokens_per_s == pytest.approx(1 / 0.030)
    assert base.mean_ttft_s == pytest.approx(0.20)
    assert base.acceptance_length is None and base.speedup == pytest.approx(1.0) and base.fidelity == 1.0

    dflash = got["dflash"]
    assert dflash.mean_tpot_s == pytest.approx(0.015)
    assert dflash.speedup == pytest.approx(0.030 / 0.015)  # 2.0
    assert dflash.acceptance_length == pytest.approx((4.0 + 4.0) / 2)  # mean([3,5]) = 4, mean([4]) = 4
    assert dflash.fidelity == 1.0 and dflash.tree_budget is None

    tb32 = got["ddtree_tb32"]
    assert tb32.mean_tpot_s == pytest.approx(0.012)
    assert tb32.tokens_per_s == pytest.approx(1 / 0.012)
    assert tb32.speedup == pytest.approx(2.5)
    assert tb32.acceptance_length == pytest.approx((4.0 + 4.0) / 2)  # mean([4,4]) = 4, mean([2,6,4]) = 4
    assert tb32.mean_ttft_s == pytest.approx(0.24) and tb32.tree_budget == 32

    tb64 = got["ddtree_tb64"]
    assert tb64.mean_tpot_s == pytest.approx(0.010) and tb64.speedup == pytest.approx(3.0)
    assert tb64.acceptance_length == pytest.approx((4.0 + 5.0) / 2)
    assert tb64.fidelity == 0.5  # prompt 0 generated [5, 6, 8] where the baseline generated [5, 6, 7]

    assert {(s.dataset, s.temperature, s.model, s.attn) for s in got.values()} == {
        ("gsm8k", 0.0, "Qwen/Qwen3-8B", "sdpa")}
    assert got["dflash"].output_digests == got["baseline"].output_digests
    assert got["ddtree_tb64"].output_digests[0] != got["baseline"].output_digests[0]


@pytest.mark.torch
def test_ddtree_summary_of_a_real_pt_file_with_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "gsm8k.pt"
    torch.save(ddtree_run(tensor=lambda ids: torch.tensor(ids, dtype=torch.long)), path)
    from_file = by_method(summarize_file(path, "ddtree"))
    from_lists = by_method(summarize_ddtree(ddtree_run(), str(path)))
    assert from_file == from_lists
    assert from_file["ddtree_tb64"].fidelity == 0.5 and from_file["ddtree_tb64"].speedup == pytest.approx(3.0)


def test_args_saved_as_a_namespace_are_read_too():
    data = ddtree_run()
    data["args"] = argparse.Namespace(**data["args"])
    assert summarize_ddtree(data, "x")[0].dataset == "gsm8k"


def test_a_response_without_output_ids_leaves_fidelity_unknown():
    data = ddtree_run()
    del data["responses"][1]["dflash"].output_ids
    got = by_method(summarize_ddtree(data, "x"))
    assert got["dflash"].fidelity is None and got["dflash"].output_digests == ()
    assert got["ddtree_tb64"].fidelity == 0.5


def test_without_a_baseline_there_is_no_speedup_and_no_fidelity():
    data = ddtree_run()
    for r in data["responses"]:
        del r["baseline"]
    got = by_method(summarize_ddtree(data, "x"))
    assert got["dflash"].speedup is None and got["dflash"].fidelity is None
    assert got["dflash"].tokens_per_s == pytest.approx(1 / 0.015)


def test_empty_acceptance_lists_are_left_out_of_tau():
    data = ddtree_run()
    data["responses"][1]["dflash"].acceptance_lengths = []
    assert by_method(summarize_ddtree(data, "x"))["dflash"].acceptance_length == pytest.approx(4.0)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("responses"), "no `responses` list"),
    (lambda d: d["responses"].append(["not", "a", "dict"]), r"responses\[2\] is list"),
    (lambda d: delattr(d["responses"][1]["dflash"], "time_per_output_token"), r"responses\[1\]\.dflash: no time_per"),
    (lambda d: setattr(d["responses"][0]["dflash"], "time_per_output_token", float("nan")), "finite"),
    (lambda d: setattr(d["responses"][0]["dflash"], "time_per_output_token", "fast"), "finite"),
    (lambda d: setattr(d["responses"][0]["dflash"], "acceptance_lengths", ["x"]), "acceptance_lengths"),
    (lambda d: setattr(d["responses"][0]["dflash"], "output_ids", [[1, "a"]]), "output_ids: not token ids"),
])
def test_malformed_ddtree_results_are_result_file_errors_naming_the_place(mutate, message):
    data = ddtree_run()
    mutate(data)
    with pytest.raises(ResultFileError, match=message):
        summarize_ddtree(data, "h1/run.pt")


def test_methods_are_ordered_baseline_dflash_then_budgets_ascending():
    names = ["ddtree_tb1024", "other", "ddtree_tb64", "dflash", "baseline", "ddtree_tb128"]
    assert sorted(names, key=method_order) == [
        "baseline", "dflash", "ddtree_tb64", "ddtree_tb128", "ddtree_tb1024", "other"]


# --- vLLM ---------------------------------------------------------------------------------------------------------

# The shape `vllm bench serve --save-result --metadata dataset=gsm8k temperature=0 method=mtp` writes.
VLLM_MTP = {
    "date": "20260101-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
    "model_id": "Qwen/Qwen3.5-27B", "tokenizer_id": "Qwen/Qwen3.5-27B", "num_prompts": 128,
    "dataset": "gsm8k", "temperature": "0", "method": "mtp",
    "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 1,
    "duration": 300.5, "completed": 128, "failed": 0, "total_input_tokens": 20000, "total_output_tokens": 65536,
    "request_throughput": 0.43, "request_goodput": None, "output_throughput": 218.1,
    "total_token_throughput": 284.6, "max_output_tokens_per_s": 240.0, "max_concurrent_requests": 1, "rtfx": 0.0,
    "mean_ttft_ms": 45.0, "median_ttft_ms": 44.0, "std_ttft_ms": 3.0, "p99_ttft_ms": 52.0,
    "mean_tpot_ms": 4.0, "median_tpot_ms": 4.1, "std_tpot_ms": 0.2, "p99_tpot_ms": 4.9,
    "mean_itl_ms": 9.5, "median_itl_ms": 9.0, "std_itl_ms": 1.0, "p99_itl_ms": 14.0,
    "spec_decode_acceptance_rate": 80.0, "spec_decode_acceptance_length": 2.6, "spec_decode_num_drafts": 25000,
    "spec_decode_draft_tokens": 50000, "spec_decode_accepted_tokens": 40000,
    "spec_decode_per_position_acceptance_rates": [0.9, 0.7],
}


def test_vllm_result_maps_onto_the_same_summary_shape():
    (s,) = summarize_vllm(VLLM_MTP, "h1/mtp.json")
    assert (s.engine, s.method, s.label) == ("vllm", "mtp", "vllm:mtp")
    assert s.n_responses == 128 and s.output_tokens == 65536 and s.failed == 0
    assert s.mean_tpot_s == pytest.approx(0.004) and s.tokens_per_s == pytest.approx(250.0)
    assert s.mean_ttft_s == pytest.approx(0.045)
    assert s.acceptance_length == pytest.approx(2.6)
    assert s.output_throughput == pytest.approx(218.1)
    assert (s.dataset, s.temperature, s.model) == ("gsm8k", 0.0, "Qwen/Qwen3.5-27B")
    assert s.speedup is None and s.fidelity is None  # across runs: the report's job


def test_a_vllm_run_without_speculation_is_the_baseline_and_hints_win():
    plain = {k: v for k, v in VLLM_MTP.items() if not k.startswith("spec_decode") and k not in ("method", "dataset")}
    plain["mean_tpot_ms"] = 10.0
    (s,) = summarize_vllm(plain, "h1/base.json", dataset="math500", temperature=1.0)
    assert s.method == "baseline" and s.acceptance_length is None and s.speedup == 1.0 and s.fidelity == 1.0
    assert (s.dataset, s.temperature, s.tokens_per_s) == ("math500", 1.0, pytest.approx(100.0))
    labeled = dict(VLLM_MTP, label="eagle3")
    del labeled["method"]
    assert summarize_vllm(labeled, "x")[0].method == "eagle3"
    assert summarize_vllm(VLLM_MTP, "x", method="mtp-k2")[0].method == "mtp-k2"


def test_vllm_detailed_results_carry_output_digests():
    detailed = dict(VLLM_MTP, generated_texts=["a", "b"], completed=2)
    assert len(summarize_vllm(detailed, "x")[0].output_digests) == 2


def test_vllm_json_file_with_nan_statistics_and_appended_results(tmp_path):
    path = tmp_path / "vllm.json"
    first = json.dumps(dict(VLLM_MTP, std_tpot_ms=float("nan")))
    second = json.dumps(dict(VLLM_MTP, mean_tpot_ms=5.0))
    path.write_text(first + "\n" + second)
    summaries = summarize_file(path, "vllm", dataset="gsm8k")
    assert [s.tokens_per_s for s in summaries] == [pytest.approx(250.0), pytest.approx(200.0)]
    path.write_text(json.dumps(dict(VLLM_MTP, mean_tpot_ms=float("nan"))))
    assert summarize_file(path, "vllm")[0].tokens_per_s is None


@pytest.mark.parametrize("data, message", [
    ({"hello": 1}, "not a `vllm bench serve` result"),
    (dict(VLLM_MTP, completed="many"), "completed: not a count"),
    (dict(VLLM_MTP, mean_tpot_ms=-1), "mean_tpot_ms: not a non-negative number"),
    (dict(VLLM_MTP, temperature="hot"), "temperature: 'hot' is not a number"),
    ([1], "not a JSON object"),
])
def test_malformed_vllm_results_are_result_file_errors(data, message):
    with pytest.raises(ResultFileError, match=message):
        summarize_vllm(data, "x.json")


def test_tokens_per_second_is_one_over_mean_time_per_output_token_not_mean_of_rates():
    data = ddtree_run()
    s = by_method(summarize_ddtree(data, "x"))["baseline"]
    assert s.tokens_per_s == pytest.approx(1 / 0.030)
    assert not math.isclose(s.tokens_per_s, (1 / 0.020 + 1 / 0.040) / 2)


# --- a team's own metrics file (summarizer: metrics) --------------------------------------------------------------


METRICS = {"records": "results", "method": "method", "tokens_per_s": "speed.tok_s", "ttft_s": "latency.ttft",
           "output": "text", "dataset": "dataset"}


def test_a_json_metrics_file_is_read_by_the_plans_key_paths_into_the_report(tmp_path):
    import json

    from ddops.bench.report import Labeled, build_report
    from ddops.bench.results import summarize_file

    doc = {"results": [
        {"method": "baseline", "dataset": "mine", "speed": {"tok_s": 50.0}, "latency": {"ttft": 0.2}, "text": "a b"},
        {"method": "baseline", "dataset": "mine", "speed": {"tok_s": 30.0}, "latency": {"ttft": 0.4}, "text": "c"},
        {"method": "fast", "dataset": "mine", "speed": {"tok_s": 100.0}, "latency": {"ttft": 0.1}, "text": "a b"},
        {"method": "fast", "dataset": "mine", "speed": {"tok_s": 60.0}, "latency": {"ttft": 0.1}, "text": "x"}]}
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(doc))
    summaries = {s.method: s for s in summarize_file(path, "metrics", metrics=METRICS)}
    assert summaries["baseline"].tokens_per_s == pytest.approx(40.0)
    assert summaries["baseline"].mean_ttft_s == pytest.approx(0.3) and summaries["fast"].n_responses == 2
    rows = {r.method: r for r in build_report(Labeled("h1", "r", s) for s in summaries.values()).rows}
    assert rows["metrics:fast"].speedup == pytest.approx(2.0)  # 1/40 s per token over 1/80
    assert rows["metrics:fast"].fidelity == 0.5 and rows["metrics:fast"].dataset == "mine"


def test_a_csv_metrics_file_reads_its_columns_by_name(tmp_path):
    from ddops.bench.results import summarize_file

    path = tmp_path / "m.csv"
    path.write_text("name,tpot (s),answer\nbaseline,0.02,yes\nbaseline,0.04,no\nspec,0.01,yes\n")
    got = {s.method: s for s in summarize_file(path, "metrics", metrics={"method": "name", "tpot_s": "tpot (s)",
                                                                          "output": "answer"})}
    assert got["baseline"].mean_tpot_s == pytest.approx(0.03) and got["spec"].tokens_per_s == pytest.approx(100.0)


@pytest.mark.parametrize("content, says", [
    ('{"results": [{"method": "b", "speed": {"tok_s": "fast"}}]}', "record 1: speed.tok_s (metrics.tokens_per_s) "
                                                                    "is not a plausible non-negative number"),
    ('{"results": [{"method": "b", "speed": {"tok_s": 1e308}}]}', "is not a plausible non-negative number"),
    ('{"other": []}', "document 1 has no list at 'results' (metrics.records)"),
    ('{"results": [{"speed": {"tok_s": 1}}]}', "record 1 has no 'method' (metrics.method)"),
    ("not json", "not JSON"),
])
def test_a_bad_metrics_file_is_a_one_line_refusal_naming_the_file(tmp_path, content, says):
    from ddops.bench.results import summarize_file
    from ddops.bench.summary import ResultFileError

    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(ResultFileError) as info:
        summarize_file(path, "metrics", metrics=METRICS)
    assert str(info.value).startswith(f"{path}: ") and says in str(info.value) and "\n" not in str(info.value)
