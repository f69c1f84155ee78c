"""Every transform kind: before -> after, applied twice (the second run changes nothing), drift and ambiguity."""

from __future__ import annotations

from types import MappingProxyType

from ddops.patching.kinds import AMBIGUOUS, APPLIED, DRIFTED, ERROR, PARTIAL, PENDING, Outcome
from ddops.patching.plan import plan_file
from ddops.patching.playbook import Patch, TransformSpec


def run(kind: str, source: str | bytes, expect: int = 1, path: str = "m.py", **params) -> tuple[Outcome, bytes]:
    data = source.encode() if isinstance(source, str) else source
    patch = Patch(id="p", description="", files=(path,),
                  transform=TransformSpec(kind, MappingProxyType(params), expect))
    plan = plan_file(path, data, [patch])
    return plan.results[0].outcome, plan.new


def assert_applies_once(kind: str, before: str, after: str, expect: int = 1, **params) -> None:
    """before -> after (pending), then after -> after (applied, byte for byte)."""
    first, patched = run(kind, before, expect, **params)
    assert first.state == PENDING, first.message
    assert patched.decode() == after
    second, again = run(kind, patched, expect, **params)
    assert second.state == APPLIED, second.message
    assert again == patched


# --- set_call_kwarg -------------------------------------------------------------------------------------------

HYBRID = dict(callee="DynamicCache", keyword="config", assigned_to="past_key_values_target",
              value='target.config if hasattr(target, "config") else None')


def test_set_call_kwarg_adds_keyword_only_to_the_named_assignment():
    before = (
        "def generate(target):\n"
        "    past_key_values_target = DynamicCache()\n"
        "    past_key_values_draft = DynamicCache()\n"
    )
    after = (
        "def generate(target):\n"
        '    past_key_values_target = DynamicCache(config=target.config if hasattr(target, "config") else None)\n'
        "    past_key_values_draft = DynamicCache()\n"
    )
    assert_applies_once("set_call_kwarg", before, after, **HYBRID)


def test_set_call_kwarg_recognises_the_applied_form_despite_other_quotes_and_spacing():
    source = ("x = 1\n"
              "past_key_values_target = DynamicCache(config = target.config if hasattr(target, 'config') else None)\n")
    outcome, new = run("set_call_kwarg", source, **HYBRID)
    assert outcome.state == APPLIED
    assert new == source.encode()


def test_set_call_kwarg_sets_a_keyword_that_has_another_value():
    outcome, new = run("set_call_kwarg", "c = f(1, mode='slow')\n", callee="f", keyword="mode", value="'fast'")
    assert outcome.state == PENDING
    assert new == b"c = f(1, mode='fast')\n"


def test_set_call_kwarg_appends_after_positional_args_and_keeps_a_one_per_line_layout():
    before = "c = make(\n    a,\n    b,\n)\n"
    after = "c = make(\n    a,\n    b,\n    config=cfg,\n)\n"
    assert_applies_once("set_call_kwarg", before, after, callee="make", keyword="config", value="cfg")
    assert_applies_once("set_call_kwarg", "c = make(a, b)\n", "c = make(a, b, config=cfg)\n",
                        callee="make", keyword="config", value="cfg")


def test_set_call_kwarg_gives_a_bare_generator_argument_its_parentheses():
    assert_applies_once("set_call_kwarg", "c = DynamicCache(x for x in y)\n",
                        "c = DynamicCache((x for x in y), config=None)\n",
                        callee="DynamicCache", keyword="config", value="None")


def test_set_call_kwarg_matches_dotted_callees_and_respects_in_function():
    before = (
        "def a():\n    x = torch.zeros(3)\n\n"
        "def b():\n    x = torch.zeros(3)\n"
    )
    after = (
        "def a():\n    x = torch.zeros(3)\n\n"
        "def b():\n    x = torch.zeros(3, device=dev)\n"
    )
    assert_applies_once("set_call_kwarg", before, after, callee="torch.zeros", keyword="device", value="dev",
                        in_function="b")


def test_set_call_kwarg_without_a_target_changes_every_call_and_expects_that_many():
    before = "a = f()\nb = f()\n"
    after = "a = f(k=1)\nb = f(k=1)\n"
    assert_applies_once("set_call_kwarg", before, after, expect=2, callee="f", keyword="k", value="1")


def test_two_sites_where_one_is_expected_is_ambiguous_and_changes_nothing():
    source = "past_key_values_target = DynamicCache()\npast_key_values_target = DynamicCache()\n"
    outcome, new = run("set_call_kwarg", source, **HYBRID)
    assert outcome.state == AMBIGUOUS
    assert "lines 1, 2" in outcome.message and "expected 1" in outcome.message
    assert new == source.encode()


def test_no_site_at_all_is_drifted_never_a_silent_no_op():
    source = "past_key_values_target = StaticCache()\n"
    outcome, new = run("set_call_kwarg", source, **HYBRID)
    assert outcome.state == DRIFTED
    assert "changed upstream" in outcome.message
    assert new == source.encode()


def test_fewer_sites_than_expected_is_drifted():
    outcome, new = run("set_call_kwarg", "a = f()\n", expect=2, callee="f", keyword="k", value="1")
    assert outcome.state == DRIFTED
    assert "1 of 2" in outcome.message
    assert new == b"a = f()\n"


def test_some_sites_applied_and_some_not_is_partial_and_applies_the_rest():
    source = "a = f(k=1)\nb = f()\n"
    outcome, new = run("set_call_kwarg", source, expect=2, callee="f", keyword="k", value="1")
    assert outcome.state == PARTIAL
    assert outcome.applied_lines == (1,) and outcome.pending_lines == (2,)
    assert new == b"a = f(k=1)\nb = f(k=1)\n"
    assert run("set_call_kwarg", new, expect=2, callee="f", keyword="k", value="1")[0].state == APPLIED


# --- replace_expression ---------------------------------------------------------------------------------------

def test_replace_expression_with_placeholders_rewrites_each_match():
    before = "def f(c, n):\n    c.crop(n)\n    c.crop( n + 1 )  # note\n"
    after = "def f(c, n):\n    crop_to(c, n)\n    crop_to(c, n + 1)  # note\n"
    assert_applies_once("replace_expression", before, after, expect=2, match="$cache.crop($n)",
                        replace="crop_to($cache, $n)")


def test_replace_expression_without_placeholders_matches_up_to_layout():
    before = "x = torch.cuda.synchronize( )\n"
    after = "x = sync()\n"
    assert_applies_once("replace_expression", before, after, match="torch.cuda.synchronize()", replace="sync()")


def test_replace_expression_is_idempotent_when_the_replacement_contains_the_match():
    before = "data = load(path)\n"
    after = "data = cached(load(path))\n"
    assert_applies_once("replace_expression", before, after, match="load($p)", replace="cached(load($p))")


def test_replace_expression_adds_parentheses_where_precedence_needs_them():
    outcome, new = run("replace_expression", "y = x * f(a - b)\n", match="f($v)", replace="$v + 1")
    assert new == b"y = x * ((a - b) + 1)\n"
    outcome, new = run("replace_expression", "y = g(f(a))\n", match="f($v)", replace="$v + 1")
    assert new == b"y = g(a + 1)\n"


def test_a_placeholder_used_twice_must_match_the_same_code_both_times():
    outcome, new = run("replace_expression", "a = x - x\nb = x - y\n", match="$v - $v", replace="0")
    assert outcome.state == PENDING
    assert new == b"a = 0\nb = x - y\n"


def test_replace_expression_skips_code_inside_not_in_function():
    before = "def helper(c):\n    c.crop(-1)\n\ndef main(c):\n    c.crop(3)\n"
    after = "def helper(c):\n    c.crop(-1)\n\ndef main(c):\n    helper(c)\n"
    assert_applies_once("replace_expression", before, after, match="$c.crop($n)", replace="helper($c)",
                        not_in_function="helper")


def test_replace_expression_respects_in_function():
    before = "def a():\n    return 1\n\ndef b():\n    return 1\n"
    after = "def a():\n    return 1\n\ndef b():\n    return 2\n"
    assert_applies_once("replace_expression", before, after, match="1", replace="2", in_function="b")


# --- insert_statement -----------------------------------------------------------------------------------------

def test_insert_statement_after_an_anchor_inside_a_function():
    before = "def f():\n    x = 1\n    return x\n"
    after = "def f():\n    x = 1\n    x += 1\n    return x\n"
    assert_applies_once("insert_statement", before, after, anchor="x = 1", statement="x += 1", in_function="f")


def test_insert_statement_before_an_anchor_keeps_the_anchors_comment_with_it():
    before = "def f():\n    # the result\n    return x\n"
    after = "def f():\n    log(x)\n    # the result\n    return x\n"
    assert_applies_once("insert_statement", before, after, anchor="return x", statement="log(x)",
                        position="before")


def test_insert_statement_before_a_def_header_anchor_with_pep8_blank_lines():
    before = "import time\n\n\ndef cuda_time() -> float:\n    return time.perf_counter()\n"
    after = ("import time\n\n\ndef helper():\n    return 1\n\n\n"
             "def cuda_time() -> float:\n    return time.perf_counter()\n")
    assert_applies_once("insert_statement", before, after, anchor="def cuda_time() -> float:",
                        statement="def helper():\n    return 1\n", position="before")


def test_insert_statement_after_imports_adds_a_helper_once():
    before = '"""Doc."""\nimport os\nfrom x import y\n\n\nA = 1\n'
    after = ('"""Doc."""\nimport os\nfrom x import y\n\n\ndef helper(n):\n    return n\n\n\nA = 1\n')
    assert_applies_once("insert_statement", before, after, position="after_imports",
                        statement="def helper(n):\n    return n\n")


def test_insert_statement_writes_a_multi_line_string_with_a_crlf_files_line_endings():
    before = "import os\r\n\r\n\r\nA = 1\r\n"
    after = 'import os\r\n\r\n\r\ndef helper(n):\r\n    """Two\r\n    lines."""\r\n    return n\r\n\r\n\r\nA = 1\r\n'
    assert_applies_once("insert_statement", before, after, position="after_imports",
                        statement='def helper(n):\n    """Two\n    lines."""\n    return n\n')


def test_insert_statement_after_imports_refuses_a_different_definition_of_the_same_name():
    source = "import os\n\n\ndef helper(n):\n    return n + 1\n"
    outcome, new = run("insert_statement", source, position="after_imports",
                       statement="def helper(n):\n    return n\n")
    assert outcome.state == DRIFTED
    assert "already defines helper differently" in outcome.message
    assert new == source.encode()


def test_insert_statement_at_every_anchor_when_expect_says_so():
    before = "def f():\n    a()\n    a()\n"
    after = "def f():\n    a()\n    b()\n    a()\n    b()\n"
    assert_applies_once("insert_statement", before, after, expect=2, anchor="a()", statement="b()")


# --- wrap_statement_in_if -------------------------------------------------------------------------------------

CPU = dict(statement="torch.cuda.synchronize()", condition="torch.cuda.is_available()", in_function="cuda_time")


def test_wrap_statement_in_if_guards_the_statement_and_keeps_its_comments():
    before = (
        "def cuda_time() -> float:\n"
        "    # wait for the GPU\n"
        "    torch.cuda.synchronize()  # blocking\n"
        "    return time.perf_counter()\n"
    )
    after = (
        "def cuda_time() -> float:\n"
        "    # wait for the GPU\n"
        "    if torch.cuda.is_available():\n"
        "        torch.cuda.synchronize()  # blocking\n"
        "    return time.perf_counter()\n"
    )
    assert_applies_once("wrap_statement_in_if", before, after, **CPU)


def test_wrap_statement_in_if_leaves_other_functions_alone():
    source = "def warmup():\n    torch.cuda.synchronize()\n"
    outcome, new = run("wrap_statement_in_if", source, **CPU)
    assert outcome.state == DRIFTED
    assert new == source.encode()


def test_wrap_statement_in_if_sees_a_one_line_guard_as_applied():
    source = "def cuda_time():\n    if torch.cuda.is_available(): torch.cuda.synchronize()\n    return 0\n"
    outcome, new = run("wrap_statement_in_if", source, **CPU)
    assert outcome.state == APPLIED
    assert new == source.encode()


# --- add_import -----------------------------------------------------------------------------------------------

def test_add_import_goes_after_the_existing_imports():
    before = '"""Doc."""\nimport os\n\nx = 1\n'
    after = '"""Doc."""\nimport os\nimport numpy as np\n\nx = 1\n'
    assert_applies_once("add_import", before, after, module="numpy", alias="np")


def test_add_import_extends_an_existing_from_import():
    before = "from transformers import AutoModelForCausalLM\n\nx = 1\n"
    after = "from transformers import AutoModelForCausalLM, DynamicCache\n\nx = 1\n"
    assert_applies_once("add_import", before, after, module="transformers", name="DynamicCache")


def test_add_import_in_a_file_without_imports_keeps_its_header_comment_on_top():
    before = "# Copyright\nx = 1\n"
    after = "# Copyright\nimport torch\nx = 1\n"
    assert_applies_once("add_import", before, after, module="torch")


def test_add_import_sees_an_existing_import_as_applied():
    outcome, _ = run("add_import", "import os, torch\n", module="torch")
    assert outcome.state == APPLIED


# --- text_replace ---------------------------------------------------------------------------------------------

def test_text_replace_works_on_any_file_and_says_it_matched_plain_text():
    before = "torchrun --nproc_per_node=8 benchmark.py\n"
    after = "torchrun --nproc_per_node=${NPROC:-8} benchmark.py\n"
    first, patched = run("text_replace", before, path="run_benchmark.sh", old="--nproc_per_node=8",
                         new="--nproc_per_node=${NPROC:-8}")
    assert first.state == PENDING and first.plain_text
    assert patched.decode() == after
    second, again = run("text_replace", patched, path="run_benchmark.sh", old="--nproc_per_node=8",
                        new="--nproc_per_node=${NPROC:-8}")
    assert second.state == APPLIED and second.plain_text
    assert again == patched


def test_text_replace_is_idempotent_when_the_new_text_contains_the_old():
    assert_applies_once("text_replace", "flags = -O2\n", "flags = -O2 -g\n", old="-O2", new="-O2 -g")


def test_text_replace_keeps_crlf_line_endings_for_multi_line_text():
    before = b"a\r\nb\r\nc\r\n"
    outcome, new = run("text_replace", before, path="x.txt", old="a\nb\n", new="a\nB\n")
    assert outcome.state == PENDING
    assert new == b"a\r\nB\r\nc\r\n"


def test_text_replace_twice_in_a_file_that_expects_one_is_ambiguous():
    outcome, new = run("text_replace", "x\nx\n", path="t.txt", old="x", new="y")
    assert outcome.state == AMBIGUOUS
    assert new == b"x\nx\n"


# --- bytes the transforms must not disturb --------------------------------------------------------------------

def test_crlf_files_stay_crlf_including_the_new_lines():
    before = "def cuda_time():\r\n    torch.cuda.synchronize()\r\n    return 0\r\n"
    after = ("def cuda_time():\r\n    if torch.cuda.is_available():\r\n        torch.cuda.synchronize()\r\n"
             "    return 0\r\n")
    assert_applies_once("wrap_statement_in_if", before, after, **CPU)


def test_tab_indented_files_get_tab_indented_new_blocks():
    before = "def cuda_time():\n\ttorch.cuda.synchronize()\n\treturn 0\n"
    after = "def cuda_time():\n\tif torch.cuda.is_available():\n\t\ttorch.cuda.synchronize()\n\treturn 0\n"
    assert_applies_once("wrap_statement_in_if", before, after, **CPU)


def test_a_file_without_a_final_newline_keeps_it_that_way():
    outcome, new = run("replace_expression", "x = old()", match="old()", replace="new()")
    assert new == b"x = new()"


def test_every_byte_outside_the_site_is_kept():
    before = (
        "#!/usr/bin/env python\n# -*- coding: utf-8 -*-\nimport   os  # spaced\n\n\n\n"
        "def f( a,b ):\n    '''doc'''\n    x = DynamicCache()   # trailing\n\n\n    return  (a+b)\n"
    )
    outcome, new = run("set_call_kwarg", before, callee="DynamicCache", keyword="config", value="None")
    assert outcome.state == PENDING
    assert new.decode() == before.replace("DynamicCache()", "DynamicCache(config=None)")


def test_a_syntax_error_in_the_target_is_an_error_outcome_with_file_and_line():
    outcome, new = run("set_call_kwarg", "x = 1\ndef broken(:\n", path="ddtree.py", **HYBRID)
    assert outcome.state == ERROR
    assert outcome.message.startswith("ddtree.py:2:")
    assert "syntax error" in outcome.message
    assert new == b"x = 1\ndef broken(:\n"


def test_a_non_utf8_file_is_a_clean_error_outcome():
    source = b"x = 1\n# caf\xe9\n"
    for kind, params in (("set_call_kwarg", HYBRID), ("text_replace", {"old": "x", "new": "y"})):
        outcome, new = run(kind, source, **params)
        assert outcome.state == ERROR
        assert outcome.message.startswith("m.py:2: not valid UTF-8")
        assert new == source
