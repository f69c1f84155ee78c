"""Planning: per-patch outcomes in order, the diff, the content-hash cache, and grouping identical diffs."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from types import MappingProxyType

import pytest

from ddops.patching.kinds import APPLIED, BLOCKED, DRIFTED, ERROR, PENDING
from ddops.patching.plan import DiffGroup, FilePlan, Planner, group_diffs, plan_file, unified_diff
from ddops.patching.plan_store import PlanStore
from ddops.patching.playbook import Patch, TransformSpec, load_playbook

FIXTURES = Path(__file__).parent / "fixtures" / "ddtree"

def patches_for(book, path: str) -> tuple:
    """The playbook's patches that touch path, in application order."""
    return tuple(p for p in book.patches if path in p.files)



def patch(pid: str, kind: str, files=("m.py",), requires=(), expect=1, **params) -> Patch:
    return Patch(id=pid, description="", files=tuple(files), requires=tuple(requires),
                 transform=TransformSpec(kind, MappingProxyType(params), expect))


RENAME = patch("rename", "replace_expression", match="old()", replace="new()")
IMPORT = patch("import", "add_import", module="os")


def test_plan_file_reports_each_patch_the_new_bytes_their_hashes_and_a_diff():
    source = b"import sys\n\nx = old()\n"
    plan = plan_file("m.py", source, [IMPORT, RENAME])
    assert [(r.patch_id, r.state) for r in plan.results] == [("import", PENDING), ("rename", PENDING)]
    assert plan.new == b"import sys\nimport os\n\nx = new()\n"
    assert plan.before_sha == hashlib.sha256(source).hexdigest()
    assert plan.after_sha == hashlib.sha256(plan.new).hexdigest()
    assert plan.changed and plan.state == PENDING
    assert plan.diff == (
        "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,4 @@\n import sys\n+import os\n \n-x = old()\n+x = new()\n"
    )


def test_patches_apply_in_order_each_seeing_the_previous_ones_work():
    first = patch("first", "replace_expression", match="a()", replace="b()")
    second = patch("second", "replace_expression", match="b()", replace="c()")
    plan = plan_file("m.py", b"x = a()\n", [first, second])
    assert plan.new == b"x = c()\n"


def test_a_patch_whose_required_patch_drifted_is_blocked_and_changes_nothing():
    helper = patch("helper", "insert_statement", anchor="MISSING = 1", statement="y = 2")
    user = patch("user", "replace_expression", requires=["helper"], match="old()", replace="new()")
    plan = plan_file("m.py", b"x = old()\n", [helper, user])
    assert [r.state for r in plan.results] == [DRIFTED, BLOCKED]
    assert "requires helper, which is drifted" in plan.outcome("user").message
    assert not plan.changed and plan.new == b"x = old()\n" and plan.diff == ""
    assert plan.state == DRIFTED


def test_one_failing_patch_does_not_stop_an_independent_one():
    missing = patch("missing", "replace_expression", match="nothing()", replace="x()")
    plan = plan_file("m.py", b"x = old()\n", [missing, RENAME])
    assert [r.state for r in plan.results] == [DRIFTED, PENDING]
    assert plan.new == b"x = new()\n"


def test_a_missing_file_is_drifted():
    plan = plan_file("m.py", None, [RENAME])
    assert plan.results[0].state == DRIFTED and "no such file" in plan.results[0].message
    assert plan.new is None and not plan.changed


def test_a_syntax_error_fails_every_python_patch_but_not_a_text_patch():
    text = patch("text", "text_replace", old="old", new="older")
    plan = plan_file("m.py", b"x = old(\n", [RENAME, IMPORT, text])
    assert [r.state for r in plan.results] == [ERROR, ERROR, PENDING]
    assert plan.new == b"x = older(\n"


def test_the_diff_marks_a_missing_final_newline():
    assert unified_diff("m.py", b"a\nold", b"a\nnew").endswith("-old\n\\ No newline at end of file\n"
                                                              "+new\n\\ No newline at end of file\n")


def test_planner_transforms_each_distinct_content_once_for_many_hosts():
    planner = Planner()
    book = load_playbook("hybrid-cache")
    source = (FIXTURES / "before" / "ddtree.py").read_bytes()
    plans = [planner.plan_file("ddtree.py", source, patches_for(book, "ddtree.py")) for _ in range(40)]
    assert (planner.cache_misses, planner.cache_hits) == (1, 39)
    assert all(p is plans[0] for p in plans)
    planner.plan_file("ddtree.py", plans[0].new, patches_for(book, "ddtree.py"))  # another commit
    planner.plan_file("ddtree.py", source, patches_for(load_playbook("crop-relative"), "ddtree.py"))  # other patches
    assert (planner.cache_misses, planner.cache_hits) == (3, 39)


def test_planner_threads_asking_for_the_same_content_share_one_transform():
    planner = Planner()
    source = (FIXTURES / "before" / "dflash.py").read_bytes()
    patches = patches_for(load_playbook("crop-relative"), "dflash.py")
    barrier = threading.Barrier(16)
    results: list[FilePlan] = []

    def host() -> None:
        barrier.wait()
        results.append(planner.plan_file("dflash.py", source, patches))

    threads = [threading.Thread(target=host) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert planner.cache_misses == 1 and planner.cache_hits == 15
    assert len({id(r) for r in results}) == 1


def test_threads_asking_for_the_same_checks_share_one_run_of_them():
    planner = Planner()
    barrier = threading.Barrier(8)
    runs: list[int] = []
    results: list[object] = []

    def checks() -> object:
        runs.append(1)
        time.sleep(0.05)  # long enough for every other thread to arrive while it runs
        return object()

    def host() -> None:
        barrier.wait()
        results.append(planner.memo(("checks", "dflash.py", "before", "after"), checks))

    threads = [threading.Thread(target=host) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1 and len({id(r) for r in results}) == 1


def test_a_check_run_that_failed_is_tried_again_by_the_next_thread():
    planner = Planner()
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first try fails")
        return "ran"

    with pytest.raises(RuntimeError):
        planner.memo("key", flaky)
    assert planner.memo("key", flaky) == "ran" and len(attempts) == 2


def test_plan_host_blocks_a_patch_everywhere_when_its_requirement_failed_in_another_file():
    base = patch("base", "replace_expression", files=["a.py"], match="old()", replace="new()")
    user = patch("user", "add_import", files=["b.py"], requires=["base"], module="os")
    host = Planner().plan_host([base, user], {"a.py": b"x = 1\n", "b.py": b"y = 2\n"})
    assert host.patch_state("base") == DRIFTED
    assert host.patch_state("user") == BLOCKED
    assert not host.changed
    ok = Planner().plan_host([base, user], {"a.py": b"x = old()\n", "b.py": b"y = 2\n"})
    assert ok.patch_state("user") == PENDING and ok.changed


def test_group_diffs_puts_identical_diffs_together_biggest_group_first():
    planner = Planner()
    patches = [RENAME]
    plans = {f"h{i:02d}": planner.plan_file("m.py", b"x = old()\n", patches) for i in range(40)}
    plans["odd"] = planner.plan_file("m.py", b"y = old()\n", patches)
    plans["done"] = planner.plan_file("m.py", b"x = new()\n", patches)
    groups = group_diffs(plans)
    assert [g.title for g in groups] == ["40 hosts: identical diff", "odd: diff", "1 host: no changes"]
    assert groups[0].hosts[0] == "h00" and len(groups[0].hosts) == 40
    assert "-x = old()\n+x = new()\n" in groups[0].diff
    assert groups[2] == DiffGroup("", ("done",))
    assert plans["done"].outcome("rename").state == APPLIED


def test_group_diffs_joins_a_hosts_files():
    a = plan_file("a.py", b"old()\n", [RENAME])
    b = plan_file("b.py", b"old()\n", [RENAME])
    groups = group_diffs({"h1": [a, b], "h2": [b, a], "h3": [a]})
    assert [g.hosts for g in groups] == [("h1", "h2"), ("h3",)]


FIXTURES_FOR_DISK = Path(__file__).resolve().parents[2] / "examples" / "mini-ddtree"


# --- the on-disk plan cache ---------------------------------------------------------------------------------------

def test_disk_cache_serves_a_second_planner_without_transforming(tmp_path):
    from ddops.patching.playbook import load_playbook

    patches = load_playbook("hybrid-cache").patches
    source = (FIXTURES_FOR_DISK / "ddtree.py").read_bytes() if FIXTURES_FOR_DISK.exists() else None
    if source is None:
        pytest.skip("mini-ddtree example missing")
    first = Planner(store=PlanStore(tmp_path))
    plan = first.plan_file("ddtree.py", source, patches)
    assert (first.cache_misses, first.disk_hits) == (1, 0)
    second = Planner(store=PlanStore(tmp_path))
    again = second.plan_file("ddtree.py", source, patches)
    assert (second.cache_misses, second.disk_hits) == (0, 1)
    assert again == plan and again.new == plan.new


def test_corrupt_disk_cache_entry_is_recomputed(tmp_path):
    from ddops.patching.playbook import load_playbook

    patches = load_playbook("hybrid-cache").patches
    source = (FIXTURES_FOR_DISK / "dflash.py").read_bytes()
    plan = Planner(store=PlanStore(tmp_path)).plan_file("dflash.py", source, patches)
    for entry in tmp_path.rglob("*.json"):
        entry.write_text(entry.read_text().replace(plan.after_sha, "0" * 64))
    fresh = Planner(store=PlanStore(tmp_path))
    assert fresh.plan_file("dflash.py", source, patches) == plan
    assert fresh.cache_misses == 1


def test_a_rerun_served_from_disk_never_imports_libcst(tmp_path):
    import subprocess
    import sys

    script = f"""
import sys
from pathlib import Path
from ddops.patching.playbook import load_playbook
from ddops.patching.plan import Planner
from ddops.patching.plan_store import PlanStore
patches = load_playbook("crop-relative").patches  # kinds that need libcst
source = Path({str(FIXTURES_FOR_DISK / "ddtree.py")!r}).read_bytes()
planner = Planner(store=PlanStore(Path({str(tmp_path)!r})))
planner.plan_file("ddtree.py", source, patches)
print(planner.disk_hits, "libcst" in sys.modules)
"""
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["0", "True"]
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert second.stdout.split() == ["1", "False"]


def test_group_diffs_takes_diff_text_as_hosts_report_it():
    groups = group_diffs({"h1": "-a\n+b\n", "h2": "-a\n+b\n", "h3": "-x\n+y\n"})
    assert [(g.hosts, g.title) for g in groups] == [(("h1", "h2"), "2 hosts: identical diff"),
                                                    (("h3",), "h3: diff")]
