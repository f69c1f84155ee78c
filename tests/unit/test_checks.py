"""Checks: grep-style proof over the file's bytes after a patch."""

from __future__ import annotations

from ddops.patching.checks import host_checks, run_checks
from ddops.patching.playbook import CheckSpec

BEFORE = b"import torch\n\ncache = DynamicCache()\ndraft = DynamicCache()\n"
AFTER = b"import torch\n\ncache = DynamicCache(config=cfg)\ndraft = DynamicCache()\n"


def one(check: CheckSpec, after: bytes = AFTER, before: bytes | None = BEFORE, path: str = "m.py"):
    [result] = run_checks(path, before, after, [check])
    return result


def test_contains_reports_matching_lines_like_grep():
    result = one(CheckSpec("contains", text="DynamicCache("))
    assert result.ok
    assert result.matches == ((3, "cache = DynamicCache(config=cfg)"), (4, "draft = DynamicCache()"))
    assert result.grep_lines() == ["m.py:3: cache = DynamicCache(config=cfg)", "m.py:4: draft = DynamicCache()"]


def test_contains_fails_when_nothing_matches():
    result = one(CheckSpec("contains", text="StaticCache"))
    assert not result.ok and result.matches == () and "not found" in result.message


def test_contains_takes_a_regex():
    result = one(CheckSpec("contains", regex=r"^cache = \w+\(config="))
    assert result.ok and result.matches == ((3, "cache = DynamicCache(config=cfg)"),)


def test_contains_with_several_lines_of_text_matches_across_lines():
    result = one(CheckSpec("contains", text="import torch\n\ncache ="))
    assert result.ok and result.matches == ((1, "import torch"),)


def test_absent_passes_when_nothing_matches_and_shows_what_did():
    assert one(CheckSpec("absent", text="cache = DynamicCache()")).ok
    result = one(CheckSpec("absent", text="draft = DynamicCache()"))
    assert not result.ok
    assert result.message == "m.py:4: 'draft = DynamicCache()' still present (1)"


def test_unchanged_wants_the_same_lines_as_before():
    assert one(CheckSpec("unchanged", text="draft = DynamicCache()")).ok
    edited = AFTER.replace(b"draft = DynamicCache()", b"draft = DynamicCache(x=1)")
    result = one(CheckSpec("unchanged", text="draft ="), after=edited)
    assert not result.ok
    assert "was 'draft = DynamicCache()'" in result.message and "now 'draft = DynamicCache(x=1)'" in result.message


def test_unchanged_catches_a_reindented_line():
    moved = AFTER.replace(b"draft =", b"    draft =")
    assert not one(CheckSpec("unchanged", text="draft = DynamicCache()"), after=moved).ok


def test_unchanged_without_a_before_only_needs_the_line_present():
    result = one(CheckSpec("unchanged", text="draft = DynamicCache()"), before=None)
    assert result.ok and "no earlier version" in result.message


def test_count_counts_occurrences_not_lines():
    assert one(CheckSpec("count", text="DynamicCache(", count=2)).ok
    result = one(CheckSpec("count", text="Cache", count=1), after=b"a = Cache(); b = Cache()\n")
    assert not result.ok and result.message == "found 2, expected 1"


def test_compiles_reports_the_file_and_line_of_a_syntax_error():
    assert one(CheckSpec("compiles")).ok
    result = one(CheckSpec("compiles"), after=b"x = 1\ndef f(:\n", path="ddtree.py")
    assert not result.ok and result.message.startswith("ddtree.py:2: ")


def test_crlf_files_match_without_the_carriage_return():
    result = one(CheckSpec("contains", regex=r"\(config=cfg\)$"), after=AFTER.replace(b"\n", b"\r\n"))
    assert result.ok and result.matches == ((3, "cache = DynamicCache(config=cfg)"),)


def test_command_checks_are_carried_for_the_host_not_run_here():
    command = CheckSpec("command", run="python -c 'import ddtree'", timeout=30)
    assert run_checks("m.py", BEFORE, AFTER, [command, CheckSpec("compiles")])[0].name == "compiles"
    assert host_checks([command, CheckSpec("compiles")], "m.py") == [command]
    assert command.runs_on_host and command.timeout == 30


def test_a_check_scoped_to_one_file_is_skipped_for_the_others():
    scoped = CheckSpec("contains", text="nothing", file="other.py")
    assert run_checks("m.py", BEFORE, AFTER, [scoped]) == []
    assert not run_checks("other.py", BEFORE, AFTER, [scoped])[0].ok


def test_results_carry_a_readable_name():
    assert one(CheckSpec("contains", text="x")).name == "contains 'x'"
    assert one(CheckSpec("count", regex="x", count=0)).name == "count /x/ == 0"
    assert one(CheckSpec("compiles", label="it builds")).name == "it builds"
