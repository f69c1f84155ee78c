"""What a host's environment is, said through the CLI on real sshd hosts: the versions `status -v` shows, and a
repo that holds none of the playbook's files named as a wrong `repo:`, never as upstream drift."""

from __future__ import annotations

import sys

import pytest
import torch
import transformers

from tests.conftest import requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]


def test_status_v_shows_python_torch_with_its_cuda_and_transformers_per_host(make_testbed, seed):
    bed = make_testbed(2, seed=seed, patches=("hybrid-cache",))
    proc = run_ddops("status", "-v", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    python = ".".join(map(str, sys.version_info[:3]))
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
    rows = [line for line in proc.stdout.splitlines() if "│ host" in line]
    assert len(rows) == 2
    for row in rows:
        assert python in row and f"{torch.__version__} ({cuda})" in row and transformers.__version__ in row
    code, doc = run_ddops_json("status", "--all", inventory=bed.inventory_path)
    assert doc["hosts"][0]["data"]["versions"]["transformers"] == transformers.__version__


def test_a_repo_without_any_of_the_playbooks_files_is_named_a_wrong_repo_not_drift(make_testbed):
    bed = make_testbed(2)  # no seed: each host's repo is an empty folder
    for command in ("patch", "status", "verify"):
        code, doc = run_ddops_json(command, "--all", "hybrid-cache", inventory=bed.inventory_path)
        assert code == 1, (command, doc)
        for host in doc["hosts"]:
            assert host["status"] == "failed" and host["reason"] == "no_repo", (command, host)
            assert "none of ddtree.py, dflash.py, model/dflash.py is in /root/ddtree: is `repo:` this host's " \
                   "checkout" in host["message"], (command, host)
            assert "upstream" not in host["message"]


def test_next_step_hints_keep_the_inventory_they_were_given(make_testbed):
    bed = make_testbed(1)
    proc = run_ddops("patch", "--all", "hybrid-cache", inventory=bed.inventory_path)
    assert proc.returncode == 1
    assert f"(`ddops -i {bed.inventory_path} sync`)" in proc.stdout + proc.stderr
    code, doc = run_ddops_json("patch", "--all", "hybrid-cache", inventory=bed.inventory_path)
    assert f"(`ddops -i {bed.inventory_path} sync`)" in doc["hosts"][0]["message"]
