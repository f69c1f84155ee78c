"""Shell completion of what users type most, asked as bash asks it (`_DDOPS_COMPLETE=complete_bash`): host names,
groups, --limit patterns, playbooks, bench plans and run ids, offline and from the inventory given so far."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def complete(words: str, cwd: Path, **env: str) -> list[str]:
    argv = words.split(" ")
    done = subprocess.run([sys.executable, "-m", "ddops"], capture_output=True, text=True, cwd=cwd, timeout=30,
                          env={**os.environ, "_DDOPS_COMPLETE": "complete_bash", "COMP_WORDS": words,
                               "COMP_CWORD": str(len(argv) - 1), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture
def inventory(tmp_path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text("groups: {h200: {user: root}}\nhosts:\n"
                    "  host10: {address: 10.9.9.10, groups: [h200]}\n"
                    "  host2: {address: 10.9.9.2, groups: [h200, a100]}\n"
                    "  bastion: {address: 10.9.9.1}\n")
    return path


def test_host_names_complete_in_natural_order_from_the_inventory_given_before_or_after_the_command(inventory, tmp_path):
    assert complete(f"ddops -i {inventory} ping --host h", tmp_path) == ["host2", "host10"]
    assert complete(f"ddops ping -i {inventory} --host ", tmp_path) == ["bastion", "host2", "host10"]
    assert complete("ddops ping --host b", tmp_path, DDOPS_INVENTORY=str(inventory)) == ["bastion"]


def test_groups_and_limit_patterns_complete_the_part_after_the_last_comma(inventory, tmp_path):
    assert complete(f"ddops -i {inventory} patch --group ", tmp_path) == ["a100", "h200"]
    assert complete(f"ddops -i {inventory} patch --limit host2,!h", tmp_path) == ["host2,!h200", "host2,!host2",
                                                                                 "host2,!host10"]


def test_playbooks_and_plans_complete_from_the_search_path(inventory, tmp_path):
    assert "hybrid-cache" in complete(f"ddops -i {inventory} patch hy", tmp_path)
    assert "mini-ddtree-bench" not in complete(f"ddops -i {inventory} patch m", tmp_path)


def test_a_missing_inventory_completes_nothing_and_fails_nothing(tmp_path):
    assert complete(f"ddops -i {tmp_path / 'nope.yaml'} ping --host ", tmp_path) == []


def test_bench_plans_and_run_ids_complete_from_the_search_path_and_the_results_folder(inventory, tmp_path):
    assert complete(f"ddops -i {inventory} bench run mini", tmp_path) == ["mini-ddtree-bench"]
    assert "hybrid-cache" not in complete(f"ddops -i {inventory} bench run ", tmp_path)
    results = tmp_path / "results"
    for run_id, record in (("20261201-0900-aaaa", "launch.json"), ("20261202-0900-bbbb", "manifest.json"),
                           ("not-a-run", None)):
        (results / run_id).mkdir(parents=True)
        if record:
            (results / run_id / record).write_text("{}")
    for command in ("bench logs ", "bench status ", "bench stop ", "bench collect ", "bench report "):
        assert complete(f"ddops -i {inventory} {command}", tmp_path) == ["20261202-0900-bbbb", "20261201-0900-aaaa"]
    assert complete(f"ddops bench report --results-dir {results} 20261201", tmp_path / "results") == \
        ["20261201-0900-aaaa"]
