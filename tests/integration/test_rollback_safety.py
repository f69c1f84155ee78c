"""Rollback has no destructive default on real sshd hosts: with no host selected and no terminal it needs --yes,
and --check says what would be restored and refused while writing nothing."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]

PATCHES = ("cpu-timing", "hybrid-cache", "crop-relative")


@pytest.fixture
def bed(make_testbed, seed):
    bed = make_testbed(2, seed=seed, patches=PATCHES)
    assert run_ddops("patch", "--all", inventory=bed.inventory_path).returncode == 0
    return bed


def digests(bed) -> dict[str, str]:
    return {f"{h.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for h in bed.hosts for p in sorted(h.repo_dir.glob("*.py"))}


def test_rollback_with_no_selection_and_no_terminal_restores_nothing_without_yes(bed):
    before = digests(bed)
    proc = run_ddops("rollback", inventory=bed.inventory_path, input="")  # stdin is no terminal
    assert proc.returncode == 2 and digests(bed) == before
    assert "pass --yes" in proc.stderr and "2 in the inventory" in proc.stderr and "--check" in proc.stderr
    code, doc = run_ddops_json("rollback", inventory=bed.inventory_path)
    assert code == 2 and doc["exit_code"] == 2 and "pass --yes" in doc["error"] and digests(bed) == before
    assert run_ddops("rollback", "--yes", inventory=bed.inventory_path, input="").returncode == 0
    assert digests(bed) != before


def test_rollback_check_says_what_would_be_restored_and_refused_and_writes_nothing(bed):
    edited = bed.hosts[1].repo_dir / "dflash.py"
    edited.write_text(edited.read_text() + "# a colleague's hotfix\n")
    before = digests(bed)
    code, doc = run_ddops_json("rollback", "--check", inventory=bed.inventory_path)
    assert code == 1 and digests(bed) == before
    hosts = {h["host"]: h for h in doc["hosts"]}
    clean, hotfixed = hosts["host1"], hosts["host2"]
    assert clean["status"] == "changed" and clean["data"]["check_mode"] is True
    # newest patch first, as a rollback undoes them
    assert clean["message"] == ("would restore ddtree.py, dflash.py, model/dflash.py (crop-recording, crop-relative, "
                                "crop-helper, hybrid-cache, cpu-timing)")
    assert hotfixed["status"] == "failed" and "would be refused dflash.py changed since ddops wrote it" in \
        hotfixed["message"]
    journal = (bed.hosts[0].repo_dir / ".ddops" / "journal.jsonl").read_text()
    assert "rollback" not in journal
    table = run_ddops("rollback", "--check", "--host", "host1", inventory=bed.inventory_path)
    assert table.returncode == 0 and "ddops rollback --check (nothing written)" in table.stdout
