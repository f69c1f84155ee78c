"""DDTree beside vLLM in one report: per host, target, dataset and temperature, each engine's baseline and methods,
tok/s against the best chain method, and per-prompt paired statistics (median time ratio, fixed-seed bootstrap 95%
interval, exact sign test) as a verdict; engines never pooled. The vLLM side is read from the shape
`vllm bench serve --save-result --save-detailed --metadata ...` writes (vllm/benchmarks/serve.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from ddops.bench.compare import bootstrap_median_interval, engine_columns, pair, side_by_side, sign_test, verdicts
from ddops.bench.report import Labeled, aggregate, build_report, to_json
from ddops.bench.summarize_ddtree import summarize_ddtree
from ddops.bench.summarize_vllm import summarize_vllm
from ddops.bench.summary import ResultFileError


def vllm_result(method, tpots_s, *, ttft_s=0.05, inputs=None, outputs=None, errors=None, latencies=True,
                tau=2.5, dataset="gsm8k", temperature="0", texts=None, model="/root/ddtree/models/qwen3-attn"):
    """What `vllm bench serve --save-result --save-detailed --metadata dataset=.. temperature=.. method=..` writes:
    run settings, metadata keys at the top level, the metrics, and one item per request in prompt order."""
    n = len(tpots_s)
    outputs = outputs or [33] * n
    inputs = inputs or [20 + i for i in range(n)]
    errors = errors or [""] * n
    itls = [[t] * (o - 1) if not e else [] for t, o, e in zip(tpots_s, outputs, errors)]
    lat = [ttft_s + sum(i) if not e else 0.0 for i, e in zip(itls, errors)]
    doc = {
        "date": "20261130-120000", "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": model, "tokenizer_id": model, "num_prompts": n,
        "dataset": dataset, "temperature": temperature, "method": method,
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 1,
        "duration": sum(lat), "completed": sum(1 for e in errors if not e), "failed": sum(1 for e in errors if e),
        "total_input_tokens": sum(inputs), "total_output_tokens": sum(outputs), "request_throughput": 1.0,
        "request_goodput": None, "output_throughput": 100.0, "total_token_throughput": 150.0,
        "input_lens": inputs, "output_lens": outputs,
        "ttfts": [ttft_s if not e else 0.0 for e in errors], "itls": itls,
        "start_times": [float(i) for i in range(n)],
        "generated_texts": texts or [f"answer {i}" for i in range(n)], "errors": errors,
        "max_output_tokens_per_s": 120.0, "max_concurrent_requests": 1, "rtfx": 0.0,
        "mean_ttft_ms": ttft_s * 1000, "median_ttft_ms": ttft_s * 1000, "std_ttft_ms": 0.0, "p99_ttft_ms": 60.0,
        "mean_tpot_ms": 1000 * sum(tpots_s) / n, "median_tpot_ms": 10.0, "std_tpot_ms": 1.0, "p99_tpot_ms": 12.0,
        "mean_itl_ms": 10.0, "median_itl_ms": 10.0, "std_itl_ms": 1.0, "p99_itl_ms": 12.0,
    }
    if latencies:
        doc["latencies"] = lat
    if method != "baseline":
        doc.update({"spec_decode_acceptance_rate": 60.0, "spec_decode_acceptance_length": tau,
                    "spec_decode_num_drafts": 100, "spec_decode_draft_tokens": 300,
                    "spec_decode_accepted_tokens": 150, "spec_decode_per_position_acceptance_rates": [0.7, 0.5]})
    return doc


def ddtree_result(per_method_tpots, *, inputs=None, model="models/qwen3-attn", dataset="gsm8k", temperature=0.0):
    """benchmark.py's saved dict: responses[i][method] namespaces, args."""
    n = len(next(iter(per_method_tpots.values())))
    inputs = inputs or [20 + i for i in range(n)]
    responses = [{m: SimpleNamespace(time_per_output_token=tpots[i], time_to_first_token=0.04,
                                     num_input_tokens=inputs[i], num_output_tokens=32,
                                     output_ids=[[1] * inputs[i] + [7] * 32],
                                     acceptance_lengths=[3.0] if m != "baseline" else [])
                  for m, tpots in per_method_tpots.items()} for i in range(n)]
    return {"responses": responses, "args": {"dataset": dataset, "temperature": temperature,
                                             "model_name_or_path": model}}


def engines_report(ddtree_tree, vllm_chain, *, vllm_inputs=None, host="h1"):
    """One host: DDTree's baseline, dflash and tb8, and vLLM's baseline and mtp, over the same prompts."""
    n = len(ddtree_tree)
    dd = summarize_ddtree(ddtree_result({"baseline": [0.05] * n, "dflash": [0.03] * n, "ddtree_tb8": ddtree_tree}),
                          "dd.pt")
    vl = [*summarize_vllm(vllm_result("baseline", [0.02] * n, inputs=vllm_inputs), "base.json"),
          *summarize_vllm(vllm_result("mtp", vllm_chain, inputs=vllm_inputs), "mtp.json")]
    return build_report([Labeled(host, "r-dd", s, run_id="r-dd") for s in dd]
                        + [Labeled(host, "r-vllm", s, run_id="r-vllm") for s in vl])


# --- what the vLLM file says per prompt -----------------------------------------------------------------------------


def test_a_detailed_vllm_result_gives_each_prompts_time_per_output_token_after_the_first():
    (s,) = summarize_vllm(vllm_result("mtp", [0.010, 0.020], outputs=[33, 11]), "mtp.json")
    assert s.prompt_times == pytest.approx((0.010, 0.020))  # (latency - ttft) / (output tokens - 1), as vLLM's TPOT
    assert s.prompt_lengths == (20, 21)


def test_an_older_client_without_latencies_times_a_prompt_by_its_inter_token_latencies():
    (s,) = summarize_vllm(vllm_result("mtp", [0.010, 0.020], latencies=False), "mtp.json")
    assert s.prompt_times == pytest.approx((0.010, 0.020))


def test_a_failed_request_has_no_time_and_a_result_without_details_has_none_at_all():
    (s,) = summarize_vllm(vllm_result("mtp", [0.010, 0.020], errors=["", "ClientConnectorError"]), "mtp.json")
    assert s.prompt_times == (pytest.approx(0.010), None)
    plain = {k: v for k, v in vllm_result("mtp", [0.01]).items()
             if k not in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                          "generated_texts", "errors")}
    assert summarize_vllm(plain, "mtp.json")[0].prompt_times == ()


@pytest.mark.parametrize("key, value", [("itls", [[0.01]]), ("output_lens", [3, "x"]), ("ttfts", [0.1, -1.0]),
                                        ("latencies", [0.1, float("nan")])])
def test_malformed_per_request_lists_are_refused_naming_the_key(key, value):
    doc = vllm_result("mtp", [0.01, 0.02])
    doc[key] = value
    with pytest.raises(ResultFileError, match=key):
        summarize_vllm(doc, "mtp.json")


def test_a_ddtree_result_gives_each_prompts_time_and_input_length():
    (base, tree) = summarize_ddtree(ddtree_result({"baseline": [0.05, 0.06], "ddtree_tb8": [0.02, 0.01]}), "dd.pt")
    assert tree.prompt_times == (0.02, 0.01) and tree.prompt_lengths == (20, 21)
    assert base.prompt_times == (0.05, 0.06)


# --- the statistics -----------------------------------------------------------------------------------------------


def test_the_sign_test_is_the_exact_two_sided_binomial():
    assert sign_test(7, 1) == pytest.approx(2 * (1 + 8) / 2 ** 8)
    assert sign_test(41, 7) == pytest.approx(2 * sum(math.comb(48, i) for i in range(8)) / 2 ** 48)
    assert sign_test(4, 4) == 1.0 and sign_test(0, 0) == 1.0 and sign_test(0, 6) == pytest.approx(2 / 64)


def test_the_bootstrap_interval_is_reproducible_and_holds_the_median():
    values = [0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 0.75, 0.82, 0.88]
    low, high = bootstrap_median_interval(values)
    assert (low, high) == bootstrap_median_interval(values)  # a fixed seed: the same report every time
    assert min(values) <= low <= 0.86 <= high <= max(values)
    assert bootstrap_median_interval([0.5] * 5) == (0.5, 0.5)


# --- the side-by-side table ---------------------------------------------------------------------------------------


def test_each_engines_methods_sit_side_by_side_against_the_best_chain_never_pooled():
    report = engines_report([0.008] * 8, [0.010] * 8)
    (table,) = side_by_side(report)
    # the two engines name the target by different paths: it is one target
    assert (table.host, table.model, table.dataset, table.temperature) == ("h1", "qwen3-attn", "gsm8k", 0.0)
    assert table.engines == ("ddtree", "vllm")
    assert [r.group.method for r in table.rows] == ["baseline", "dflash", "ddtree_tb8", "vllm:baseline", "vllm:mtp"]
    assert table.best_chain == "vllm:mtp"  # 100 tok/s against DDTree's own dflash at 33
    by = {r.group.method: r for r in table.rows}
    assert by["ddtree_tb8"].vs_best_chain == pytest.approx(1.25) and by["dflash"].vs_best_chain == pytest.approx(0.3333,
                                                                                                             rel=1e-3)
    assert by["vllm:mtp"].best_chain and by["vllm:mtp"].paired is None
    # each engine's speedup is over its own baseline: DDTree's 0.05 s, vLLM's 0.02 s
    assert by["ddtree_tb8"].group.speedup.mean == pytest.approx(6.25)
    assert by["vllm:mtp"].group.speedup.mean == pytest.approx(2.0)
    assert {g.engine for g in aggregate(report, "method") if g.method.endswith("baseline")} == {"ddtree", "vllm"}


def test_a_tree_faster_on_most_prompts_gets_a_verdict_with_its_interval():
    tree = [0.008] * 41 + [0.012] * 7
    report = engines_report(tree, [0.010] * 48)
    (table,) = side_by_side(report)
    paired = {r.group.method: r.paired for r in table.rows}["ddtree_tb8"]
    assert (paired.prompts, paired.faster, paired.slower) == (48, 41, 7)
    assert paired.median_ratio == pytest.approx(0.8)
    assert paired.low == pytest.approx(0.8) and paired.high == pytest.approx(0.8)
    assert paired.verdict == "ddtree_tb8 faster than vllm:mtp on 41/48 prompts, p < 0.001"
    lines = verdicts([table])
    assert "h1 qwen3-attn gsm8k T=0: ddtree_tb8 faster than vllm:mtp on 41/48 prompts, p < 0.001; median time " \
           "ratio 0.80 (95% CI 0.80–0.80)" in lines
    headers, cells = engine_columns([table])
    assert headers[-2:] == ["vs best chain", "Paired (per prompt)"]
    assert {c[headers.index("Method")]: c[-1] for c in cells}["ddtree_tb8"] == "41/48 faster, p < 0.001"
    assert {c[headers.index("Method")]: c[-1] for c in cells}["vllm:mtp"] == "best chain"


def test_a_small_difference_is_no_difference_shown():
    report = engines_report([0.009, 0.011, 0.009, 0.011, 0.009, 0.011, 0.009, 0.009], [0.010] * 8)
    (table,) = side_by_side(report)
    paired = {r.group.method: r.paired for r in table.rows}["ddtree_tb8"]
    assert paired.verdict == "no difference shown (ddtree_tb8 faster on 5/8 prompts, p = 0.727)"


def test_a_chain_that_wins_is_named_as_the_faster_one():
    report = engines_report([0.012] * 10, [0.010] * 10)
    paired = {r.group.method: r.paired for r in side_by_side(report)[0].rows}["ddtree_tb8"]
    assert paired.verdict == "vllm:mtp faster than ddtree_tb8 on 10/10 prompts, p = 0.002"


def test_prompts_of_different_lengths_are_not_paired_and_say_why():
    report = engines_report([0.008] * 4, [0.010] * 4, vllm_inputs=[20, 21, 99, 23])
    row = {r.group.method: r for r in side_by_side(report)[0].rows}["ddtree_tb8"]
    assert row.paired is None
    assert row.unpaired == "not the same prompts: prompt 2 is 22 tokens for ddtree_tb8, 99 for vllm:mtp"
    assert row.vs_best_chain == pytest.approx(1.25)  # the throughput comparison still stands


def test_a_vllm_result_saved_without_details_cannot_be_paired_and_the_report_says_how_to_fix_it():
    dd = summarize_ddtree(ddtree_result({"baseline": [0.05] * 2, "ddtree_tb8": [0.008] * 2}), "dd.pt")
    plain = {k: v for k, v in vllm_result("mtp", [0.01] * 2).items() if k not in ("ttfts",)}
    report = build_report([Labeled("h1", "a", s) for s in dd]
                          + [Labeled("h1", "b", s) for s in summarize_vllm(plain, "mtp.json")])
    (table,) = side_by_side(report)
    assert {r.group.method: r.unpaired for r in table.rows}["ddtree_tb8"] == \
        "vllm:mtp has no per-prompt times (vLLM keeps them with --save-detailed)"
    assert any("no paired statistic" in line for line in verdicts([table]))


def test_a_lossy_chain_is_never_the_best_chain():
    dd = summarize_ddtree(ddtree_result({"baseline": [0.05] * 2, "ddtree_tb8": [0.02] * 2}), "dd.pt")
    fast = vllm_result("ngram", [0.001] * 2, texts=["x", "y"])
    report = build_report([Labeled("h1", "a", s) for s in dd] + [
        Labeled("h1", "b", s) for s in [*summarize_vllm(vllm_result("baseline", [0.02] * 2), "b.json"),
                                        *summarize_vllm(fast, "n.json"),
                                        *summarize_vllm(vllm_result("mtp", [0.01] * 2), "m.json")]])
    (table,) = side_by_side(report)
    assert {r.group.method: r.group.lossy for r in table.rows}["vllm:ngram"]
    assert table.best_chain == "vllm:mtp"


def test_hosts_targets_and_temperatures_each_get_their_own_comparison():
    items = []
    for host in ("h1", "h2"):
        for temperature in (0.0, 1.0):
            dd = summarize_ddtree(ddtree_result({"baseline": [0.05], "ddtree_tb8": [0.01]},
                                                temperature=temperature), "dd.pt")
            vl = summarize_vllm(vllm_result("mtp", [0.02], temperature=str(temperature)), "m.json")
            items += [Labeled(host, "r", s) for s in [*dd, *vl]]
    tables = side_by_side(build_report(items))
    assert [(t.host, t.temperature) for t in tables] == [("h1", 0.0), ("h1", 1.0), ("h2", 0.0), ("h2", 1.0)]


def test_pairing_needs_the_same_number_of_prompts():
    rows = {g.method: g for g in aggregate(engines_report([0.008] * 3, [0.01] * 3), "host")}
    fewer = replace(rows["vllm:mtp"], prompt_times=(0.01,), prompt_lengths=(20,))
    assert pair(rows["ddtree_tb8"], fewer) == "not the same prompts: ddtree_tb8 ran 3, vllm:mtp 1"


def test_json_holds_every_comparison_with_its_statistics():
    report = engines_report([0.008] * 41 + [0.012] * 7, [0.010] * 48)
    doc = [t.to_json() for t in side_by_side(report)]
    json.dumps(doc)  # plain JSON
    (table,) = doc
    assert table["best_chain"] == "vllm:mtp" and table["engines"] == ["ddtree", "vllm"]
    tree = next(r for r in table["rows"] if r["method"] == "ddtree_tb8")
    assert tree["paired"]["faster"] == 41 and tree["paired"]["ci95"] == [pytest.approx(0.8), pytest.approx(0.8)]
    assert tree["paired"]["verdict"].startswith("ddtree_tb8 faster than vllm:mtp")
    assert "prompt_times" not in json.loads(to_json(report))["rows"][0]  # per-prompt lists stay out of the rows


def test_repeats_of_the_same_prompts_are_paired_by_their_mean_time_per_prompt():
    dd = [summarize_ddtree(ddtree_result({"baseline": [0.05] * 2, "ddtree_tb8": t}), "dd.pt")
          for t in ([0.008, 0.012], [0.010, 0.008])]
    report = build_report([Labeled("h1", f"r{k}", s, run_id=f"r{k}") for k, run in enumerate(dd) for s in run])
    (tree,) = [g for g in aggregate(report, "host") if g.method == "ddtree_tb8"]
    assert tree.runs == 2 and tree.prompt_times == pytest.approx((0.009, 0.010))


# --- through the CLI ----------------------------------------------------------------------------------------------


def collected_engines(root, n=12):
    """results/<run>/ for a DDTree run (a .pt) and a vLLM run (one JSON per method) of one host, with manifests."""
    import torch

    tree = [0.008] * (n - 1) + [0.012]
    (root / "r-dd" / "h1").mkdir(parents=True)
    torch.save(ddtree_result({"baseline": [0.05] * n, "dflash": [0.03] * n, "ddtree_tb8": tree}),
               root / "r-dd" / "h1" / "gsm8k.pt")
    (root / "r-vllm" / "h1").mkdir(parents=True)
    for method, tpots in (("baseline", [0.02] * n), ("mtp", [0.010] * n)):
        (root / "r-vllm" / "h1" / f"{method}.json").write_text(json.dumps(vllm_result(method, tpots)))
    for run_id, summarizer, files in (("r-dd", "ddtree", ["gsm8k.pt"]), ("r-vllm", "vllm", ["baseline.json",
                                                                                          "mtp.json"])):
        entry = {"summarizer": summarizer, "status": "completed", "repo_commit": "73068c9d16b7", "files": [
            {"path": f} for f in files], "commands": [{"index": i, "label": f, "command": f"x {f}", "status": "ok"}
                                                      for i, f in enumerate(files)]}
        (root / run_id / "manifest.json").write_text(json.dumps({"run_id": run_id, "hosts": {"h1": entry}}))


@pytest.mark.torch
def test_bench_report_of_a_ddtree_and_a_vllm_run_shows_the_engines_side_by_side(tmp_path):
    pytest.importorskip("torch")
    from tests.conftest import run_ddops

    collected_engines(tmp_path)
    proc = run_ddops("bench", "report", "r-dd", "r-vllm", "--results-dir", str(tmp_path), "--plot",
                     str(tmp_path / "r.png"))
    assert proc.returncode == 0, proc.stderr
    assert "engines side by side" in proc.stdout and "vs best chain" in proc.stdout
    assert "h1 qwen3-attn gsm8k T=0: ddtree_tb8 faster than vllm:mtp on 11/12 prompts, p = 0.006; median time " \
           "ratio 0.80" in proc.stdout
    assert (tmp_path / "r.png").stat().st_size > 0
    doc = json.loads(run_ddops("--json", "bench", "report", "r-dd", "r-vllm", "--results-dir", str(tmp_path)).stdout)
    assert doc["views"] == ["engine"] and doc["title"] == "bench report r-dd, r-vllm: qwen3-attn, 73068c9 no patches"
    (table,) = doc["comparisons"]
    assert table["best_chain"] == "vllm:mtp" and len(doc["by_host"]) == 5
    by_host = run_ddops("bench", "report", "r-dd", "r-vllm", "--by", "host", "--results-dir", str(tmp_path))
    assert by_host.returncode == 0 and "vs best chain" not in by_host.stdout and "vllm:mtp" in by_host.stdout


def test_md_and_csv_carry_the_comparison_too():
    from ddops.bench.compare import engines_csv, engines_markdown

    tables = side_by_side(engines_report([0.008] * 41 + [0.012] * 7, [0.010] * 48))
    md = engines_markdown(tables)
    assert "| vs best chain | Paired (per prompt) |" in md and "| 41/48 faster, p < 0.001 |" in md
    assert "- h1 qwen3-attn gsm8k T=0: ddtree_tb8 faster than vllm:mtp on 41/48 prompts, p < 0.001" in md
    import csv
    import io

    lines = {r["method"]: r for r in csv.DictReader(io.StringIO(engines_csv(tables)))}
    tree = lines["ddtree_tb8"]
    assert (tree["engine"], tree["paired_against"], tree["faster"], tree["slower"]) == ("ddtree", "vllm:mtp", "41", "7")
    assert float(tree["vs_best_chain"]) == pytest.approx(1.1646, rel=1e-3) and float(tree["p_value"]) < 0.001
    assert lines["vllm:mtp"]["best_chain"] == "True" and lines["vllm:mtp"]["paired_prompts"] == ""
