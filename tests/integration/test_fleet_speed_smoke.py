"""The fleet-speed measurement still runs: 2 testbed hosts, 1 repeat, ddops rows only (the real run is not a test)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, requires_sshd

pytestmark = [pytest.mark.sshd, requires_sshd]


def test_fleet_speed_benchmark_runs_on_two_hosts_and_reports_round_trips(tmp_path):
    output = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "fleet-speed" / "run.py"), "--sizes", "2", "--repeats", "1",
         "--only", "ddops", "--no-scaling", "--no-startup", "--output", str(output),
         "--samples", str(tmp_path / "samples.json")],
        capture_output=True, text=True, timeout=280, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = output.read_text()
    assert "| ddops patch, first apply (plan cache warm) | **" in report
    raw = json.loads((tmp_path / "samples.json").read_text())["results"]
    round_trips = {key: sorted({r for s in runs["2"] for r in s["round_trips"]}) for key, runs in raw.items()}
    assert round_trips == {"ddops-cold": [2], "ddops": [2], "ddops-fresh": [2], "ddops-rerun": [1],
                           "ddops-rollback": [2], "ddops-check": [1]}
    assert all(s["ok"] for runs in raw.values() for s in runs["2"])
