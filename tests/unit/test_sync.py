"""Sync without hosts: pin resolution, bundles, dirty-file classification, pin states, and the agent's sync verbs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.inventory import Host
from ddops.pins import (PIN_AT, PIN_NO_REPO, PIN_NONE, PIN_OFF, PIN_UNRESOLVED, SyncError, pick_ref, pin_state,
                        resolve_pin)
from ddops.tasks.sync import Bundles, classify_dirty, make_bundle, plan_move
from ddops.transport.agent import agent_program
from tests.conftest import GIT_ENV, git


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- pins -----------------------------------------------------------------------------------------------------


def test_pick_ref_prefers_tags_then_branches_and_peels_annotated_tags():
    listing = ("aaa\tHEAD\nbbb\trefs/heads/main\nccc\trefs/tags/main\nddd\trefs/tags/v1\neee\trefs/tags/v1^{}\n"
               "fff\trefs/heads/dev\n")
    assert pick_ref(listing, "main") == "ccc"
    assert pick_ref(listing, "v1") == "eee"
    assert pick_ref(listing, "dev") == "fff"
    assert pick_ref(listing, "refs/heads/main") == "bbb"
    assert pick_ref(listing, "HEAD") == "aaa"
    assert pick_ref(listing, "nope") is None


def test_full_sha_pins_need_no_lookup():
    commit = "a" * 40
    pin = resolve_pin("file:///does/not/exist", commit)
    assert (pin.commit, pin.via, pin.error) == (commit, "sha", None)


def test_branch_and_tag_pins_resolve_with_ls_remote(upstream):
    assert resolve_pin(upstream["url"], "main").commit == upstream["second"]
    tag = resolve_pin(upstream["url"], "v1")
    assert (tag.commit, tag.via) == (upstream["first"], "ls-remote")


def test_unreachable_url_falls_back_to_the_local_clone(upstream, tmp_path):
    pin = resolve_pin(f"file://{tmp_path}/missing.git", "main", from_clone=str(upstream["work"]))
    assert (pin.commit, pin.via) == (upstream["second"], "clone")
    short = resolve_pin(None, upstream["first"][:9], from_clone=str(upstream["work"]))
    assert short.commit == upstream["first"]


def test_unresolvable_pin_says_why_and_what_to_do(tmp_path):
    pin = resolve_pin(f"file://{tmp_path}/missing.git", "main")
    assert pin.commit is None
    assert "cannot resolve commit 'main'" in pin.error and "--from LOCAL_CLONE" in pin.error
    assert "no commit pinned" in resolve_pin("file:///x", None).error


def test_url_starting_with_a_dash_never_reaches_git(tmp_path):
    marker = tmp_path / "pwned"
    pin = resolve_pin(f"--upload-pack=touch {marker}", "main")
    assert pin.commit is None and "starts with '-'" in pin.error
    assert not marker.exists()


# -- bundles ----------------------------------------------------------------------------------------------------


def test_bundle_holds_the_commit_and_leaves_the_clone_untouched(upstream, tmp_path):
    refs_before = git(upstream["work"], "for-each-ref")
    bundle = make_bundle(upstream["work"], upstream["first"], tmp_path / "b.bundle", tmp_path / "scratch")
    assert git(upstream["work"], "for-each-ref") == refs_before
    assert bundle.sha256 == sha(bundle.path.read_bytes()) and bundle.size == bundle.path.stat().st_size
    fresh = tmp_path / "fresh"
    git(tmp_path, "init", "-q", str(fresh))
    git(fresh, "fetch", "-q", str(bundle.path), upstream["first"])
    assert git(fresh, "cat-file", "-t", upstream["first"]) == "commit"


def test_one_bundle_per_commit_per_run_and_failures_are_remembered(upstream, tmp_path):
    bundles = Bundles(str(upstream["work"]))
    try:
        first = bundles.get(None, upstream["second"])
        assert bundles.get(None, upstream["second"]) is first and bundles.created == 1
        with pytest.raises(SyncError, match="does not have commit"):
            bundles.get(None, "b" * 40)
        with pytest.raises(SyncError, match="does not have commit"):
            bundles.get(None, "b" * 40)
        folder = first.path.parent
    finally:
        bundles.close()
    assert not folder.exists()


def test_without_a_local_clone_bundles_come_from_a_temporary_mirror(upstream):
    with_mirror = Bundles(None)
    try:
        assert with_mirror.get(upstream["url"], upstream["first"]).size > 0
    finally:
        with_mirror.close()


# -- dirty files ----------------------------------------------------------------------------------------------------


def apply_entry(path: str, patch: str, before: bytes, after: bytes) -> dict:
    return {"event": "apply", "patch": patch, "file": path, "before": sha(before), "after": sha(after)}


def test_dirty_files_split_into_intact_ddops_patches_and_foreign_edits():
    orig, patched, edited = b"x = 1\n", b"x = 2\n", b"x = 3\n"
    dirty = [
        {"path": "ddtree.py", "sha256": sha(patched),
         "journal": [apply_entry("ddtree.py", "hybrid-cache", orig, patched)]},
        {"path": "dflash.py", "sha256": sha(edited),
         "journal": [apply_entry("dflash.py", "hybrid-cache", orig, patched)]},
        {"path": "benchmark.py", "sha256": sha(edited), "journal": []},
        {"path": "gone.py", "sha256": None, "journal": []},
    ]
    report = classify_dirty(dirty)
    assert report.patched == {"ddtree.py": ("hybrid-cache",)}
    assert report.foreign == ("dflash.py", "benchmark.py", "gone.py")
    assert report.patch_ids == ("hybrid-cache",)


def test_a_rolled_back_patch_no_longer_vouches_for_its_file():
    orig, patched = b"x = 1\n", b"x = 2\n"
    journal = [apply_entry("a.py", "p", orig, patched),
               {"event": "rollback", "patch": "p", "file": "a.py", "before": sha(patched), "after": sha(orig)}]
    report = classify_dirty([{"path": "a.py", "sha256": sha(orig), "journal": journal}])
    assert report.foreign == ("a.py",) and not report.patched


# -- the move a host's inspect answer calls for (pure) ---------------------------------------------------------------

AT, NEXT = "a" * 40, "b" * 40
SYNC_HOST = Host(name="h", address="a", repo="/r", repo_url="https://example.invalid/ddtree.git")


def inspected(**info) -> dict:
    return {"exists": True, "is_git": True, "empty": False, "head": AT, "has_commit": False, "dirty": [], **info}


def test_a_host_at_its_commit_has_arrived_even_with_local_edits():
    move = plan_move(SYNC_HOST, AT, "auto", inspected(dirty=[{"path": "x.py", "sha256": "c" * 64}]), force=False,
                     reapply=True)
    assert move.arrived and not move.refusal and move.dirty.foreign == ("x.py",)


def test_local_edits_ddops_did_not_make_refuse_the_move_unless_forced():
    info = inspected(dirty=[{"path": "x.py", "sha256": "c" * 64}], has_commit=True)
    refused = plan_move(SYNC_HOST, NEXT, "auto", info, force=False, reapply=True)
    assert refused.refused_as == "dirty" and "local changes ddops did not make in x.py" in refused.refusal
    forced = plan_move(SYNC_HOST, NEXT, "auto", info, force=True, reapply=True)
    assert not forced.refusal and forced.source is None
    assert forced.described(SYNC_HOST) == (f"would move {AT[:12]} → {NEXT[:12]}; saving local edits to x.py in a "
                                           "git stash")


def test_a_directory_that_is_not_a_checkout_is_never_cloned_over():
    move = plan_move(SYNC_HOST, NEXT, "auto", inspected(is_git=False, head=None), force=True, reapply=True)
    assert move.refused_as == "not_git" and "is not a git checkout and is not empty" in move.refusal
    empty = plan_move(SYNC_HOST, NEXT, "remote", inspected(is_git=False, head=None, empty=True), force=False,
                      reapply=True)
    assert not empty.refusal and empty.clones and empty.described(SYNC_HOST).startswith("would clone")


def test_auto_mode_fetches_where_the_host_reached_the_url_and_pushes_a_bundle_elsewhere():
    reached = inspected(probe={"reachable": True})
    assert plan_move(SYNC_HOST, NEXT, "auto", reached, force=False, reapply=True).source == "remote"
    assert plan_move(SYNC_HOST, NEXT, "auto", inspected(probe={}), force=False, reapply=True).source == "bundle"
    assert plan_move(SYNC_HOST, NEXT, "push", reached, force=False, reapply=True).source == "bundle"
    no_url = plan_move(Host(name="h", address="a"), NEXT, "remote", inspected(), force=False, reapply=True)
    assert no_url.refusal == f"the host lacks {NEXT[:12]} and has no repo_url to fetch it from"


# -- pin states ----------------------------------------------------------------------------------------------------


def test_pin_state_for_the_status_command():
    commit = "c" * 40
    pinned = Host(name="h", address="h", commit=commit)
    assert pin_state(pinned, commit) == PIN_AT
    assert pin_state(pinned, "d" * 40) == PIN_OFF
    assert pin_state(pinned, None) == PIN_NO_REPO
    assert pin_state(Host(name="h", address="h"), commit) == PIN_NONE
    branch = Host(name="h", address="h", commit="main")
    assert pin_state(branch, commit) == PIN_UNRESOLVED
    assert pin_state(branch, commit, resolved=commit) == PIN_AT
    assert pin_state(Host(name="h", address="h", commit=commit[:10]), commit) == PIN_AT


# -- the agent's sync verbs, run locally through the bootstrap ---------------------------------------------------------


def call(verb: str, payload: dict, cache: Path) -> dict:
    program = agent_program()
    request = json.dumps({"verb": verb, "payload": payload}).encode()
    done = subprocess.run(program.argv(sys.executable, cache=False), input=program.bundle + request,
                          capture_output=True, timeout=60, env={**os.environ, "XDG_CACHE_HOME": str(cache), **GIT_ENV})
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def ok(verb: str, payload: dict, cache: Path) -> dict:
    reply = call(verb, payload, cache)
    assert reply["ok"], reply
    return reply["result"]


def fails(verb: str, payload: dict, cache: Path) -> dict:
    reply = call(verb, payload, cache)
    assert not reply["ok"], reply
    return reply["error"]


def test_agent_clones_an_empty_dir_at_the_commit_then_reports_it_in_place(upstream, tmp_path):
    repo, cache = tmp_path / "host" / "repo", tmp_path / "cache"
    inspect = ok("sync_inspect", {"repo": str(repo), "commit": upstream["first"], "probe_url": upstream["url"]}, cache)
    assert not inspect["exists"] and inspect["empty"] and inspect["probe"]["reachable"]
    done = ok("sync_checkout", {"repo": str(repo), "commit": upstream["first"], "repo_url": upstream["url"],
                                "source": "remote", "actor": "t"}, cache)
    assert done["created"] and done["before"] is None and done["after"] == upstream["first"]
    assert done["fetched_bytes"] > 0
    assert git(repo, "rev-parse", "HEAD") == upstream["first"]
    assert git(repo, "rev-parse", "origin/main") == upstream["second"]  # looks like an ordinary clone
    again = ok("sync_inspect", {"repo": str(repo), "commit": upstream["first"]}, cache)
    assert again["head"] == upstream["first"] and again["has_commit"] and again["dirty"] == []
    log = (repo / ".ddops" / "sync.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["after"] == upstream["first"]
    assert "/.ddops/" in (repo / ".git" / "info" / "exclude").read_text()


def test_agent_probe_reports_an_unreachable_url(tmp_path):
    inspect = ok("sync_inspect", {"repo": str(tmp_path / "r"), "commit": "a" * 40,
                                  "probe_url": f"file://{tmp_path}/nowhere.git", "probe_timeout": 5}, tmp_path)
    assert inspect["probe"]["reachable"] is False and inspect["probe"]["error"]


def test_agent_refuses_to_move_over_local_edits(upstream, tmp_path):
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    git(tmp_path, "clone", "-q", upstream["url"], str(repo))
    (repo / "ddtree.py").write_text("mine\n")
    inspect = ok("sync_inspect", {"repo": str(repo), "commit": upstream["first"]}, cache)
    assert [d["path"] for d in inspect["dirty"]] == ["ddtree.py"]
    assert inspect["dirty"][0]["sha256"] == sha(b"mine\n")
    error = fails("sync_checkout", {"repo": str(repo), "commit": upstream["first"], "source": "remote",
                                    "repo_url": upstream["url"]}, cache)
    assert error["kind"] == "dirty" and "ddtree.py" in error["message"]
    assert (repo / "ddtree.py").read_text() == "mine\n"


def test_agent_saves_edits_in_a_stash_named_after_ddops(upstream, tmp_path):
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    git(tmp_path, "clone", "-q", upstream["url"], str(repo))
    (repo / "ddtree.py").write_text("mine\n")
    saved = ok("sync_save", {"repo": str(repo), "paths": ["ddtree.py"], "message": "ddops sync --force test"}, cache)
    assert git(repo, "status", "--porcelain") == ""
    assert "ddops sync --force test" in git(repo, "stash", "list")
    assert "+mine" in git(repo, "stash", "show", "-p", saved["stash"])


def test_agent_will_not_clone_over_a_non_git_directory(upstream, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "results.txt").write_text("precious\n")
    error = fails("sync_checkout", {"repo": str(repo), "commit": upstream["first"], "source": "remote",
                                    "repo_url": upstream["url"]}, tmp_path / "cache")
    assert error["kind"] == "not_git"
    assert (repo / "results.txt").read_text() == "precious\n"


def test_agent_checks_the_bundle_checksum_and_only_reads_its_staging_dir(upstream, tmp_path):
    cache, repo = tmp_path / "cache", tmp_path / "repo"
    staging = Path(ok("sync_inspect", {"repo": str(repo), "commit": upstream["first"], "staging": True},
                      cache)["staging_dir"])
    assert staging == (cache / "ddops" / "incoming").resolve()
    bundle = make_bundle(upstream["work"], upstream["first"], tmp_path / "b.bundle", tmp_path / "scratch")
    target = staging / f"{upstream['first']}-0123456789abcdef.bundle"
    target.write_bytes(bundle.path.read_bytes())
    payload = {"repo": str(repo), "commit": upstream["first"], "source": "bundle",
               "bundle": {"path": str(target), "sha256": "0" * 64}}
    assert fails("sync_checkout", payload, cache)["kind"] == "checksum"
    assert not target.exists()  # a damaged upload is removed
    outside = tmp_path / f"{upstream['first']}-0123456789abcdef.bundle"
    outside.write_bytes(bundle.path.read_bytes())
    payload["bundle"] = {"path": str(outside), "sha256": bundle.sha256}
    assert fails("sync_checkout", payload, cache)["kind"] == "unsafe_path"
    assert outside.exists()
    target.write_bytes(bundle.path.read_bytes())
    payload["bundle"] = {"path": str(target), "sha256": bundle.sha256}
    done = ok("sync_checkout", payload, cache)
    assert done["after"] == upstream["first"] and done["source"] == "bundle"
    assert not target.exists()




def test_bad_sync_options_are_usage_errors(tmp_path):
    from ddops.errors import UsageError
    from ddops.inventory import Inventory
    from ddops.tasks.sync import SyncOptions, prepare_sync

    inventory = Inventory(path="inventory.yaml", hosts=(Host(name="h", address="h", commit="a" * 40),))
    with pytest.raises(UsageError, match="--mode"):
        prepare_sync(inventory, inventory.hosts, SyncOptions(mode="rsync"))
    with pytest.raises(UsageError, match="not a directory"):
        prepare_sync(inventory, inventory.hosts, SyncOptions(from_clone=str(tmp_path / "nope")))
    with pytest.raises(UsageError, match="not a git clone"):
        prepare_sync(inventory, inventory.hosts, SyncOptions(from_clone=str(tmp_path)))
    with pytest.raises(UsageError, match="--reapply needs `patches:`"):
        prepare_sync(inventory, inventory.hosts, SyncOptions(reapply=True))


def absent_commit(commit: str) -> str:
    """A full commit id that is certainly not `commit` (its last digit changed), so not in the repo either."""
    return commit[:-1] + ("1" if commit[-1] == "0" else "0")


@pytest.mark.parametrize("commit", ["absent", "present"])
@pytest.mark.parametrize("verb", ["sync_inspect", "sync_fetch", "sync_checkout"])
def test_agent_refuses_a_repo_url_that_git_would_read_as_an_option(upstream, tmp_path, verb, commit):
    repo, cache, marker = tmp_path / "repo", tmp_path / "cache", tmp_path / "pwned"
    git(tmp_path, "clone", "-q", upstream["url"], str(repo))
    git(repo, "remote", "set-url", "origin", str(upstream["origin"]))  # not the URL asked for: a fetch by URL
    # The upload-pack command runs where a local "repository" is named: the repo itself, by its path.
    evil = f"--upload-pack=touch {marker}; git-upload-pack"
    # "absent": the URL would be used; "present": the commit is there and the URL is not needed, and is refused
    # all the same (every operand is checked before anything runs).
    pin = absent_commit(upstream["second"]) if commit == "absent" else upstream["second"]
    payload = {"repo": str(repo), "commit": pin, "source": "remote", "actor": "t"}
    payload.update({"probe_url": evil} if verb == "sync_inspect" else {"repo_url": evil})
    error = fails(verb, payload, cache)
    assert error["kind"] == "bad_request" and "must not be empty, start with '-'" in error["message"]
    assert not marker.exists()


@pytest.mark.parametrize("existed", [False, True])
@pytest.mark.parametrize("verb", ["sync_fetch", "sync_checkout"])
def test_a_sync_with_an_unusable_repo_url_leaves_no_empty_git_init_behind(upstream, tmp_path, verb, existed):
    repo, cache = tmp_path / "host" / "repo", tmp_path / "cache"
    if existed:
        repo.mkdir(parents=True)  # an empty directory waiting for its checkout
    payload = {"repo": str(repo), "commit": upstream["first"], "source": "remote", "actor": "t",
               "repo_url": str(tmp_path / "no-such-upstream")}
    error = fails(verb, payload, cache)
    assert error["kind"] == "fetch_failed", error
    if existed:
        assert repo.is_dir() and list(repo.iterdir()) == []
    else:
        assert not repo.exists()
    # A usable URL afterwards clones as into a fresh directory.
    done = ok(verb, dict(payload, repo_url=upstream["url"]), cache)
    assert done["created"] is True


def test_a_pin_starting_with_a_dash_is_refused_before_git():
    pin = resolve_pin(None, "--output=/tmp/x", from_clone="/nonexistent")
    assert pin.commit is None and "starts with '-'" in pin.error


def test_with_a_local_clone_a_pin_means_what_the_clone_says_not_the_remote(upstream):
    work = upstream["work"]
    (work / "LOCAL").write_text("not pushed\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "three")
    local = git(work, "rev-parse", "HEAD")
    pin = resolve_pin(upstream["url"], "HEAD", from_clone=str(work))
    assert (pin.commit, pin.via) == (local, "clone")
    assert pin.shown == f"HEAD@{local[:7]}" and pin.described == f"HEAD@{local[:7]} (resolved in the clone {work})"
    remote = resolve_pin(upstream["url"], "main")
    assert remote.commit == upstream["second"]
    assert remote.described == f"main@{upstream['second'][:7]} (resolved in the remote {upstream['url']})"


def test_every_distinct_pin_of_a_run_is_resolved_once_however_many_hosts_ask(upstream):
    from ddops.pins import Pins, local_git

    calls = []

    def counting_git(args, **kwargs):
        calls.append(args[0])
        return local_git(args, **kwargs)

    pins = Pins(git=counting_git)
    hosts = [Host(name=f"h{i}", address=f"h{i}", repo_url=upstream["url"], commit="main") for i in range(5)]
    hosts.append(Host(name="t", address="t", repo_url=upstream["url"], commit="v1"))
    commits = {h.name: pins.for_host(h).commit for h in hosts}
    assert calls == ["ls-remote", "ls-remote"]
    assert set(commits.values()) == {upstream["second"], upstream["first"]}


def test_status_shows_a_branch_pin_resolved_on_the_controller_not_unresolved(upstream):
    from ddops.pins import host_pins

    at = Host(name="at", address="a", repo_url=upstream["url"], commit="main")
    off = Host(name="off", address="o", repo_url=upstream["url"], commit="main")
    none = Host(name="none", address="n")
    shown = host_pins([at, off, none], [upstream["second"], upstream["first"], upstream["first"]])
    assert shown["at"].state == PIN_AT and shown["at"].pin == f"main@{upstream['second'][:7]}"
    assert shown["at"].resolved_in == f"the remote {upstream['url']}"
    assert shown["off"].state == PIN_OFF and shown["none"].state == PIN_NONE
    assert shown["at"].cell == f"at-pin main@{upstream['second'][:7]}"


def test_bench_preflight_compares_the_head_with_the_controllers_commit_not_the_hosts_branch(upstream):
    from ddops.bench.plan import BenchPlan
    from ddops.bench.preflight import preflight_problems

    plan = BenchPlan(name="p", command="true", results="*.pt", summarizer="ddtree")
    host = Host(name="h", address="h", repo_url=upstream["url"], commit="main")
    pin = resolve_pin(upstream["url"], "main")
    # The host's stale local main names the first commit; its HEAD is the second, which the remote's main names.
    facts = {"repo_exists": True, "git_commit": upstream["second"], "commit_resolved": upstream["second"]}
    assert preflight_problems(plan, host, facts, {}, pin) == []
    stale = {**facts, "git_commit": upstream["first"], "commit_resolved": upstream["second"]}
    (problem,) = preflight_problems(plan, host, stale, {}, pin)
    assert problem == (f"repo is at {upstream['first'][:12]}, not at the pinned commit main@{upstream['second'][:7]} "
                       f"(resolved in the remote {upstream['url']}); run `ddops sync`")
