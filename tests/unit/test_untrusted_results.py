"""Result files come from remote hosts: reading one must never run code on the controller."""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddops.bench.results import load_result_json, load_result_pt, read_limited, summarize_file
from ddops.bench.summary import ResultFileError

REPO_ROOT = Path(__file__).resolve().parents[2]


class _System:
    """Unpickling this calls os.system(cmd)."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


class _Eval:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        return (eval, (self.code,))


class _Popen:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    def __reduce__(self):
        return (subprocess.Popen, (self.argv,))


def _payloads(marker: Path) -> dict[str, object]:
    return {
        "os.system": _System(f"touch {marker}"),
        "builtins.eval": _Eval(f"open({str(marker)!r}, 'w').close()"),
        "subprocess.Popen": _Popen(["touch", str(marker)]),
    }


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "subprocess.Popen"])
def test_a_pt_whose_pickle_would_run_code_is_refused_and_the_code_never_runs(tmp_path, kind):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "PWNED"
    evil = _payloads(marker)[kind]
    # Hidden where a real result keeps its data: inside a response's SimpleNamespace, which is allowed.
    data = {"responses": [{"baseline": SimpleNamespace(time_per_output_token=0.1, output_ids=evil)}], "args": {}}
    path = tmp_path / "evil.pt"
    torch.save(data, path)
    with pytest.raises(ResultFileError) as info:
        load_result_pt(path)
    assert str(info.value).startswith(f"{path}: refused: ")
    assert not marker.exists()
    with pytest.raises(ResultFileError):
        summarize_file(path, "ddtree")
    assert not marker.exists()


@pytest.mark.torch
def test_a_plain_pickle_renamed_to_pt_is_refused_too(tmp_path):
    pytest.importorskip("torch")
    marker = tmp_path / "PWNED"
    path = tmp_path / "legacy.pt"
    path.write_bytes(pickle.dumps({"responses": [_System(f"touch {marker}")]}, protocol=2))
    with pytest.raises(ResultFileError, match="refused"):
        load_result_pt(path)
    assert not marker.exists()


@pytest.mark.torch
def test_the_refusal_names_the_offending_global_in_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "evil.pt"
    torch.save({"x": _System("true")}, path)
    with pytest.raises(ResultFileError) as info:
        load_result_pt(path)
    msg = str(info.value)
    assert "\n" not in msg and "system" in msg and "weights_only" not in msg


@pytest.mark.torch
def test_files_over_the_size_limit_are_refused_before_unpickling(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "PWNED"
    path = tmp_path / "big.pt"
    torch.save({"pad": torch.zeros(4096), "x": _System(f"touch {marker}")}, path)
    with pytest.raises(ResultFileError, match=r"refused: larger than the 1024 bytes limit"):
        load_result_pt(path, max_bytes=1024)
    assert not marker.exists()


@pytest.mark.torch
def test_garbage_missing_and_non_dict_files_are_result_file_errors(tmp_path):
    torch = pytest.importorskip("torch")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a torch file")
    with pytest.raises(ResultFileError, match=f"{garbage}: refused: "):
        load_result_pt(garbage)
    with pytest.raises(ResultFileError, match="not a regular file"):
        load_result_pt(tmp_path / "absent.pt")
    with pytest.raises(ResultFileError, match="not a regular file"):
        load_result_pt(tmp_path)
    listing = tmp_path / "list.pt"
    torch.save([1, 2, 3], listing)
    with pytest.raises(ResultFileError, match="holds list, not a dict"):
        load_result_pt(listing)


@pytest.mark.torch
def test_the_ddtree_layout_loads_with_its_namespaces_and_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    response = SimpleNamespace(
        output_ids=torch.tensor([[1, 2, 3, 4]]), num_input_tokens=2, num_output_tokens=2, time_to_first_token=0.01,
        time_per_output_token=0.02, acceptance_lengths=[2, 1], decode_rounds=2,
        stage_times={"draft": 0.1, "verify": 0.2}, round_timestamps=[0.1, 0.2], round_trees=None)
    data = {"responses": [{"baseline": response}], "block_size": 16, "target_attn_implementation": "sdpa",
            "draft_attn_implementation": "flash_attention_2",
            "args": argparse.Namespace(dataset="gsm8k", temperature=0.0)}
    path = tmp_path / "run.pt"
    torch.save(data, path)
    loaded = load_result_pt(path)
    got = loaded["responses"][0]["baseline"]
    assert isinstance(got, SimpleNamespace) and got.output_ids.tolist() == [[1, 2, 3, 4]]
    assert loaded["args"].dataset == "gsm8k"


def test_json_results_are_size_limited_and_must_be_objects(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"completed": 1}\n{"completed": 2}\n')
    assert [d["completed"] for d in load_result_json(path)] == [1, 2]
    path.write_text("x" * 100)
    with pytest.raises(ResultFileError, match="larger than"):
        read_limited(path, max_bytes=10)
    with pytest.raises(ResultFileError, match="not JSON"):
        load_result_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ResultFileError, match="not a JSON object"):
        load_result_json(path)


def test_the_pure_bench_modules_do_not_import_torch_or_matplotlib():
    code = ("import sys, ddops.bench, ddops.bench.plan, ddops.bench.report, ddops.bench.results, "
            "ddops.bench.summarize_ddtree, ddops.bench.summarize_vllm, ddops.bench.plot; "
            "bad = [m for m in ('torch', 'matplotlib', 'rich') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr or result.stdout


def _response_with(**fields):
    return {"responses": [{"baseline": SimpleNamespace(time_per_output_token=0.1, **fields)}], "args": {}}


@pytest.mark.torch
@pytest.mark.parametrize("claimed", [10**8, 10**11])
def test_a_stride_zero_tensor_claiming_more_elements_than_its_storage_is_refused_at_once(tmp_path, claimed):
    torch = pytest.importorskip("torch")
    path = tmp_path / "bomb.pt"
    # One stored number seen through a stride-0 view: a 1-2 KB file that claims `claimed` token ids.
    torch.save(_response_with(output_ids=torch.zeros(1, dtype=torch.int64).expand(claimed)), path)
    assert path.stat().st_size < 4096
    started = time.monotonic()
    with pytest.raises(ResultFileError) as info:
        summarize_file(path, "ddtree")
    assert time.monotonic() - started < 5
    msg = str(info.value)
    assert msg.startswith(f"{path}: refused: ") and f"claims {claimed} elements over a storage of 1" in msg
    assert "\n" not in msg


@pytest.mark.torch
def test_overlapping_strides_that_multiply_a_small_storage_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "overlap.pt"
    view = torch.arange(2000, dtype=torch.int64).as_strided((1000, 1000), (1, 1))  # 1e6 elements over 2000
    torch.save(_response_with(output_ids=view), path)
    with pytest.raises(ResultFileError, match="over a storage of 2000"):
        load_result_pt(path)


@pytest.mark.torch
def test_lists_shared_through_pickle_memo_references_to_multiply_the_work_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    level0 = [1] * 100
    level1 = [level0] * 100  # the pickle stores level0 once and refers to it 100 times
    path = tmp_path / "laughs.pt"
    torch.save(_response_with(output_ids=[level1] * 100), path)  # a million token ids out of ~2 KB
    with pytest.raises(ResultFileError, match=r"refused: it reaches more items .* than its \d+ bytes hold"):
        summarize_file(path, "ddtree")


def test_a_deeply_nested_vllm_json_is_a_one_line_result_file_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"completed": 1, "mean_tpot_ms": 2.0, "extra": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ResultFileError) as info:
        summarize_file(path, "vllm")
    assert str(info.value) == f"{path}: refused: nested too deeply to read"


def test_running_out_of_memory_while_summarizing_is_the_files_result_file_error(tmp_path, monkeypatch):
    import ddops.bench.results as results

    def exhausted(doc, source, **hints):
        raise MemoryError()

    monkeypatch.setattr(results, "summarize_vllm", exhausted)
    path = tmp_path / "r.json"
    path.write_text('{"completed": 1, "mean_tpot_ms": 2.0}')
    with pytest.raises(ResultFileError) as info:
        summarize_file(path, "vllm")
    assert str(info.value) == f"{path}: refused: reading it ran out of memory"


def _deflated_storage_bomb(torch, path: Path, inflated: int) -> None:
    """A genuine torch.save archive whose one storage entry is replaced by `inflated` deflated zero bytes."""
    import zipfile

    genuine = path.with_suffix(".genuine")
    torch.save(_response_with(output_ids=torch.zeros(1, dtype=torch.int64)), genuine)
    chunk = bytes(1 << 24)
    with zipfile.ZipFile(genuine) as src, zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED,
                                                           compresslevel=1) as dst:
        for info in src.infolist():
            if "/data/" in info.filename:
                with dst.open(info.filename, "w", force_zip64=True) as out:
                    for _ in range(inflated // len(chunk)):
                        out.write(chunk)
            else:
                dst.writestr(info.filename, src.read(info))


@pytest.mark.torch
def test_a_deflated_storage_that_would_inflate_past_the_budget_is_refused_from_the_archive_directory(
        tmp_path, monkeypatch):
    import resource

    torch = pytest.importorskip("torch")
    path = tmp_path / "inflate.pt"
    _deflated_storage_bomb(torch, path, 1 << 30)
    assert path.stat().st_size < 8 * 1024**2
    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or {})
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with pytest.raises(ResultFileError) as info:
        summarize_file(path, "ddtree")
    msg = str(info.value)
    assert msg.startswith(f"{path}: refused: its archive declares 1 GiB inflated") and "\n" not in msg
    assert loads == []  # refused before torch (which allocates what each entry declares) saw the file
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 256 * 1024


@pytest.mark.torch
def test_a_genuine_torch_save_archive_passes_the_archive_check(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "ok.pt"
    torch.save(_response_with(output_ids=torch.arange(4096, dtype=torch.int64)), path)
    assert summarize_file(path, "ddtree")[0].n_responses == 1


@pytest.mark.torch
def test_numbers_too_large_to_average_refuse_that_hosts_file_and_the_other_hosts_rows_stay(tmp_path):
    import json

    from ddops.bench.collect import load_collected

    torch = pytest.importorskip("torch")
    run = tmp_path / "r1"
    tpots = {"h1": [1e308, 1e308], "h2": [0.01, 0.02]}
    for host, values in tpots.items():
        (run / host).mkdir(parents=True)
        torch.save({"responses": [{"baseline": SimpleNamespace(time_per_output_token=v)} for v in values],
                    "args": {"dataset": "gsm8k"}}, run / host / "gsm8k.pt")
    (run / "manifest.json").write_text(json.dumps({"run_id": "r1", "summarizer": "ddtree", "hosts": {
        host: {"files": [{"path": "gsm8k.pt"}]} for host in tpots}}))
    collected = load_collected(tmp_path, ["r1"])
    assert [i.host for i in collected.items] == ["h2"]
    assert collected.problems == (f"h1: {run / 'h1' / 'gsm8k.pt'}: refused: its numbers are too large to average",)
    assert [g.line for g in collected.gaps] == ["h1: produced nothing (1 result file could not be read)"]
