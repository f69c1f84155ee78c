"""Through the CLI against testbed hosts: `bench report` names every host and run that produced nothing and why (a
host whose Python has no torch, a run that crashes), in the table's caption, on stderr and in --json, and a stopped
run's report says it was stopped."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import git_seed, requires_sshd, run_ddops, wait_until

pytestmark = [pytest.mark.sshd, requires_sshd]

NO_TORCH_PYTHON = "/usr/bin/python3"  # the system Python: no torch there

# What a plan's benchmark needs: torch, a result file. `crash` fails as a real run does; `hold` waits to be stopped.
STUB = '''import json, os, sys, time
mode, out = sys.argv[1], sys.argv[2]
import torch  # noqa: F401
if mode == "crash":
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
while mode == "hold":
    time.sleep(0.1)
with open(out, "w") as f:
    json.dump([{"method": "baseline", "tok_s": 10.0}, {"method": "fast", "tok_s": 15.0}], f)
'''
PLAN = '''name: gap-bench
summarizer: metrics
results: "*.json"
metrics: {method: method, tokens_per_s: tok_s}
vars: {mode: ok}
matrix:
  part: [a]
command: "{python} bench_stub.py {mode} {result_dir}/{part}.json"
'''


def have_python_without_torch() -> bool:
    try:
        return subprocess.run([NO_TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode != 0
    except OSError:
        return False


@pytest.fixture
def stub_bed(make_testbed, tmp_path):
    """make(n, host_lines={host: extra inventory keys}) -> a testbed whose repo holds the stub benchmark."""

    def make(count, host_keys=None):
        source = tmp_path / "stub-src"
        source.mkdir(exist_ok=True)
        (source / "bench_stub.py").write_text(STUB)
        bed = make_testbed(count, seed=git_seed(source, tmp_path / f"seed{count}"))
        lines = []
        for line in bed.inventory_path.read_text().splitlines():
            name = line.strip().split(":")[0]
            if line.rstrip().endswith("groups: [testbed]}") and name in (host_keys or {}):
                line = line.rstrip()[:-1] + ", " + host_keys[name] + "}"
            lines.append(line)
        bed.inventory_path.write_text("\n".join(lines) + "\n")
        return bed

    return make


def ddops(bed, results, *args, timeout=180):
    return run_ddops(*args, inventory=bed.inventory_path, env={"DDOPS_RESULTS_DIR": str(results)}, timeout=timeout)


@pytest.mark.skipif(not have_python_without_torch(), reason=f"needs {NO_TORCH_PYTHON} without torch")
def test_report_names_the_host_without_torch_and_the_crashed_run_everywhere(stub_bed, tmp_path):
    pytest.importorskip("torch")
    bed = stub_bed(3, {"host2": f"python: {NO_TORCH_PYTHON}", "host3": "vars: {mode: crash}"})
    plan = tmp_path / "gap-bench.yaml"
    plan.write_text(PLAN)
    results = tmp_path / "results"
    run_id = "20261130-0000-gaps"
    launched = ddops(bed, results, "bench", str(plan), "--all", "--follow", "--run-id", run_id)
    assert launched.returncode == 1, launched.stdout + launched.stderr  # two hosts failed
    assert ddops(bed, results, "bench", "collect", run_id).returncode == 1

    table = ddops(bed, results, "bench", "report", run_id, "--plot", str(tmp_path / "report.png"))
    assert table.returncode == 1, table.stdout + table.stderr
    said = ("2 of 3 hosts produced nothing: host2 (exit 1, ModuleNotFoundError: No module named 'torch'); "
            "host3 (exit 1, RuntimeError: CUDA error: an illegal memory access was encountered)")
    assert said in " ".join(table.stdout.split())  # the table's caption
    assert said in " ".join(table.stderr.split())
    assert "metrics:fast" in table.stdout and (tmp_path / "report.png").stat().st_size > 0

    proc = ddops(bed, results, "--json", "bench", "report", run_id)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and {r["host"] for r in doc["rows"]} == {"host1"}
    assert doc["problems"] == [
        "host2: produced nothing (exit 1, ModuleNotFoundError: No module named 'torch')",
        "host3: produced nothing (exit 1, RuntimeError: CUDA error: an illegal memory access was encountered)"]
    assert [(g["host"], g["nothing"]) for g in doc["gaps"]] == [("host2", True), ("host3", True)]


def test_the_report_of_a_stopped_run_says_it_was_stopped(stub_bed, tmp_path):
    pytest.importorskip("torch")
    bed = stub_bed(1)
    plan = tmp_path / "gap-bench.yaml"
    plan.write_text(PLAN.replace("vars: {mode: ok}\nmatrix:\n  part: [a]",
                                 "matrix:\n  step:\n    - {part: a, mode: ok}\n    - {part: b, mode: hold}"))
    results = tmp_path / "results"
    run_id = "20261130-0000-stop"
    assert ddops(bed, results, "bench", str(plan), "--all", "--run-id", run_id).returncode == 0

    def second_run_going():
        doc = json.loads(ddops(bed, results, "--json", "bench", "status", run_id).stdout)
        return [r["status"] for r in doc["hosts"][0]["data"]["run"]["runs"]] == ["ok", "running"]

    wait_until(second_run_going, timeout=120, interval=0.5)
    assert ddops(bed, results, "bench", "stop", run_id, "--yes").returncode == 0
    ddops(bed, results, "bench", "collect", run_id)
    proc = ddops(bed, results, "--json", "bench", "report", run_id)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and {r["method"] for r in doc["rows"]} == {"metrics:baseline", "metrics:fast"}
    assert "host1: the run was stopped (`bench stop`) after 1 of 2 runs" in doc["problems"]
    assert any(p.startswith("host1: run ") and p.endswith("stopped by `bench stop`") for p in doc["problems"])
    table = ddops(bed, results, "bench", "report", run_id)
    assert "the run was stopped (`bench stop`) after 1 of 2 runs" in " ".join(table.stdout.split())
