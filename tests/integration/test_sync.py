"""Sync and deploy on real sshd hosts: the research repo at a pinned commit, fetched or pushed, never over local work.

The "remote" is a bare repo the test makes. Where hosts must not reach it, it sits under the repo path on the
controller's side: each testbed host bind-mounts its own directory there, so only the controller can see it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ddops.fleet import run_fleet
from ddops.inventory import load_inventory
from ddops.tasks.sync import SyncOptions, prepare_sync
from ddops.transport import Connector
from tests.conftest import MINI_DDTREE, both_engines, git, git_seed, requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]

ANCHOR = "past_key_values_target = DynamicCache()"
PATCHED = 'past_key_values_target = DynamicCache(config=target.config if hasattr(target, "config") else None)'


def commit_all(work: Path, message: str) -> str:
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    return git(work, "rev-parse", "HEAD")


def make_upstream(work: Path, origin: Path) -> dict[str, str]:
    """mini-DDTree at commit `a` (main); `b` changes benchmark.py and adds CHANGES.md; `drift` renames the line
    hybrid-cache patches."""
    git_seed(MINI_DDTREE, work)
    a = git(work, "rev-parse", "HEAD")
    with open(work / "benchmark.py", "a") as fh:
        fh.write("# upstream moved on\n")
    (work / "CHANGES.md").write_text("b: benchmark tweak\n")
    b = commit_all(work, "b: benchmark tweak")
    ddtree = work / "ddtree.py"
    ddtree.write_text(ddtree.read_text().replace(ANCHOR, "target_cache = DynamicCache()"))
    drift = commit_all(work, "drift: the target cache line is gone")
    git(work, "checkout", "-q", "--detach")
    git(work, "branch", "-f", "main", a)
    git(work, "branch", "b", b)
    git(work, "branch", "drift", drift)
    git(work, "checkout", "-q", "main")
    git(work.parent, "clone", "-q", "--bare", str(work), str(origin))
    return {"a": a, "b": b, "drift": drift}


def pin(bed, url: str, commit: str, patches: list[str] | None = None) -> Path:
    """Give the testbed's inventory a repo_url and commit (and `patches:`) in its defaults."""
    text = bed.inventory_path.read_text()
    text = text.replace("defaults:\n", f"defaults:\n  repo_url: {json.dumps(url)}\n  commit: {json.dumps(commit)}\n", 1)
    if patches is not None:
        text = re.sub(r"^patches: .*$", f"patches: {json.dumps(patches)}", text, flags=re.M)
    bed.inventory_path.write_text(text)
    return bed.inventory_path


def head(host) -> str | None:
    if not (host.repo_dir / ".git").exists():
        return None
    return git(host.repo_dir, "rev-parse", "HEAD")


def sync_json(inventory: Path, *args: str) -> tuple[int, dict[str, dict]]:
    code, doc = run_ddops_json("sync", *args, inventory=inventory)
    return code, {h["host"]: h for h in doc["hosts"]}


@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, str]:
    """A bare origin every host can see (file:// on the shared filesystem), and the work clone it came from."""
    commits = make_upstream(tmp_path / "work", tmp_path / "origin.git")
    return {**commits, "url": f"file://{tmp_path / 'origin.git'}", "work": str(tmp_path / "work")}


def test_remote_mode_clones_fresh_hosts_at_the_pin_and_a_rerun_moves_nothing(make_testbed, upstream):
    bed = make_testbed(2)
    inventory = pin(bed, upstream["url"], "main")
    code, hosts = sync_json(inventory, "--all", "--mode", "remote")
    assert code == 0
    for host in bed.hosts:
        result = hosts[host.name]
        assert result["status"] == "changed", result["message"]
        assert result["data"]["before"] is None and result["data"]["after"] == upstream["a"]
        assert result["data"]["source"] == "remote" and result["data"]["bytes_moved"] > 0
        assert head(host) == upstream["a"]
        assert git(host.repo_dir, "status", "--porcelain") == ""

    code, hosts = sync_json(inventory, "--all", "--mode", "remote")
    assert code == 0
    for result in hosts.values():
        assert result["status"] == "ok" and result["data"]["bytes_moved"] == 0
        assert result["round_trips"] == 1  # one inspect call when nothing changes


def test_check_reports_the_move_and_writes_nothing(make_testbed, upstream):
    bed = make_testbed(1)
    inventory = pin(bed, upstream["url"], "main")
    code, hosts = sync_json(inventory, "--all", "--check")
    assert code == 0
    assert hosts["host1"]["status"] == "changed" and "would clone" in hosts["host1"]["message"]
    assert list(bed.hosts[0].repo_dir.iterdir()) == []


@both_engines
def test_push_mode_sends_one_checksummed_bundle_to_hosts_that_cannot_reach_the_origin(make_testbed, tmp_path):
    repo_path = tmp_path / "mnt" / "ddtree"
    bed = make_testbed(2, repo_path=str(repo_path))
    # Under the repo path on the controller's side: every host sees its own directory there instead.
    hidden = repo_path / "origin.git"
    commits = make_upstream(tmp_path / "work", hidden)
    inventory = pin(bed, f"file://{hidden}", "main")

    code, hosts = sync_json(inventory, "--all")  # auto: the host's probe fails, so the controller pushes
    assert code == 0, hosts
    for host in bed.hosts:
        result = hosts[host.name]
        assert result["status"] == "changed", result["message"]
        assert result["data"]["source"] == "bundle" and result["data"]["bytes_moved"] > 0
        assert head(host) == commits["a"]
    staging = Path.home() / ".cache" / "ddops" / "incoming"
    assert not list(staging.glob(f"{commits['a']}-*"))  # uploaded bundles are removed once fetched

    code, hosts = sync_json(inventory, "--all", "--mode", "push", "--from", str(tmp_path / "work"))
    assert code == 0
    assert {h["status"] for h in hosts.values()} == {"ok"}
    assert [h["data"]["bytes_moved"] for h in hosts.values()] == [0, 0]

    inv = load_inventory(inventory)
    options = SyncOptions(rev="b", mode="push", from_clone=str(tmp_path / "work"))
    with prepare_sync(inv, list(inv.hosts), options) as run:
        results = run_fleet(list(inv.hosts), run.sync_task, Connector(inv.known_hosts).connect)
        assert run.bundles.created == 1  # one bundle for the run, whatever the number of hosts
    assert [r.status for r in results] == ["changed", "changed"], [r.message for r in results]
    assert all(head(h) == commits["b"] for h in bed.hosts)


def test_a_host_with_local_edits_is_refused_and_force_stashes_them_first(make_testbed, upstream):
    bed = make_testbed(2)
    inventory = pin(bed, upstream["url"], "main")
    code, hosts = sync_json(inventory, "--all")
    assert code == 0 and {h["data"]["source"] for h in hosts.values()} == {"remote"}  # auto: the origin is reachable
    edited = bed.hosts[0].repo_dir / "benchmark.py"
    edited.write_text(edited.read_text() + "# a researcher's experiment\n")

    code, hosts = sync_json(inventory, "--all", "--commit", "b")
    assert code == 1
    refused = hosts["host1"]
    assert refused["status"] == "failed" and "benchmark.py" in refused["message"] and "--force" in refused["message"]
    assert refused["data"]["dirty"] == ["benchmark.py"]
    assert head(bed.hosts[0]) == upstream["a"] and "a researcher's experiment" in edited.read_text()
    assert hosts["host2"]["status"] == "changed" and head(bed.hosts[1]) == upstream["b"]

    code, hosts = sync_json(inventory, "--host", "host1", "--commit", "b", "--force")
    assert code == 0, hosts
    saved = hosts["host1"]["data"]["saved"]
    assert "stash" in hosts["host1"]["message"] and saved["paths"] == ["benchmark.py"]
    assert head(bed.hosts[0]) == upstream["b"]
    listing = git(bed.hosts[0].repo_dir, "stash", "list")
    assert "ddops sync --force" in listing
    assert "a researcher's experiment" in git(bed.hosts[0].repo_dir, "stash", "show", "-p", saved["stash"])


def test_a_non_git_directory_at_the_repo_path_is_left_alone(make_testbed, upstream):
    bed = make_testbed(1)
    inventory = pin(bed, upstream["url"], "main")
    (bed.hosts[0].repo_dir / "notes.txt").write_text("precious\n")
    code, hosts = sync_json(inventory, "--all")
    assert code == 1 and "not a git checkout" in hosts["host1"]["message"]
    assert (bed.hosts[0].repo_dir / "notes.txt").read_text() == "precious\n"


def test_deploy_takes_three_empty_hosts_to_patched_and_verified(make_testbed, upstream):
    bed = make_testbed(3)
    inventory = pin(bed, upstream["url"], "main", patches=["hybrid-cache"])
    proc = run_ddops("deploy", "--all", inventory=inventory)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 hosts: 3 changed" in proc.stdout
    for host in bed.hosts:
        assert head(host) == upstream["a"]
        assert PATCHED in (host.repo_dir / "ddtree.py").read_text()
        assert PATCHED in (host.repo_dir / "dflash.py").read_text()
    again = run_ddops("--json", "deploy", "--all", inventory=inventory)
    assert again.returncode == 0, again.stderr
    assert {h["status"] for h in json.loads(again.stdout)["hosts"]} == {"ok"}


def test_moving_the_pin_rolls_patches_back_moves_and_reapplies_them(make_testbed, upstream):
    bed = make_testbed(1)
    inventory = pin(bed, upstream["url"], "main", patches=["hybrid-cache"])
    assert run_ddops("deploy", "--all", inventory=inventory).returncode == 0
    repo = bed.hosts[0].repo_dir

    # An untracked file where the new commit has one stops the checkout: the patches go back on, nothing lost.
    (repo / "CHANGES.md").write_text("my notes\n")
    code, hosts = sync_json(inventory, "--all", "--commit", "b")
    assert code == 1 and "patches re-applied at" in hosts["host1"]["message"], hosts["host1"]["message"]
    assert head(bed.hosts[0]) == upstream["a"] and PATCHED in (repo / "ddtree.py").read_text()
    assert (repo / "CHANGES.md").read_text() == "my notes\n"
    (repo / "CHANGES.md").unlink()

    code, hosts = sync_json(inventory, "--all", "--commit", "b")
    result = hosts["host1"]
    assert code == 0, result["message"]
    assert result["status"] == "changed"
    assert result["data"]["rolled_back"] == ["hybrid-cache"] and result["data"]["reapplied"] == ["hybrid-cache"]
    assert head(bed.hosts[0]) == upstream["b"]
    assert PATCHED in (repo / "ddtree.py").read_text()
    assert "# upstream moved on" in (repo / "benchmark.py").read_text()
    events = [json.loads(line)["event"] for line in (repo / ".ddops" / "journal.jsonl").read_text().splitlines()]
    assert "rollback" in events and events[-1] == "apply"

    code, hosts = sync_json(inventory, "--all", "--commit", "drift")
    result = hosts["host1"]
    assert code == 1 and result["status"] == "failed"
    assert "drifted" in result["message"] and "hybrid-cache" in result["message"]
    assert "WITHOUT" in result["message"]
    assert head(bed.hosts[0]) == upstream["drift"]
    assert git(repo, "status", "--porcelain") == ""  # rolled back cleanly; nothing half-patched


def test_a_branch_pin_means_the_commit_the_controller_resolved_for_sync_status_and_bench(make_testbed, upstream,
                                                                                         tmp_path):
    bed = make_testbed(1)
    host = bed.hosts[0]
    inventory = pin(bed, upstream["url"], "main")
    assert sync_json(inventory, "--all", "--mode", "remote")[0] == 0
    # The remote's main moves on; the host's own refs (whatever its clone made of main) stay where they were.
    git(Path(upstream["url"].removeprefix("file://")), "update-ref", "refs/heads/main", upstream["b"])
    code, hosts = sync_json(inventory, "--all", "--mode", "remote")
    assert code == 0 and head(host) == upstream["b"], hosts
    assert hosts[host.name]["data"]["pin_shown"] == f"main@{upstream['b'][:7]}"
    assert hosts[host.name]["data"]["resolved_in"] == f"the remote {upstream['url']}"

    proc = run_ddops("--json", "status", "--all", inventory=inventory)
    (status,) = json.loads(proc.stdout)["hosts"]
    assert status["data"]["pin"] == "at-pin", status
    assert status["data"]["pin_detail"]["pin"] == f"main@{upstream['b'][:7]}"

    plan = tmp_path / "echo-bench.yaml"
    plan.write_text('summarizer: ddtree\nresults: "*.pt"\ncommand: echo {run_index} > {result_dir}/r.txt\n')
    proc = run_ddops("bench", "run", str(plan), "--check", "--all", inventory=inventory)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"at main@{upstream['b'][:7]} (resolved in the remote {upstream['url']})" in proc.stdout
    # With --from, the pin means the clone's main (still at a): the host at b is refused, saying why.
    proc = run_ddops("bench", "run", str(plan), "--check", "--all", "--from", upstream["work"], inventory=inventory)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"not at the pinned commit main@{upstream['a'][:7]} (resolved in the clone" in " ".join(proc.stdout.split())


def test_sync_from_a_clone_moves_hosts_to_the_clones_head_not_the_remotes(make_testbed, upstream):
    bed = make_testbed(1)
    host = bed.hosts[0]
    inventory = pin(bed, upstream["url"], "main")
    work = Path(upstream["work"])
    (work / "LOCAL.md").write_text("only in the clone\n")
    local = commit_all(work, "c: not pushed")
    code, hosts = sync_json(inventory, "--all", "--from", str(work), "--commit", "HEAD")
    assert code == 0, hosts
    assert head(host) == local
    data = hosts[host.name]["data"]
    assert data["pin_shown"] == f"HEAD@{local[:7]}" and data["resolved_in"] == f"the clone {work.resolve()}"
