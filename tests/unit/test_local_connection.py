"""`connection: local`: a checkout on this machine is a host like any other (the same agent, journal and commands),
reached without sshd. Each test drives the real CLI against a git repo in tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import MINI_DDTREE, git, git_seed, run_ddops, run_ddops_json, wait_until

ANCHOR = "past_key_values_target = DynamicCache()\n"


def inventory_for(tmp_path: Path, hosts: str, extra: str = "") -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text("ssh_config: /dev/null\n"
                    f"known_hosts: {tmp_path / 'known_hosts'}\n"
                    "patches: [hybrid-cache]\n"
                    f"{extra}"
                    "hosts:\n" + hosts)
    return path


def ddops_json(inventory: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    # No ssh-agent nor keys of the user's: a local host needs none.
    env = {"SSH_AUTH_SOCK": "", **(env or {})}
    return run_ddops_json(*args, inventory=inventory, env=env)


@pytest.fixture
def checkout(tmp_path) -> Path:
    return git_seed(MINI_DDTREE, tmp_path / "checkout")


def test_patch_verify_status_and_rollback_work_on_a_local_checkout(checkout, tmp_path):
    inventory = inventory_for(tmp_path, f"  laptop: {{connection: local, repo: {json.dumps(str(checkout))}}}\n")
    original = (checkout / "ddtree.py").read_bytes()

    code, doc = ddops_json(inventory, "patch", "--all")
    assert code == 0, doc
    (host,) = doc["hosts"]
    assert host["host"] == "laptop" and host["status"] == "changed"
    assert ANCHOR not in (checkout / "ddtree.py").read_text()
    assert (checkout / ".ddops" / "journal.jsonl").exists()  # the same journal as on a remote host

    assert ddops_json(inventory, "patch", "--all")[1]["hosts"][0]["status"] == "ok"  # applied: nothing to do
    code, doc = ddops_json(inventory, "verify", "--all")
    assert code == 0 and doc["hosts"][0]["status"] == "ok", doc
    code, doc = ddops_json(inventory, "status", "--all")
    assert code == 0 and "applied" in json.dumps(doc["hosts"][0]), doc

    code, doc = ddops_json(inventory, "rollback", "--all")
    assert code == 0 and doc["hosts"][0]["status"] == "changed", doc
    assert (checkout / "ddtree.py").read_bytes() == original


def test_sync_clones_and_exec_runs_on_this_machine_without_sshd(checkout, tmp_path):
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(checkout), str(origin))
    fresh = tmp_path / "fresh"
    inventory = inventory_for(
        tmp_path, f"  here: {{connection: local, repo: {json.dumps(str(fresh))}}}\n",
        extra=f"defaults: {{repo_url: {json.dumps(f'file://{origin}')}, commit: main}}\n")

    code, doc = ddops_json(inventory, "sync", "--all", "--mode", "remote")
    assert code == 0 and doc["hosts"][0]["status"] == "changed", doc
    assert git(fresh, "rev-parse", "HEAD") == git(checkout, "rev-parse", "HEAD")

    code, doc = ddops_json(inventory, "exec", "--all", "--in-repo", "--", "pwd")
    assert code == 0, doc
    assert doc["hosts"][0]["data"]["stdout"].strip() == str(fresh)
    code, doc = ddops_json(inventory, "exec", "--all", "--", "pwd")  # in the home directory, as over SSH
    assert doc["hosts"][0]["data"]["stdout"].strip() == os.path.expanduser("~")


def test_bench_launches_and_collects_a_run_on_a_local_checkout(checkout, tmp_path):
    plan = tmp_path / "echo-plan.yaml"
    plan.write_text("name: echo-plan\nsummarizer: ddtree\nresults: '*.pt'\n"
                    "command: echo hello; printf abc > {result_dir}/a.pt\n")
    inventory = inventory_for(tmp_path, f"  here: {{connection: local, repo: {json.dumps(str(checkout))}}}\n")
    results = tmp_path / "results"
    env = {"DDOPS_RESULTS_DIR": str(results)}
    code, doc = ddops_json(inventory, "bench", str(plan), "--all", "--run-id", "20261201-0000-locl", env=env)
    assert code == 0 and doc["hosts"][0]["status"] == "changed", doc

    def completed() -> bool:
        return ddops_json(inventory, "bench", "status", "20261201-0000-locl", env=env)[1]["hosts"][0]["data"][
            "run"]["status"] == "completed"

    wait_until(completed, timeout=60, interval=0.5)
    code, doc = ddops_json(inventory, "bench", "collect", "20261201-0000-locl", env=env)
    assert code == 0, doc
    assert [p.read_bytes() for p in results.rglob("a.pt")] == [b"abc"]


def test_two_local_hosts_need_two_repos_and_a_local_host_needs_no_address(tmp_path):
    inventory = inventory_for(tmp_path, "  a: {connection: local, repo: /srv/one}\n"
                                        "  b: {connection: local, repo: /srv/one}\n")
    proc = run_ddops("hosts", inventory=inventory)
    assert proc.returncode == 2
    assert f"{inventory}:6: hosts.b: same repo /srv/one on this machine as host 'a'" in proc.stderr
