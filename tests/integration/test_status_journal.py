"""`ddops status` with no playbook named and no `patches:`: what each host's journal holds."""

from __future__ import annotations

import pytest

from tests.conftest import MINI_DDTREE, git_seed, requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]


def status_json(bed) -> tuple[int, dict]:
    return run_ddops_json("status", "--all", inventory=bed.inventory_path)


def test_status_without_patches_shows_each_hosts_journal_and_files_changed_since(make_testbed, tmp_path):
    bed = make_testbed(3, seed=git_seed(MINI_DDTREE, tmp_path / "mini-ddtree"))  # inventory: `patches: []`
    assert "patches: []" in bed.inventory_path.read_text()

    code, doc = status_json(bed)
    assert code == 0, doc
    assert {h["message"] for h in doc["hosts"]} == {"no ddops patch applied"}

    for host, books in (("host1", ["cpu-timing", "hybrid-cache"]), ("host2", ["cpu-timing"])):
        proc = run_ddops("patch", "--host", host, *books, inventory=bed.inventory_path)
        assert proc.returncode == 0, proc.stderr
    code, doc = status_json(bed)
    assert code == 0, doc
    by_host = {h["host"]: h["data"] for h in doc["hosts"]}
    assert by_host["host1"]["patches"] == {"cpu-timing": "applied", "hybrid-cache": "applied"}
    assert by_host["host2"]["patches"] == {"cpu-timing": "applied"}
    assert by_host["host3"]["patches"] == {}
    assert by_host["host2"]["applied"][0]["files"] and by_host["host2"]["applied"][0]["changed_since"] == []
    assert by_host["host1"]["commit"]  # the repo's commit, as with playbooks

    # Someone edits a patched file on host2: status says which patch and which file, and exits 1.
    [edited] = by_host["host2"]["applied"]
    target = bed.host("host2").repo_dir / edited["files"][0]
    target.write_text(target.read_text() + "# edited by hand\n")
    code, doc = status_json(bed)
    assert code == 1
    host2 = next(h for h in doc["hosts"] if h["host"] == "host2")
    assert host2["status"] == "drifted"
    assert host2["data"]["patches"][edited["patch"]] == "modified"
    changed = next(p for p in host2["data"]["applied"] if p["patch"] == edited["patch"])
    assert changed["changed_since"] == [edited["files"][0]]
    assert edited["files"][0] in host2["message"]

    table = run_ddops("status", "--all", inventory=bed.inventory_path)
    assert table.returncode == 1
    assert "no playbook named" not in table.stderr
    assert "modified" in table.stdout and edited["patch"] in table.stdout
