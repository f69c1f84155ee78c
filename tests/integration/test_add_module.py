"""add_module through the CLI on real sshd hosts: `--check` shows the new file, `patch` creates it, `status` and
`verify` report it like any patch, and `rollback` leaves every repo exactly as it was."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]

PLAYBOOK = REPO_ROOT / "tests" / "unit" / "fixtures" / "add-module" / "timing-module.yaml"
MODULE = PLAYBOOK.with_name("timing_module.py").read_bytes()
TARGET = "ddops_timing.py"


@pytest.fixture
def bed(make_testbed, seed):
    return make_testbed(2, seed=seed)


def tree(root: Path) -> dict[str, bytes]:
    """Every file of the checkout but ddops' state and git's, with `git status` as git sees the checkout."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
             if p.is_file() and p.relative_to(root).parts[0] not in (".ddops", ".git")}
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, capture_output=True,
                            text=True, check=True).stdout
    return {**files, "git status": status.encode()}


def test_check_patch_status_verify_and_rollback_of_a_module_leave_each_repo_as_it_was(bed):
    before = {h.name: tree(h.repo_dir) for h in bed.hosts}

    shown = run_ddops("patch", str(PLAYBOOK), "--all", "--check", inventory=bed.inventory_path)
    assert shown.returncode == 0, shown.stderr
    assert "2 hosts: identical diff" in shown.stdout
    assert f"--- /dev/null\n+++ b/{TARGET}\n" in shown.stdout and "+def wall_seconds" in shown.stdout
    assert {h.name: tree(h.repo_dir) for h in bed.hosts} == before

    code, doc = run_ddops_json("patch", str(PLAYBOOK), "--all", inventory=bed.inventory_path)
    assert code == 0, doc
    assert {h["status"] for h in doc["hosts"]} == {"changed"}
    for host in bed.hosts:
        assert (host.repo_dir / TARGET).read_bytes() == MODULE
        assert "import ddops_timing\n" in (host.repo_dir / "ddtree.py").read_text()

    code, doc = run_ddops_json("status", str(PLAYBOOK), "--all", inventory=bed.inventory_path)
    assert code == 0, doc
    assert [h["data"]["patches"] for h in doc["hosts"]] == [{"timing-module": "applied",
                                                             "timing-import": "applied"}] * 2
    code, doc = run_ddops_json("verify", str(PLAYBOOK), "--all", inventory=bed.inventory_path)
    assert code == 0 and {h["status"] for h in doc["hosts"]} == {"ok"}, doc
    code, doc = run_ddops_json("status", "--all", inventory=bed.inventory_path)  # the journal's view, no playbook
    assert code == 0 and doc["hosts"][0]["data"]["patches"] == {"timing-module": "applied",
                                                                "timing-import": "applied"}, doc

    code, doc = run_ddops_json("rollback", "--all", inventory=bed.inventory_path)
    assert code == 0 and {h["status"] for h in doc["hosts"]} == {"changed"}, doc
    assert {h.name: tree(h.repo_dir) for h in bed.hosts} == before


def test_an_edited_module_is_reported_modified_and_only_a_forced_rollback_removes_it(bed):
    assert run_ddops_json("patch", str(PLAYBOOK), "--host", "host1", inventory=bed.inventory_path)[0] == 0
    module = bed.hosts[0].repo_dir / TARGET
    module.write_bytes(MODULE + b"# a colleague's fix\n")
    code, doc = run_ddops_json("status", str(PLAYBOOK), "--host", "host1", inventory=bed.inventory_path)
    assert doc["hosts"][0]["data"]["patches"]["timing-module"] == "modified", doc
    code, doc = run_ddops_json("rollback", "--host", "host1", inventory=bed.inventory_path)
    assert code == 1 and f"{TARGET} changed since ddops wrote it" in doc["hosts"][0]["message"], doc
    assert module.read_bytes() == MODULE + b"# a colleague's fix\n"
    code, doc = run_ddops_json("rollback", "--host", "host1", "--force", inventory=bed.inventory_path)
    assert code == 0 and not module.exists(), doc
    assert "saved the foreign edit of ddops_timing.py" in doc["hosts"][0]["message"]
