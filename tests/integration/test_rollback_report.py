"""Rollback says what it did on real sshd hosts: every file restored and refused, where a saved foreign edit lies,
and `ddops backups list|show|restore` to see saved edits and put them back."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]

PATCHES = ("cpu-timing", "hybrid-cache", "crop-relative")
HOTFIX = "# a colleague's hotfix\n"


@pytest.fixture
def bed(make_testbed, seed):
    bed = make_testbed(2, seed=seed, patches=PATCHES)
    assert run_ddops("patch", "--all", inventory=bed.inventory_path).returncode == 0
    return bed


def ddops_json(bed, *args: str) -> tuple[int, dict]:
    return run_ddops_json(*args, inventory=bed.inventory_path)


def hotfix(host) -> bytes:
    edited = host.repo_dir / "dflash.py"
    edited.write_text(edited.read_text() + HOTFIX)
    return edited.read_bytes()


def test_a_refused_rollback_lists_the_files_it_restored_as_well_as_the_one_it_refused(bed, seed):
    hotfix(bed.hosts[1])
    code, doc = ddops_json(bed, "rollback", "--host", "host2")
    [host] = doc["hosts"]
    assert code == 1 and host["status"] == "failed"
    assert host["message"].startswith("restored ddtree.py")
    assert "refused dflash.py changed since ddops wrote it" in host["message"]
    restored = host["data"]["restored"]
    assert "ddtree.py" in restored and "dflash.py" not in restored
    assert [r["file"] for r in host["data"]["refused"]] == ["dflash.py"]
    assert (bed.hosts[1].repo_dir / "ddtree.py").read_bytes() == (seed / "ddtree.py").read_bytes()
    table = run_ddops("rollback", "--host", "host1", "--yes", inventory=bed.inventory_path)
    assert table.returncode == 0 and "restored ddtree.py, dflash.py" in table.stdout


def test_force_says_where_the_saved_edit_is_and_backups_show_it_and_restore_it(bed, seed):
    host = bed.hosts[0]
    foreign = hotfix(host)
    digest = hashlib.sha256(foreign).hexdigest()
    code, doc = ddops_json(bed, "rollback", "--host", "host1", "--force")
    message = doc["hosts"][0]["message"]
    assert code == 0 and "restored ddtree.py, dflash.py" in message
    where = f"{bed.repo_path}/.ddops/backups/{digest}"
    assert f"saved the foreign edit of dflash.py at {where} (ddops backups show host1 {digest[:12]})" in message
    assert (host.repo_dir / ".ddops" / "backups" / digest).read_bytes() == foreign  # the path is the host's

    code, listed = ddops_json(bed, "backups", "list")
    assert code == 0
    saved = {h["host"]: h["data"]["saved"] for h in listed["hosts"]}
    assert saved["host2"] == [] and [(s["file"], s["sha256"], s["backup"]) for s in saved["host1"]] == [
        ("dflash.py", digest, where)]
    shown = run_ddops("backups", "show", "host1", digest[:8], inventory=bed.inventory_path)
    assert shown.returncode == 0 and shown.stdout.encode() == foreign
    diff = run_ddops("backups", "show", "host1", "dflash.py", "--diff", inventory=bed.inventory_path)
    assert diff.returncode == 0 and f"-{HOTFIX}" in diff.stdout

    code, doc = ddops_json(bed, "backups", "restore", "host1", "dflash.py", "--yes")
    assert code == 0 and doc["hosts"][0]["status"] == "changed", doc
    assert (host.repo_dir / "dflash.py").read_bytes() == foreign
    code, doc = ddops_json(bed, "backups", "restore", "host1", digest[:12], "--yes")
    assert code == 0 and doc["hosts"][0]["status"] == "ok" and "already holds" in doc["hosts"][0]["message"]
    code, doc = ddops_json(bed, "status", "--host", "host1")
    assert code == 0, doc  # the journal reads the restored edit as what ddops last wrote: nothing "modified"


def test_a_saved_edit_is_not_put_back_over_a_file_ddops_has_patched_again(bed, seed):
    host = bed.hosts[0]
    hotfix(host)
    assert ddops_json(bed, "rollback", "--host", "host1", "--force")[0] == 0
    assert run_ddops("patch", "--host", "host1", inventory=bed.inventory_path).returncode == 0
    patched = (host.repo_dir / "dflash.py").read_bytes()
    code, doc = ddops_json(bed, "backups", "restore", "host1", "dflash.py", "--yes")
    assert code == 1 and "dflash.py has" in doc["hosts"][0]["message"] and "roll" in doc["hosts"][0]["message"]
    assert (host.repo_dir / "dflash.py").read_bytes() == patched
    code, doc = ddops_json(bed, "backups", "restore", "host1", "0000beef", "--yes")
    [host1] = doc["hosts"]
    assert code == 1 and host1["message"].startswith("no saved edit '0000beef'")  # the host is beside, not in it
    assert host1["reason"] == "usage"
