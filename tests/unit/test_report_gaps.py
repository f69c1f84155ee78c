"""`bench report` is never silent about what produced nothing: every host and run of the manifest that gave no
result is named with why (exit code, the log's last error line, Slurm's state), a stopped run says it was stopped, and
hosts launched but never collected are named; in one caption (table, stderr, plot) and in --json's problems and gaps.
The CLI side runs against testbed hosts in tests/integration/test_report_gaps.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddops.bench.collect import error_line, load_collected
from ddops.bench.report import CodeId, build_report, code_label, report_title
from tests.conftest import run_ddops

TORCH_MISSING = """Traceback (most recent call last):
  File "/root/ddtree/bench_stub.py", line 3, in <module>
    import torch
ModuleNotFoundError: No module named 'torch'
"""
TORCHRUN_CRASH = """[rank0]: Traceback (most recent call last):
  File "benchmark.py", line 120, in <module>
RuntimeError: CUDA error: an illegal memory access was encountered
E1130 12:00:01 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
benchmark.py FAILED
"""
METRICS = {"method": "method", "tokens_per_s": "tok_s"}


def command(index, label, status="ok", exit_code=0, **extra):
    return {"index": index, "label": label, "command": f"run {label}.json", "status": status,
            "exit_code": exit_code, **extra}


def host_entry(commands, *, files=(), status="completed", failures=None, **extra):
    return {"summarizer": "metrics", "metrics": METRICS, "results": "*.json", "status": status,
            "repo_commit": "73068c9d16b7" + "0" * 28, "commands": commands, "failures": failures or {},
            "files": [{"path": f} for f in files], **extra}


def collected_run(root: Path, run_id: str, hosts: dict, launched: list[str] | None = None) -> None:
    run = root / run_id
    for host, entry in hosts.items():
        (run / host).mkdir(parents=True)
        for f in entry["files"]:
            (run / host / f["path"]).write_text(json.dumps([{"method": "baseline", "tok_s": 10.0},
                                                            {"method": "fast", "tok_s": 15.0}]))
    (run / "manifest.json").write_text(json.dumps({"run_id": run_id, "summarizer": "metrics", "hosts": hosts}))
    if launched is not None:
        (run / "launch.json").write_text(json.dumps({"run_id": run_id, "hosts": launched}))


def three_hosts(root: Path) -> None:
    collected_run(root, "r1", {
        "host1": host_entry([command(0, "a")], files=["a.json"]),
        "host2": host_entry([command(0, "a", "failed", 1)], status="failed", failures={"0": TORCH_MISSING}),
        "host3": host_entry([command(0, "a", "failed", 1)], status="failed", failures={"0": TORCHRUN_CRASH}),
    })


def test_hosts_that_produced_nothing_are_named_with_their_exit_code_and_error(tmp_path):
    three_hosts(tmp_path)
    collected = load_collected(tmp_path, ["r1"])
    assert {i.host for i in collected.items} == {"host1"}
    assert collected.caption == (
        "2 of 3 hosts produced nothing: host2 (exit 1, ModuleNotFoundError: No module named 'torch'); "
        "host3 (exit 1, RuntimeError: CUDA error: an illegal memory access was encountered)")
    assert [g.to_json() for g in collected.gaps] == [
        {"run_id": "r1", "host": "host2", "run": None, "nothing": True,
         "reason": "exit 1, ModuleNotFoundError: No module named 'torch'"},
        {"run_id": "r1", "host": "host3", "run": None, "nothing": True,
         "reason": "exit 1, RuntimeError: CUDA error: an illegal memory access was encountered"}]


def test_a_run_that_failed_on_a_host_that_gave_other_results_is_named_by_its_label(tmp_path):
    collected_run(tmp_path, "r1", {"host1": host_entry(
        [command(0, "a"), command(1, "b", "failed", 137, signal=9), command(2, "c", "timeout", None, seconds=3600.0)],
        files=["a.json"], status="failed")})
    assert [g.line for g in load_collected(tmp_path, ["r1"]).gaps] == [
        "host1: run b: killed by signal 9", "host1: run c: timed out after 3600 s"]


def test_a_stopped_run_says_it_was_stopped_and_what_never_started(tmp_path):
    collected_run(tmp_path, "r1", {"host1": host_entry(
        [command(0, "a"), command(1, "b", "stopped", None), command(2, "c", "pending", None)],
        files=["a.json"], status="stopped")})
    assert load_collected(tmp_path, ["r1"]).caption == (
        "host1: run b: stopped by `bench stop`; host1: run c: never started (the run stopped); "
        "host1: the run was stopped (`bench stop`) after 1 of 3 runs")


def test_a_run_still_going_names_only_what_already_failed(tmp_path):
    collected_run(tmp_path, "r1", {"host1": host_entry(
        [command(0, "a", "failed", 2), command(1, "b", "running", None), command(2, "c", "pending", None)],
        status="running")})
    assert [g.line for g in load_collected(tmp_path, ["r1"]).gaps] == ["host1: run a: exit 2"]


def test_hosts_launched_but_never_collected_and_runs_without_a_result_file_are_named(tmp_path):
    collected_run(tmp_path, "r1", {"host1": host_entry([command(0, "a")])}, launched=["host1", "host2"])
    assert load_collected(tmp_path, ["r1"]).caption == (
        "2 of 2 hosts produced nothing: host1 (its runs ended without a result file matching `*.json`); "
        "host2 (launched, but not collected: run `ddops bench collect r1`)")


def test_with_several_runs_each_runs_gaps_are_told_apart(tmp_path):
    three_hosts(tmp_path)
    collected_run(tmp_path, "r2", {"host1": host_entry([command(0, "a")], files=["a.json"])})
    assert load_collected(tmp_path, ["r1", "r2"]).caption.startswith("run r1: 2 of 3 hosts produced nothing: host2")


def test_the_error_line_skips_the_launchers_wrapper_and_is_cut_to_one_line():
    assert error_line(TORCHRUN_CRASH) == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert error_line("sh: 1: torchrun: not found\n") == "sh: 1: torchrun: not found"
    assert error_line("all fine\n") is None
    assert len(error_line("ValueError: " + "x" * 500)) == 160


def test_the_code_label_lists_playbooks_not_patch_ids():
    entry = {"repo_commit": "73068c9d16b7", "patches": [
        {"id": p, "sha256": "ab" * 32} for p in ("gdn-route", "tree-helpers", "tree-verify", "hybrid-cache")]}
    playbooks = {"gdn-route": "hybrid-tree-verify", "tree-helpers": "hybrid-tree-verify",
                 "tree-verify": "hybrid-tree-verify", "hybrid-cache": "hybrid-cache"}
    assert CodeId.from_manifest(entry, playbooks).label == "73068c9 +hybrid-cache +hybrid-tree-verify"
    assert CodeId.from_manifest(entry).label == "73068c9 +gdn-route +hybrid-cache +tree-helpers +tree-verify"
    # two codes with one playbook's patches in part: the patch ids tell them apart
    part = CodeId.from_manifest({**entry, "patches": entry["patches"][:1]}, playbooks)
    whole = CodeId.from_manifest({**entry, "patches": entry["patches"][:3]}, playbooks)
    assert code_label(part, [part, whole]) == "73068c9 +hybrid-tree-verify (patches gdn-route)"


def test_the_report_finds_the_playbooks_of_the_patches_it_reads(tmp_path):
    collected_run(tmp_path, "r1", {"host1": host_entry([command(0, "a")], files=["a.json"], patches=[
        {"id": "crop-helper", "sha256": "ab" * 32}, {"id": "crop-relative", "sha256": "cd" * 32},
        {"id": "hybrid-cache", "sha256": "ef" * 32}])})
    (item, *_) = load_collected(tmp_path, ["r1"]).items
    assert item.code.label == "73068c9 +crop-relative +hybrid-cache"  # built-in playbooks of those ids


def test_titles_name_the_runs_the_target_and_the_code(tmp_path):
    collected_run(tmp_path, "r1", {"host1": host_entry([command(0, "a")], files=["a.json"])})
    report = build_report(load_collected(tmp_path, ["r1"]).items)
    assert report_title(report.rows, ["r1"]) == "bench report r1: 73068c9 no patches"


@pytest.mark.parametrize("as_json", [False, True])
def test_bench_report_names_what_produced_nothing_in_the_caption_stderr_and_json(tmp_path, as_json):
    three_hosts(tmp_path)
    args = ["bench", "report", "r1", "--results-dir", str(tmp_path)]
    proc = run_ddops(*(["--json"] if as_json else []), *args)
    assert proc.returncode == 1
    said = "2 of 3 hosts produced nothing: host2 (exit 1, ModuleNotFoundError: No module named 'torch')"
    assert said in proc.stderr
    if as_json:
        doc = json.loads(proc.stdout)
        assert "host2: produced nothing (exit 1, ModuleNotFoundError: No module named 'torch')" in doc["problems"]
        assert [g["host"] for g in doc["gaps"]] == ["host2", "host3"]
    else:
        assert said in " ".join(proc.stdout.split())  # the table's caption


def test_the_plot_caption_names_what_produced_nothing(tmp_path):
    from ddops.bench.plot import plot_notes, plot_report
    from ddops.bench.report import aggregate

    three_hosts(tmp_path)
    collected = load_collected(tmp_path, ["r1"])
    report = build_report(collected.items)
    notes = " ".join(plot_notes(aggregate(report, "method"), False, collected.caption))
    assert "2 of 3 hosts produced nothing: host2 (exit 1, ModuleNotFoundError: No module named 'torch')" in notes
    pytest.importorskip("matplotlib")
    out = plot_report(report, tmp_path / "r.png", title=report_title(report.rows, ["r1"]), caption=collected.caption)
    assert out.stat().st_size > 0
