"""Playbooks: the YAML format and its errors, and each built-in playbook on DDTree-shaped files, applied twice."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddops.errors import PlaybookError
from ddops.patching.checks import run_checks
from ddops.patching.kinds import APPLIED, PENDING
from ddops.patching.plan import plan_file
from ddops.patching.playbook import PatchPlaybook, builtin_dirs, list_playbooks, load_playbook

FIXTURES = Path(__file__).parent / "fixtures" / "ddtree"
REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "examples" / "mini-ddtree"
BUILTINS = ["hybrid-cache", "crop-relative", "cpu-timing"]

def patches_for(book, path: str) -> tuple:
    """The playbook's patches that touch path, in application order."""
    return tuple(p for p in book.patches if path in p.files)



def write(tmp_path: Path, text: str, name: str = "pb.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(PlaybookError) as info:
        load_playbook(write(tmp_path, text))
    return str(info.value)


GOOD = """
name: demo
description: a demo
patches:
  - id: one
    files: [a.py]
    transform: {kind: replace_expression, match: "old()", replace: "new()"}
    checks: [compiles, {kind: contains, text: "new()"}]
"""


# --- the built-in playbooks -----------------------------------------------------------------------------------

def test_the_builtin_playbooks_are_found_by_bare_name():
    assert set(BUILTINS) <= set(list_playbooks())
    for name in BUILTINS:
        book = load_playbook(name)
        assert isinstance(book, PatchPlaybook) and book.name == name
        assert book.path == str(builtin_dirs()[0] / f"{name}.yaml")


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_playbook_turns_the_before_fixture_into_the_after_fixture_and_then_changes_nothing(name):
    book = load_playbook(name)
    for path in book.files:
        before = (FIXTURES / "before" / path).read_bytes()
        expected = (FIXTURES / "after" / name / path).read_bytes()
        first = plan_file(path, before, patches_for(book, path))
        assert [r.state for r in first.results] == [PENDING] * len(first.results), first.results
        assert first.new == expected
        second = plan_file(path, first.new, patches_for(book, path))
        assert [r.state for r in second.results] == [APPLIED] * len(second.results), second.results
        assert second.new == first.new and not second.changed and second.diff == ""


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_playbook_checks_pass_after_the_patch_and_catch_the_unpatched_file(name):
    book = load_playbook(name)
    for path in book.files:
        before = (FIXTURES / "before" / path).read_bytes()
        after = (FIXTURES / "after" / name / path).read_bytes()
        for patch in patches_for(book, path):
            results = run_checks(path, before, after, patch.checks)
            assert results and all(r.ok for r in results), [(r.name, r.message) for r in results if not r.ok]
        unpatched = [r for p in patches_for(book, path) for r in run_checks(path, before, before, p.checks)]
        assert not all(r.ok for r in unpatched)


def test_hybrid_cache_changes_the_target_line_only():
    after = (FIXTURES / "after" / "hybrid-cache" / "ddtree.py").read_text()
    assert ('    past_key_values_target = DynamicCache(config=target.config if hasattr(target, "config") else None)\n'
            in after)
    assert "    past_key_values_draft = DynamicCache()\n" in after


def test_crop_relative_rewrites_every_absolute_crop_in_both_files():
    book = load_playbook("crop-relative")
    assert book.patch("crop-relative").requires == ("crop-helper",)
    assert [p.id for p in book.patches] == ["crop-helper", "crop-relative", "crop-recording"]
    for path, calls in (("ddtree.py", 4), ("dflash.py", 2)):
        before = (FIXTURES / "before" / path).read_text()
        after = (FIXTURES / "after" / "crop-relative" / path).read_text()
        assert before.count(".crop(") == calls
        assert after.count(".crop(") == 1  # only the helper's relative crop
        assert after.count("_ddops_crop_to(") == calls + 1


def test_crop_recording_makes_the_target_cache_record_past_states_after_the_prefill_and_leaves_the_draft_alone():
    book = load_playbook("crop-relative")
    for path in ("ddtree.py", "dflash.py"):
        after = (FIXTURES / "after" / "crop-relative" / path).read_text()
        prefill = after.index("        logits_to_keep=1,\n")
        recording = after.index('    if hasattr(past_key_values_target, "activate_past_recording"):\n'
                                '        _ddops_record_past(past_key_values_target, output_ids.shape[1])\n')
        assert recording > prefill  # from the prefill on: a recording never holds the prompt
        assert "past_key_values_draft.activate_past_recording" not in after
        assert plan_file(path, after.encode(), patches_for(book, path)).results[-1].state == APPLIED


def test_all_builtin_playbooks_compose_on_the_same_file():
    patches = [p for name in BUILTINS for p in patches_for(load_playbook(name), "dflash.py")]
    before = (FIXTURES / "before" / "dflash.py").read_bytes()
    plan = plan_file("dflash.py", before, patches)
    assert [r.state for r in plan.results] == [PENDING] * len(patches) == [PENDING] * 5
    again = plan_file("dflash.py", plan.new, patches)
    assert [r.state for r in again.results] == [APPLIED] * 5
    compile(plan.new, "dflash.py", "exec")


class FakeCache4:
    """transformers 4.x DynamicCache.crop: absolute length, or a negative count to remove; never grows."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_seq_length(self) -> int:
        return self.n

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.n - abs(max_length)
        if self.n > max_length:
            self.n = max_length


class FakeCache5(FakeCache4):
    """transformers 5.x: only a negative count (or 0) of tokens to remove."""

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("Calling `crop` with a positive value is not supported")
        self.n -= abs(tokens_to_remove)


def _crop_helper():
    source = (FIXTURES / "after" / "crop-relative" / "dflash.py").read_text()
    start = source.index("def _ddops_crop_to")
    namespace: dict = {}
    exec(source[start:source.index("\n\n\n", start)], namespace)
    return namespace["_ddops_crop_to"]


@pytest.mark.parametrize("length, expected", [(3, 3), (0, 0), (5, 5), (9, 5)])
def test_crop_helper_crops_to_an_absolute_length_on_transformers_4_and_5(length, expected):
    crop_to = _crop_helper()
    absolute = FakeCache4(5)
    absolute.crop(length)  # what DDTree's cache.crop(length) did on 4.x
    assert absolute.n == expected
    for cache in (FakeCache4(5), FakeCache5(5)):
        crop_to(cache, length)
        assert cache.n == expected


def test_crop_helper_trims_recorded_states_at_the_exact_length_only_on_transformers_5():
    class RecordingCache5(FakeCache5):
        def __init__(self, n: int) -> None:
            super().__init__(n)
            self.crops: list[int] = []

        def activate_past_recording(self) -> None:
            pass

        def crop(self, tokens_to_remove: int) -> None:
            self.crops.append(tokens_to_remove)
            super().crop(tokens_to_remove)

    crop_to = _crop_helper()
    recording = RecordingCache5(5)
    crop_to(recording, 5)  # 5.x: crop(0) drops the linear layers' recorded past, keeps every token
    assert (recording.crops, recording.n) == ([0], 5)
    legacy = FakeCache4(5)
    crop_to(legacy, 5)  # 4.x: crop(0) would mean "keep 0 tokens", so it must not be called
    assert legacy.n == 5


@pytest.mark.torch
def test_crop_helper_on_a_real_transformers_dynamic_cache():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cache = transformers.DynamicCache()
    kv = torch.zeros(1, 2, 5, 4)
    cache.update(kv, kv.clone(), layer_idx=0)
    crop_to = _crop_helper()
    crop_to(cache, 9)
    assert cache.get_seq_length() == 5
    crop_to(cache, 3)
    assert cache.get_seq_length() == 3


@pytest.mark.skipif(not (MINI / "ddtree.py").exists(), reason="examples/mini-ddtree not there")
@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_playbook_applies_to_mini_ddtree_once(name):
    book = load_playbook(name)
    for path in book.files:
        source = (MINI / path).read_bytes()
        first = plan_file(path, source, patches_for(book, path))
        assert {r.state for r in first.results} == {PENDING}, [r.message for r in first.results]
        for patch in patches_for(book, path):
            assert all(r.ok for r in run_checks(path, source, first.new, patch.checks))
        second = plan_file(path, first.new, patches_for(book, path))
        assert {r.state for r in second.results} == {APPLIED}
        assert second.new == first.new


# --- the format -----------------------------------------------------------------------------------------------

def test_a_valid_playbook_loads_into_frozen_values(tmp_path):
    book = load_playbook(write(tmp_path, GOOD))
    patch = book.patches[0]
    assert (book.name, book.description, patch.id, patch.files) == ("demo", "a demo", "one", ("a.py",))
    assert patch.transform.kind == "replace_expression"
    assert dict(patch.transform.params) == {"match": "old()", "replace": "new()"}
    assert patch.transform.expect_for("a.py") == 1
    assert [c.kind for c in patch.checks] == ["compiles", "contains"]
    with pytest.raises(AttributeError):
        patch.id = "two"  # type: ignore[misc]


def test_a_path_loads_and_a_bare_name_searches_the_given_dirs(tmp_path):
    write(tmp_path, GOOD, "mine.yaml")
    assert load_playbook("mine", search_dirs=[tmp_path]).name == "demo"
    assert load_playbook(str(tmp_path / "mine.yaml")).name == "demo"
    with pytest.raises(PlaybookError, match=r"no playbook named 'hybrid-cach'.*did you mean 'hybrid-cache'"):
        load_playbook("hybrid-cach")


def test_unknown_top_level_key_names_file_line_and_suggests(tmp_path):
    message = error_of(tmp_path, GOOD + "patchs: []\n")
    assert message == f"{tmp_path / 'pb.yaml'}:8: patchs: unknown key (did you mean 'patches'?)"


def test_unknown_transform_param_is_an_error_with_its_line(tmp_path):
    text = GOOD.replace('replace: "new()"}', 'replace: "new()", in_fuction: f}')
    assert error_of(tmp_path, text).endswith(
        ":6: patches[0].transform.in_fuction: unknown param for replace_expression (did you mean 'in_function'?)"
        "; replace_expression takes: match, replace, in_function, not_in_function, expect")


def test_wrong_types_are_named(tmp_path):
    assert "patches[0].files: must be a list, not a string" in error_of(tmp_path, GOOD.replace("[a.py]", "a.py"))
    text = GOOD.replace('match: "old()"', "match: 3")
    assert "patches[0].transform.match: must be a string, not an integer" in error_of(tmp_path, text)


@pytest.mark.parametrize("path, why", [("/etc/passwd", "is absolute"), ("../x.py", "contains '..'"),
                                       ("a/../../x.py", "contains '..'"), (".ddops/journal.jsonl", "inside .ddops")])
def test_files_must_stay_inside_the_repo(tmp_path, path, why):
    message = error_of(tmp_path, GOOD.replace("[a.py]", f"['{path}']"))
    assert "patches[0].files[0]:" in message and why in message


def test_unknown_transform_kind_suggests_the_closest(tmp_path):
    message = error_of(tmp_path, GOOD.replace("kind: replace_expression", "kind: replace_expr"))
    assert "unknown transform kind 'replace_expr' (did you mean 'replace_expression'?)" in message


def test_a_missing_required_param_is_named(tmp_path):
    message = error_of(tmp_path, GOOD.replace(', replace: "new()"', ""))
    assert message.endswith(":6: patches[0].transform: replace_expression needs `replace:` "
                            "(its replacement; `$name` re-uses what was matched)")


def test_python_params_must_parse(tmp_path):
    message = error_of(tmp_path, GOOD.replace('match: "old()"', 'match: "old(("'))
    assert "patches[0].transform.match: not a Python expression" in message


def test_a_replacement_cannot_use_a_placeholder_the_match_does_not_bind(tmp_path):
    text = GOOD.replace('match: "old()", replace: "new()"', 'match: "f($a)", replace: "g($b)"')
    assert "uses $b, which `match` does not bind" in error_of(tmp_path, text)


def test_expect_per_file_must_name_the_patch_files(tmp_path):
    text = GOOD.replace('replace: "new()"}', 'replace: "new()", expect: {b.py: 2}}')
    assert "'b.py' is not one of this patch's files" in error_of(tmp_path, text)
    text = GOOD.replace('replace: "new()"}', 'replace: "new()", expect: 0}')
    assert "must be a positive integer" in error_of(tmp_path, text)


def test_checks_are_validated(tmp_path):
    assert "unknown check kind 'contain' (did you mean 'contains'?)" in error_of(
        tmp_path, GOOD.replace("{kind: contains", "{kind: contain"))
    assert "needs exactly one of `text:` or `regex:`" in error_of(
        tmp_path, GOOD.replace('{kind: contains, text: "new()"}', "{kind: absent}"))
    assert "invalid regular expression" in error_of(
        tmp_path, GOOD.replace('{kind: contains, text: "new()"}', "{kind: contains, regex: '('}"))
    assert "a count check needs `count:`" in error_of(
        tmp_path, GOOD.replace('{kind: contains, text: "new()"}', "{kind: count, text: x}"))


def test_requires_orders_patches_and_rejects_unknown_ids_and_cycles(tmp_path):
    two = GOOD + """
  - id: zero
    files: [a.py]
    transform: {kind: add_import, module: os}
"""
    book = load_playbook(write(tmp_path, two.replace("    checks:", "    requires: [zero]\n    checks:", 1)))
    assert [p.id for p in book.patches] == ["zero", "one"]
    message = error_of(tmp_path, two.replace("    checks:", "    requires: [zer]\n    checks:", 1))
    assert "patches[0].requires[0]: no patch 'zer' in this playbook (did you mean 'zero'?)" in message
    cyclic = two.replace("    checks:", "    requires: [zero]\n    checks:", 1) + "    requires: [one]\n"
    assert "requires form a cycle" in error_of(tmp_path, cyclic)
    assert "duplicate patch id 'one'" in error_of(tmp_path, two.replace("id: zero", "id: one"))


def test_a_bench_plan_is_not_taken_for_a_patch_playbook(tmp_path):
    assert "not a patch playbook" in error_of(tmp_path, "kind: bench\nname: x\n")
    assert "this is a bench plan" in error_of(tmp_path, "name: x\nsummarizer: ddtree\nresults: '*.pt'\n")


def test_the_playbook_module_does_not_import_libcst():
    code = "import sys, ddops.patching.playbook; sys.exit('libcst' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
