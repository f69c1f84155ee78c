"""The sync and deploy tasks against the real agent run as a local subprocess (LocalSession): a repo brought to its
pinned commit from a local origin, or pushed as a bundle, with no sshd and no root.

Over SSH: tests/integration/test_sync.py."""

from __future__ import annotations

from dataclasses import replace

from ddops.fleet import CHANGED, FAILED, OK
from ddops.inventory import Host, Inventory
from ddops.pins import PinState, pin_state
from ddops.tasks.sync import SyncOptions, deploy_host, prepare_sync, sync_host
from ddops.transport.local import LocalSession
from tests.conftest import git


def sync(host: Host, **options) -> object:
    inventory = Inventory(path="inventory.yaml", hosts=(host,))
    with prepare_sync(inventory, [host], SyncOptions(actor="tester@here", **options)) as run, \
            LocalSession(host) as session:
        return sync_host(host, session, run)


def test_sync_clones_an_empty_repo_path_at_the_pin_then_has_nothing_to_do(upstream, tmp_path):
    host = Host(name="here", address="localhost", repo=str(tmp_path / "repo"), repo_url=upstream["url"],
                commit=upstream["first"], sync="remote")
    first = sync(host)
    assert first.status == CHANGED and first.message.startswith("cloned at " + upstream["first"][:12])
    assert git(tmp_path / "repo", "rev-parse", "HEAD") == upstream["first"]
    again = sync(host)
    assert again.status == OK and again.message == f"at {upstream['first'][:12]}"
    assert pin_state(host, upstream["first"]) == PinState.AT == "at-pin"


def test_sync_pushes_a_bundle_when_told_to(upstream, tmp_path):
    host = Host(name="here", address="localhost", repo=str(tmp_path / "repo"), repo_url=upstream["url"],
                commit=upstream["second"], sync="push")
    outcome = sync(host)
    assert outcome.status == CHANGED and outcome.report.source == "bundle", outcome.message
    assert outcome.report.uploaded_bytes == outcome.report.bytes_moved > 0
    assert git(tmp_path / "repo", "rev-parse", "HEAD") == upstream["second"]


def test_sync_refuses_to_move_over_local_edits_and_check_mode_changes_nothing(upstream, tmp_path):
    repo = tmp_path / "repo"
    host = Host(name="here", address="localhost", repo=str(repo), repo_url=upstream["url"], commit=upstream["first"],
                sync="remote")
    assert sync(host).status == CHANGED
    (repo / "ddtree.py").write_text("mine\n")
    later = replace(host, commit=upstream["second"])
    check = sync(later, check=True)
    assert check.status == FAILED and "local changes ddops did not make in ddtree.py" in check.message
    assert git(repo, "rev-parse", "HEAD") == upstream["first"]
    assert (repo / "ddtree.py").read_text() == "mine\n"


def test_deploy_syncs_and_applies_the_inventorys_patches(tmp_path):
    from tests.conftest import MINI_DDTREE, git_seed

    seed = git_seed(MINI_DDTREE, tmp_path / "seed")
    commit = git(seed, "rev-parse", "HEAD")
    host = Host(name="here", address="localhost", repo=str(tmp_path / "repo"), repo_url=f"file://{seed}",
                commit=commit, sync="remote", command_timeout=120)
    inventory = Inventory(path="inventory.yaml", hosts=(host,), patches=("cpu-timing",))
    with prepare_sync(inventory, [host], SyncOptions(actor="tester@here")) as run, LocalSession(host) as session:
        outcome = deploy_host(host, session, run)
    assert outcome.status == CHANGED, outcome.message
    assert outcome.message.endswith("cpu-timing applied and verified")
    assert (outcome.report.patch.status, outcome.report.verify.status) == (CHANGED, OK)
    assert (tmp_path / "repo" / ".ddops" / "journal.jsonl").is_file()


def test_deploy_to_a_new_commit_names_what_it_rolled_back_and_applied_by_playbook_and_never_says_not_reapplied(
        tmp_path):
    from tests.conftest import MINI_DDTREE, git_seed

    seed = git_seed(MINI_DDTREE, tmp_path / "seed")
    first = git(seed, "rev-parse", "HEAD")
    (seed / "NOTES.md").write_text("a second commit\n")
    git(seed, "add", "NOTES.md")
    git(seed, "commit", "-q", "-m", "second")
    second = git(seed, "rev-parse", "HEAD")
    host = Host(name="here", address="localhost", repo=str(tmp_path / "repo"), repo_url=f"file://{seed}",
                commit=first, sync="remote", command_timeout=120)
    books = ("hybrid-cache", "crop-relative")
    for pinned in (first, second):
        moved = replace(host, commit=pinned)
        inventory = Inventory(path="inventory.yaml", hosts=(moved,), patches=books)
        with prepare_sync(inventory, [moved], SyncOptions(actor="tester@here")) as run, \
                LocalSession(moved) as session:
            outcome = deploy_host(moved, session, run)
        assert outcome.status == CHANGED, outcome.message
    assert outcome.message == (f"moved {first[:12]} → {second[:12]}; rolled back crop-relative, hybrid-cache; "
                               "hybrid-cache, crop-relative applied and verified")


def test_patch_ids_are_named_by_the_playbooks_they_make_up():
    from ddops.patching.playbook import load_playbooks
    from ddops.tasks.sync import by_playbook

    books = load_playbooks(["hybrid-cache", "crop-relative"])
    assert by_playbook(["crop-recording", "crop-relative", "crop-helper", "hybrid-cache"], books) == \
        "hybrid-cache, crop-relative"
    assert by_playbook(["crop-helper", "mine"], books) == "crop-relative (crop-helper), mine"
