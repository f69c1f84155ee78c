"""Commands that need no host honour --json too, with the same envelope (docs/json.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import MINI_DDTREE, REPO_ROOT


def ddops_json(*argv: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "ddops", *argv, "--json"], capture_output=True, text=True,
                          cwd=REPO_ROOT)
    [line] = done.stdout.splitlines()  # one compact document
    doc = json.loads(line)
    assert doc["schema_version"] == 1 and doc["exit_code"] == done.returncode and doc["interrupted"] is False
    return done.returncode, doc


def test_playbook_lint_reports_each_sample_in_its_document():
    code, doc = ddops_json("playbook", "lint", "playbooks/hybrid-cache.yaml", "--sample",
                           str(MINI_DDTREE / "ddtree.py"))
    assert code == 0 and doc["command"] == "playbook lint" and doc["kind"] == "playbook"
    [sample] = doc["samples"]
    assert sample["ok"] and sample["target"] == "ddtree.py" and sample["findings"]
    code, doc = ddops_json("playbook", "lint", "playbooks/mini-ddtree-bench.yaml")
    assert (code, doc["kind"], doc["name"]) == (0, "bench plan", "mini-ddtree-bench")


def test_inventory_init_says_what_it_wrote(tmp_path):
    out = tmp_path / "inventory.yaml"
    code, doc = ddops_json("inventory", "init", "-o", str(out))
    assert code == 0 and doc == {**doc, "command": "inventory init", "written": str(out)} and out.exists()
    code, doc = ddops_json("inventory", "init", "-o", str(out))  # exists: refused, still one document
    assert code == 2 and "exists" in doc["error"]


def test_a_command_has_one_name_whether_it_reached_its_hosts_or_failed_before(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  gone: {address: 127.0.0.1, port: 1}\n")  # nothing listens on port 1
    code, reached = ddops_json("-i", str(inventory), "bench", "mini-ddtree-bench", "--check", "--all")
    assert code == 1 and (reached["command"], reached["check"]) == ("bench run", True)
    [host] = reached["hosts"]
    assert (host["status"], host["reason"]) == ("unreachable", "transport")
    code, failed = ddops_json("-i", str(inventory), "bench", "no-such-plan", "--check", "--all")
    assert code == 2 and failed["command"] == "bench run" and "no-such-plan" in failed["error"]
