"""`ddops status` with no playbook: the journal's active patches and the files changed since ddops wrote them."""

from __future__ import annotations

from ddops.tasks.journal_status import applied_patches

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def apply(patch: str, file: str, before: str, after: str, time: str) -> dict:
    return {"event": "apply", "patch": patch, "file": file, "before": before, "after": after, "time": time}


JOURNAL = [
    apply("cpu-timing", "dflash.py", A, B, "t1"),
    apply("hybrid-cache", "ddtree.py", C, D, "t2"),
    apply("hybrid-cache", "dflash.py", B, C, "t3"),
    apply("crop-relative", "ddtree.py", D, A, "t4"),
    {"event": "rollback", "patch": "crop-relative", "file": "ddtree.py", "before": A, "after": D, "time": "t5"},
]


def test_rolled_back_patches_are_gone_and_the_rest_are_applied_in_order_when_files_are_as_ddops_left_them():
    applied = applied_patches(JOURNAL, {"dflash.py": C, "ddtree.py": D})
    assert [(p.patch, p.state, p.files, p.applied_at) for p in applied] == [
        ("cpu-timing", "applied", ("dflash.py",), "t1"),
        ("hybrid-cache", "applied", ("ddtree.py", "dflash.py"), "t3")]


def test_a_file_edited_since_ddops_wrote_it_marks_every_patch_in_it_modified():
    applied = {p.patch: p for p in applied_patches(JOURNAL, {"dflash.py": "e" * 64, "ddtree.py": D})}
    assert applied["cpu-timing"].state == "modified" and applied["cpu-timing"].changed_since == ("dflash.py",)
    assert applied["hybrid-cache"].state == "modified" and applied["hybrid-cache"].changed_since == ("dflash.py",)


def test_a_deleted_file_is_missing_not_modified():
    [cpu, hybrid] = applied_patches(JOURNAL, {"dflash.py": C, "ddtree.py": None})
    assert cpu.state == "applied"
    assert hybrid.state == "missing" and hybrid.missing == ("ddtree.py",) and hybrid.changed_since == ()
    assert hybrid.to_json()["missing"] == ["ddtree.py"]


def test_an_empty_journal_holds_nothing():
    assert applied_patches([], {}) == []
