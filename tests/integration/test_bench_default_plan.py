"""`ddops bench --all` with no plan named runs the inventory's `bench:` plan; with none named it launches nothing
and lists the plans (it used to launch the 40-run paper benchmark on every host)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]


def test_bench_with_no_plan_and_no_default_launches_nothing_and_lists_the_plans(make_testbed, tmp_path):
    bed = make_testbed(2)
    proc = run_ddops("bench", "--all", inventory=bed.inventory_path, env={"DDOPS_RESULTS_DIR": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert "no bench plan named and no `bench:`" in proc.stderr and "nothing launched" in proc.stderr
    assert "mini-ddtree-bench" in proc.stderr and "ddtree-bench" in proc.stderr  # the plans, listed
    for host in bed.hosts:
        assert not (host.repo_dir / ".ddops" / "runs").exists()
    assert not list(tmp_path.iterdir())  # no launch record either


def test_bench_with_no_plan_runs_the_one_the_inventory_names(make_testbed, tmp_path):
    bed = make_testbed(1)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(bed.inventory_path.read_text() + "bench: mini-ddtree-bench\n")
    doc = json.loads(run_ddops("--json", "bench", "--all", "--check", inventory=inventory).stdout)
    assert doc["plan"] == "mini-ddtree-bench"
    inventory.write_text(bed.inventory_path.read_text() + "bench: mini-ddtree-bnech\n")
    proc = run_ddops("bench", "--all", "--check", inventory=inventory)
    assert proc.returncode == 2 and f"{inventory}:" in proc.stderr and "mini-ddtree-bench" in proc.stderr
