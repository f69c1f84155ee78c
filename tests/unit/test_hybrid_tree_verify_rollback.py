"""hybrid-tree-verify on top of hybrid-cache and crop-relative, patched and rolled back through the real agent and
its journal (a local subprocess, as tests/unit/test_tasks_patch.py runs it): every file comes back byte for byte.
"""

from __future__ import annotations

from ddops.fleet import CHANGED
from ddops.patching.playbook import load_playbooks
from ddops.tasks.patch import patch_host, rollback_host
from tests.conftest import REPO_ROOT, files_patched_by
from tests.unit.test_tasks_patch import host, planner, repo  # noqa: F401 - fixtures: a copy of the seed, its host

UNDER = ("hybrid-cache", "crop-relative")  # what the hybrid target needs to run at all
BOOKS = (*UNDER, "hybrid-tree-verify")
ACTOR = "tester@here"


def contents(root, files) -> dict[str, bytes]:
    return {f: (root / f).read_bytes() for f in files}


def test_hybrid_tree_verify_on_top_of_the_two_comes_off_alone_then_all_three_to_the_original_bytes(
        host, session, repo, seed):  # noqa: F811
    files = files_patched_by(BOOKS)
    assert {"ddtree.py", "dflash.py", "model/dflash.py"} <= set(files)
    original = contents(seed, files)
    # Two runs, as a host gets them: the two the hybrid target needs, then all three (the two already applied):
    # the journal holds both runs.
    assert patch_host(host, session, load_playbooks(list(UNDER)), planner=planner(), actor=ACTOR).status == CHANGED
    under = contents(repo, files)
    outcome = patch_host(host, session, load_playbooks(list(BOOKS)), planner=planner(), actor=ACTOR)
    assert outcome.status == CHANGED, outcome.message
    patched = contents(repo, files)
    assert all(patched[f] not in (original[f], under[f]) for f in files)
    assert b"ddops_hybrid_verify.verify_tree(" in patched["ddtree.py"]
    assert b"ddops_hybrid_verify.verify_chain(" in patched["model/dflash.py"]
    module = repo / "ddops_hybrid_verify.py"  # the one file the playbook adds
    assert module.read_bytes() == (REPO_ROOT / "playbooks" / "hybrid_verify.py").read_bytes()
    # hybrid-tree-verify's own patches come off alone, down to the bytes the two under it left ...
    ids = [p.id for book in load_playbooks(["hybrid-tree-verify"]) for p in book.patches]
    alone = rollback_host(host, session, ids, actor=ACTOR)
    assert alone.status == CHANGED, alone.message
    assert contents(repo, files) == under and not module.exists()
    # ... then everything ddops applied, newest first: the original bytes.
    patch_host(host, session, load_playbooks(list(BOOKS)), planner=planner(), actor=ACTOR)
    assert contents(repo, files) == patched
    back = rollback_host(host, session, actor=ACTOR)
    assert back.status == CHANGED, back.message
    assert contents(repo, files) == original and not module.exists()
    assert rollback_host(host, session).message == "nothing to roll back"
