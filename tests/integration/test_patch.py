"""`ddops patch / verify / status / rollback` on real sshd hosts seeded with mini-DDTree."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, both_engines, files_patched_by, requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]

PATCHES = ("cpu-timing", "hybrid-cache", "crop-relative")
FILES = files_patched_by(PATCHES)
TARGET_NEW = 'past_key_values_target = DynamicCache(config=target.config if hasattr(target, "config") else None)'
DRAFT_LINE = "past_key_values_draft = DynamicCache()"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def bed(make_testbed, seed):
    return make_testbed(3, seed=seed, patches=PATCHES)


def ddops_json(bed, *args: str) -> tuple[int, dict]:
    return run_ddops_json(*args, inventory=bed.inventory_path)


def originals(bed) -> dict[str, dict[str, str]]:
    return {h.name: {f: sha(h.repo_dir / f) for f in FILES} for h in bed.hosts}


@both_engines
def test_patch_all_changes_files_as_planned_and_keeps_the_draft_line(bed, seed):
    code, doc = ddops_json(bed, "patch", "--all")
    assert code == 0, doc
    assert {h["status"] for h in doc["hosts"]} == {"changed"}
    for host in bed.hosts:
        for name in FILES:
            text = (host.repo_dir / name).read_text()
            assert TARGET_NEW in text
            assert "past_key_values_target = DynamicCache()\n" not in text
            assert text.count(DRAFT_LINE) == (seed / name).read_text().count(DRAFT_LINE) == 1
        state = host.repo_dir / ".ddops"
        assert (state / "journal.jsonl").exists()
        backups = {p.name for p in (state / "backups").iterdir()}
        assert {sha(seed / f) for f in FILES} <= backups  # the originals, content-addressed
        assert "/.ddops/" in (host.repo_dir / ".git" / "info" / "exclude").read_text()


def test_one_transform_per_distinct_content_across_hosts(bed):
    code, doc = ddops_json(bed, "patch", "--all", "--check")
    assert code == 0
    computed_or_loaded = doc["transforms"]["cache_misses"] + doc["transforms"]["disk_hits"]
    assert computed_or_loaded == len(FILES)
    assert doc["transforms"]["cache_hits"] == len(FILES) * (len(bed.hosts) - 1)


@both_engines
def test_second_patch_writes_nothing_and_says_already_applied(bed):
    assert ddops_json(bed, "patch", "--all")[0] == 0
    mtimes = {(h.name, f): (h.repo_dir / f).stat().st_mtime_ns for h in bed.hosts for f in FILES}
    journal = (bed.hosts[0].repo_dir / ".ddops" / "journal.jsonl").read_text()
    code, doc = ddops_json(bed, "patch", "--all")
    assert code == 0
    assert {h["status"] for h in doc["hosts"]} == {"ok"}
    assert all("already applied" in h["message"] for h in doc["hosts"])
    assert mtimes == {(h.name, f): (h.repo_dir / f).stat().st_mtime_ns for h in bed.hosts for f in FILES}
    assert (bed.hosts[0].repo_dir / ".ddops" / "journal.jsonl").read_text() == journal


def test_check_shows_one_grouped_diff_and_writes_nothing(bed):
    before = originals(bed)
    proc = run_ddops("patch", "--all", "--check", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 hosts: identical diff" in proc.stdout
    assert f"+    {TARGET_NEW}" in proc.stdout
    assert originals(bed) == before
    assert not (bed.hosts[0].repo_dir / ".ddops").exists()


@both_engines
def test_rollback_restores_byte_identical_originals(bed):
    before = originals(bed)
    assert ddops_json(bed, "patch", "--all")[0] == 0
    assert originals(bed) != before
    code, doc = ddops_json(bed, "rollback", "--all")
    assert code == 0, doc
    assert originals(bed) == before
    code, doc = ddops_json(bed, "status", "--all")
    assert {s for h in doc["hosts"] for s in h["data"]["patches"].values()} == {"pending"}


def test_rollback_after_a_manual_edit_is_refused_and_the_file_untouched(bed):
    assert ddops_json(bed, "patch", "--all")[0] == 0
    edited = bed.hosts[1].repo_dir / "dflash.py"
    edited.write_text(edited.read_text() + "# a colleague's hotfix\n")
    edited_sha = sha(edited)
    code, doc = ddops_json(bed, "rollback", "--host", "host2")
    assert code == 1
    host = doc["hosts"][0]
    assert host["status"] == "failed" and "dflash.py changed since ddops wrote it" in host["message"]
    assert sha(edited) == edited_sha
    code, doc = ddops_json(bed, "status", "--host", "host2")
    assert set(doc["hosts"][0]["data"]["patches"].values()) == {"modified"}


def test_force_rollback_restores_and_saves_the_foreign_edit(bed, seed):
    assert ddops_json(bed, "patch", "--all")[0] == 0
    edited = bed.hosts[1].repo_dir / "dflash.py"
    edited.write_text(edited.read_text() + "# a colleague's hotfix\n")
    foreign = edited.read_bytes()
    code, doc = ddops_json(bed, "rollback", "--host", "host2", "--force")
    assert code == 0, doc
    assert edited.read_bytes() == (seed / "dflash.py").read_bytes()
    saved = bed.hosts[1].repo_dir / ".ddops" / "backups" / hashlib.sha256(foreign).hexdigest()
    assert saved.read_bytes() == foreign


def test_drifted_host_is_reported_and_the_others_patched(bed):
    drifted = bed.hosts[2].repo_dir / "ddtree.py"
    drifted.write_text(drifted.read_text().replace("past_key_values_target = DynamicCache()",
                                                   "past_key_values_target = make_cache(target)"))
    before = sha(drifted)
    code, doc = ddops_json(bed, "patch", "--all")
    assert code == 1
    statuses = {h["host"]: h for h in doc["hosts"]}
    assert statuses["host1"]["status"] == statuses["host2"]["status"] == "changed"
    assert statuses["host3"]["status"] == "drifted"
    assert "hybrid-cache drifted" in statuses["host3"]["message"]
    assert sha(drifted) == before  # all or nothing on a drifted host
    assert not (bed.hosts[2].repo_dir / ".ddops").exists()


def test_concurrent_patch_runs_on_one_host_keep_files_consistent(bed, seed):
    procs = [subprocess.Popen([sys.executable, "-m", "ddops", "-i", str(bed.inventory_path), "--json", "patch",
                               "--host", "host1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT) for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    docs = [json.loads(out) for out, _ in outputs]
    statuses = sorted(d["hosts"][0]["status"] for d in docs)
    # One writes; the others find it already applied, or lose the race cleanly (lock or compare-and-swap).
    assert statuses.count("changed") == 1, docs
    for d in docs:
        h = d["hosts"][0]
        assert h["status"] in ("changed", "ok", "failed")
        if h["status"] == "failed":
            assert "locked by" in h["message"] or "changed since it was read" in h["message"]
    journal = [json.loads(line) for line in
               (bed.hosts[0].repo_dir / ".ddops" / "journal.jsonl").read_text().splitlines()]
    applies = {(e["patch"], e["file"]) for e in journal if e["event"] == "apply"}
    assert len(applies) == len([e for e in journal if e["event"] == "apply"])  # nothing applied twice
    assert ddops_json(bed, "rollback", "--host", "host1")[0] == 0
    assert all(sha(bed.hosts[0].repo_dir / f) == sha(seed / f) for f in FILES)


def test_a_held_lock_is_reported_with_its_holder(bed):
    import fcntl

    state = bed.hosts[0].repo_dir / ".ddops"
    state.mkdir(mode=0o700)
    (state / "lock.info").write_text(json.dumps({"user": "alice", "host": "gpu-login", "pid": 4242,
                                                 "since": "2026-11-30T08:00:00Z", "actor": "alice@laptop",
                                                 "verb": "commit"}))
    with open(state / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        env_inv = bed.inventory_path
        proc = run_ddops("--json", "patch", "--host", "host1", inventory=env_inv, timeout=60,
                         env={"DDOPS_LOCK_TIMEOUT": "0.5"})
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert "locked by alice@gpu-login since 2026-11-30T08:00:00Z" in doc["hosts"][0]["message"]
    assert "past_key_values_target = DynamicCache()" in (bed.hosts[0].repo_dir / "ddtree.py").read_text()


@both_engines
def test_verify_prints_grep_style_matches(bed):
    assert ddops_json(bed, "patch", "--all")[0] == 0
    proc = run_ddops("verify", "--host", "host1", "hybrid-cache", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stderr
    assert "ddtree.py:" in proc.stdout and TARGET_NEW in proc.stdout
    # On an unpatched host the same checks fail.
    assert ddops_json(bed, "rollback", "--all")[0] == 0
    proc = run_ddops("verify", "--host", "host1", "hybrid-cache", inventory=bed.inventory_path)
    assert proc.returncode == 1


def test_status_table_lists_each_patch_per_host(bed):
    assert ddops_json(bed, "patch", "--host", "host1")[0] == 0
    proc = run_ddops("status", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[1]: line for line in proc.stdout.splitlines() if "│ host" in line}
    assert "applied" in lines["host1"] and "pending" not in lines["host1"]
    assert "pending" in lines["host2"]


def test_unknown_playbook_is_a_usage_error(bed):
    proc = run_ddops("patch", "--all", "hybrid-cahce", inventory=bed.inventory_path)
    assert proc.returncode == 2
    assert "no playbook named 'hybrid-cahce'" in proc.stderr and "did you mean 'hybrid-cache'" in proc.stderr
