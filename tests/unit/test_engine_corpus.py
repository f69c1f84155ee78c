"""The prefilter (prefilter.py) gives exactly libcst's answer where it answers, and the libcst transforms apply
once on a corpus of real and generated files.

Every transform kind runs over the DDTree fixtures, the mini-ddtree files, their CRLF and tab-indented variants, and
generated call sites (comments, parentheses, multi-line calls, trailing commas, nested functions, decorators,
strings that contain the callee's name...). Wherever the prefilter answers, its Outcome (state, message, lines) must
equal the libcst transform's; where it declines, libcst runs, so the plan is the same anyway. Wherever libcst
patches a file, a second pass over its output finds the patch applied and changes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from ddops.patching import prefilter, transforms
from ddops.patching.kinds import APPLIED, DRIFTED, PENDING
from ddops.patching.plan import plan_file
from ddops.patching.playbook import Patch, load_playbook

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "ddtree"  # before/ and after/<playbook>/
MINI = ROOT / "examples" / "mini-ddtree"


def libcst_answer(kind: str, params: dict, expect: int, path: str, source: bytes, module: cst.Module | None):
    """What the libcst transform gives: (outcome, bytes); module is the parsed source (None: a syntax error)."""
    if module is None:
        return None
    try:
        outcome, new = transforms.transform_module(kind, dict(params), expect, module, path)
    except Exception:  # noqa: BLE001 - plan.py turns this into an ERROR outcome; the prefilter must decline then
        return "raised"
    return outcome, new.bytes if outcome.changes else source


def parsed(source: bytes) -> cst.Module | None:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError:
        return None


def compare(kind: str, params: dict, expect: int, path: str, source: bytes, module: cst.Module | None) -> bool:
    """Assert the prefilter agrees with libcst; True when it answered."""
    return check(kind, params, expect, path, source, module, twice=False)[1]


def check(kind: str, params: dict, expect: int, path: str, source: bytes, module: cst.Module | None,
          twice: bool = True) -> tuple[bool, bool]:
    """Assert that the prefilter agrees with libcst where it answers, and (twice) that where libcst patches the
    source a second pass finds it applied byte for byte; (libcst patched it, the prefilter answered)."""
    settled = prefilter.plan_without_libcst(kind, params, expect, path, source)
    if settled is None and not twice:
        return False, False
    answer = libcst_answer(kind, params, expect, path, source, module)
    if settled is not None:
        assert answer not in (None, "raised"), f"prefilter answered where libcst fails: {kind} {params}:\n{source!r}"
        assert settled == answer[0], f"{kind} {params} expect={expect} on\n{source.decode()}"
        assert answer[1] == source
    if not twice or answer in (None, "raised") or answer[0].state != PENDING:
        return False, settled is not None
    patched = answer[1]
    again = libcst_answer(kind, params, expect, path, patched, parsed(patched))
    assert again not in (None, "raised"), f"{kind} {params}: libcst's output does not parse:\n{patched.decode()}"
    assert again[0].state == APPLIED and again[1] == patched, f"{kind} {params} on\n{source.decode()}"
    return True, settled is not None


# --- sources ----------------------------------------------------------------------------------------------------

def real_files(everything: bool = False) -> dict[str, bytes]:
    """The DDTree fixtures before patching and mini-ddtree's patch targets (everything: every fixture and file)."""
    pattern = "*.py" if everything else "before/*.py"
    files = {f"fixture/{p.relative_to(FIXTURES)}": p.read_bytes() for p in sorted(FIXTURES.rglob(pattern))}
    names = sorted(MINI.rglob("*.py")) if everything else [MINI / "ddtree.py", MINI / "dflash.py"]
    files.update({f"mini/{p.relative_to(MINI)}": p.read_bytes() for p in names})
    return files


def variants(name: str, data: bytes) -> dict[str, bytes]:
    """The file as it is, with CRLF line ends, and indented with tabs."""
    out = {name: data, f"{name}[crlf]": data.replace(b"\n", b"\r\n")}
    tabbed = []
    for line in data.split(b"\n"):
        stripped = line.lstrip(b" ")
        indent = len(line) - len(stripped)
        tabbed.append(b"\t" * (indent // 4) + b" " * (indent % 4) + stripped)
    out[f"{name}[tabs]"] = b"\n".join(tabbed)
    return out


CALLS = [
    "DynamicCache()", "DynamicCache( )", "DynamicCache(\n    )", "DynamicCache(a)", "DynamicCache(a )",
    "DynamicCache(a, )", "DynamicCache(a ,)", "DynamicCache(a , b ,)", "DynamicCache(a,b,)",
    "DynamicCache(\n        a,\n        b,\n    )", "DynamicCache(\n        a,\n    )",
    "DynamicCache(\n        a\n    )",
    "DynamicCache(  # comment\n    )", "DynamicCache(a  # c\n    )", "DynamicCache(a,  # c\n    )",
    "DynamicCache(a, # x\n        b # y\n    )", "DynamicCache((a))", "DynamicCache((a) , (b) ,)",
    "DynamicCache(( a ) )",
    "DynamicCache(*args, **kw)", "DynamicCache(*a , **b )", "DynamicCache(a, *rest)", "DynamicCache(config=None)",
    "DynamicCache(config = None)", "DynamicCache(config=(None))", "DynamicCache(config=(  None ))",
    "DynamicCache(config=  # c\n        None)", "DynamicCache(a, config=None, b=2)", "DynamicCache(config=None,)",
    "DynamicCache(config=target.config if hasattr(target, \"config\") else None)",
    "DynamicCache(config=target.config if hasattr(target, 'config') else None)",
    "DynamicCache(config = (target.config)  if hasattr(target, u'config') else (None))",
    "DynamicCache(config=target.config if hasattr(target, 'con' 'fig') else None)",
    "DynamicCache(config=target.config if hasattr(target, f'config') else None)",
    "DynamicCache(config=1_0)", "DynamicCache(config=10)", "DynamicCache(config=0xA)",
    "DynamicCache(config=x[a,])", "DynamicCache(config=x[a])", "DynamicCache(config=a and b and c)",
    "DynamicCache(config=(a and b) and c)", "DynamicCache(config=f(*a, k=1))", "DynamicCache(config=[1, 2,])",
    "(DynamicCache())", "(\n        DynamicCache()\n    )", "DynamicCache() # DynamicCache()",
    "DynamicCache \\\n        ()",
    "DynamicCache(x for x in y)", "DynamicCache((x for x in y))", "DynamicCache(DynamicCache())",
    "DynamicCache(config=DynamicCache())", "transformers.DynamicCache()", "cache_utils.DynamicCache(a)",
    "DynamicCache(a)(b)", "DynamicCache(\"DynamicCache()\")", "DynamicCache(a=1, **{'config': None})",
    "DynamicCache(config=None)  # config", "DynamicCache(λ)", "DynamicCache(config='é')", "(DynamicCache)()",
    "(\n        DynamicCache\n    )()", "DynamicCache(a)  # τ → the acceptance length",
]

WRAPPERS = [
    "def generate(target):\n    past_key_values_target = {call}\n    past_key_values_draft = DynamicCache()\n",
    "def generate(target):\n    x = 1\n    def inner():\n        past_key_values_target = {call}\n        return 1\n"
    "    return inner\n",
    "async def generate(target):\n    past_key_values_target: Cache = {call}\n",
    "class C:\n    @staticmethod\n    def generate(target=lambda: {call}):\n"
    "        past_key_values_target = y = {call}\n",
    "@decorate({call})\ndef generate(target):\n    a, past_key_values_target = {call}, 2\n",
    "# comment about DynamicCache()\ns = 'past_key_values_target = DynamicCache()'\n"
    "past_key_values_target = {call}\n",
    "def generate(target):\n    if x:\n        past_key_values_target = {call}\n    else:\n"
    "        past_key_values_target = {call}\n",
    "def generate(target):\n    past_key_values_target = {call}; other = DynamicCache()\n",
    "past_key_values_target = {call}",
    "# Unicode elsewhere: τ → ∞\ndef generate(target):\n    past_key_values_target = {call}\n",
    "def generate(target):\n    past_key_values_target = {call}\n"
    "def ｇenerate():\n    ｐast_key_values_target = {call}\n",
]

VALUES = ['target.config if hasattr(target, "config") else None', "None", "10", "'fast'", "(a)", "[1, 2,]",
          "f(*a, k=1)", "x[a,]", "a and b and c", "f'x'", "u'x'", "$v", "0xA"]

SET_CALL_KWARG = [
    dict(callee="DynamicCache", keyword="config", assigned_to="past_key_values_target", value=VALUES[0]),
    dict(callee="DynamicCache", keyword="config", value=VALUES[0]),
    dict(callee="DynamicCache", keyword="config", value="None", in_function="generate"),
    dict(callee="DynamicCache", keyword="config", value="None", in_function="inner"),
    dict(callee="DynamicCache", keyword="config", value="None", not_in_function="inner"),
    dict(callee="DynamicCache", keyword="config", value="None", assigned_to="past_key_values_target",
         in_function="generate"),
    dict(callee="cache_utils.DynamicCache", keyword="config", value="None"),
    dict(callee="DynamicCache", keyword="a", value="1"),
    *[dict(callee="DynamicCache", keyword="config", assigned_to="past_key_values_target", value=v)
      for v in VALUES[1:]],
]

OTHER_KINDS = [
    ("replace_expression", dict(match="$cache.crop($length)", replace="_ddops_crop_to($cache, $length)")),
    ("replace_expression", dict(match="$cache.crop($length)", replace="_ddops_crop_to($cache, $length)",
                                not_in_function="_ddops_crop_to")),
    ("replace_expression", dict(match="old_name(x)", replace="new_name(x)")),
    ("replace_expression", dict(match="$a + $b", replace="add($a, $b)")),
    ("wrap_statement_in_if", dict(statement="torch.cuda.synchronize()", condition="torch.cuda.is_available()",
                                  in_function="cuda_time")),
    ("wrap_statement_in_if", dict(statement="nowhere_to_be_found()", condition="flag")),
    ("wrap_statement_in_if", dict(statement="a = 1; b = 2", condition="flag")),
    ("insert_statement", dict(anchor="past_key_values_draft = DynamicCache()", position="after",
                              statement="if hasattr(past_key_values_target, 'activate_past_recording'):\n"
                                        "    past_key_values_target.activate_past_recording()\n")),
    ("insert_statement", dict(anchor="def missing_function(x):", statement="y = 1; z = 2")),
    ("insert_statement", dict(anchor="unfound_anchor = 1", statement="def helper():\n    pass\n", position="before")),
    ("insert_statement", dict(position="after_imports", statement="import os")),
    ("add_import", dict(module="os")),
    ("add_import", dict(module="torch", name="nothing_like_this")),
]


ODD_FILES = {
    "syntax-error": b"def generate(:\n    past_key_values_target = DynamicCache()\n",
    "not-utf8-cookie": b"# -*- coding: latin-1 -*-\npast_key_values_target = DynamicCache()\n",
    "bom": b"\xef\xbb\xbfpast_key_values_target = DynamicCache()\n",
    "lone-cr": b"x = 1\rpast_key_values_target = DynamicCache()\n",
    "empty": b"",
    "no-final-newline": b"past_key_values_target = DynamicCache()",
    "invalid-escape": b"s = '\\d'\npast_key_values_target = DynamicCache()\n",
}


def snippet(wrapper: int, call: str) -> bytes:
    return WRAPPERS[wrapper].replace("{call}", call).encode()


# --- the tests --------------------------------------------------------------------------------------------------

def test_set_call_kwarg_applies_once_on_every_generated_call_site_and_the_prefilter_agrees():
    # every layout with the structural specs; the scoping wrappers with a sample of layouts; every value where a
    # keyword is already there (applied or not)
    cases = [(0, call, params, expect) for call in CALLS for i, params in enumerate(SET_CALL_KWARG[:8])
             for expect in ((1, 2) if i < 2 else (1,))]
    cases += [(w, call, params, 1) for w in range(1, len(WRAPPERS)) for call in CALLS[::4]
              for params in (SET_CALL_KWARG[i] for i in (0, 2, 3, 4))]
    cases += [(0, call, params, 1) for call in CALLS if "config" in call for params in SET_CALL_KWARG[8:]]
    patched = settled = 0
    for wrapper, call, params, expect in cases:
        source = snippet(wrapper, call)
        module = parsed(source)
        once, answered = check("set_call_kwarg", params, expect, "m.py", source, module)
        patched, settled = patched + once, settled + answered
    assert patched >= len(CALLS)  # the corpus exercises the transform, not only its guard
    assert settled > 0  # `cache_utils.DynamicCache` and `inner` are absent from most sites


def test_the_prefilter_declines_files_libcst_reads_otherwise_or_rejects():
    absent = dict(match="old_name(x)", replace="new_name(x)")
    for name, source in ODD_FILES.items():
        answered = compare("replace_expression", absent, 1, "m.py", source, parsed(source))
        assert answered == (name in ("empty", "no-final-newline", "invalid-escape")), name


def test_set_call_kwarg_applies_once_on_the_ddtree_files_and_their_variants_and_the_prefilter_agrees():
    patched = settled = 0
    sources = real_files(everything=True)
    for name, data in real_files().items():
        sources.update(variants(name, data))
    targets = real_files()
    for name, source in sources.items():
        module = parsed(source)
        for params in SET_CALL_KWARG[:3] if name in targets else SET_CALL_KWARG[:1]:
            once, answered = check("set_call_kwarg", params, 1, Path(name).name, source, module)
            patched, settled = patched + once, settled + answered
    assert patched >= 3 and settled > 0  # ddtree.py and its variants are patched; files without the callee are not


def test_other_kinds_prefilter_equals_libcst_where_it_answers():
    answered = 0
    sources = {**real_files(), **ODD_FILES, **{f"call-{i}": snippet(0, c) for i, c in enumerate(CALLS[::3])}}
    for source in sources.values():
        module = parsed(source)
        for kind, params in OTHER_KINDS:
            for expect in (1, 4):
                answered += compare(kind, params, expect, "m.py", source, module)
    assert answered >= len(sources)  # files without `.crop(`, `old_name`, `nowhere_to_be_found`...


@pytest.mark.parametrize("playbook", ["hybrid-cache", "crop-relative", "cpu-timing", "hybrid-tree-verify"])
def test_built_in_playbooks_plan_the_same_bytes_and_outcomes_with_and_without_the_prefilter(playbook, monkeypatch):
    patches = load_playbook(ROOT / "playbooks" / f"{playbook}.yaml").patches
    files = {**real_files()}
    if playbook == "hybrid-cache":
        for name, data in list(files.items()):
            files.update(variants(name, data))
    for name, source in files.items():
        path = Path(name.split("[")[0]).name
        touching = [p for p in patches if path in p.files] or [
            Patch(p.id, p.description, (path,), p.transform, p.checks, p.requires) for p in patches]
        monkeypatch.delenv("DDOPS_PLAN_ENGINE", raising=False)
        fast = plan_file(path, source, touching)
        monkeypatch.setenv("DDOPS_PLAN_ENGINE", "libcst")
        slow = plan_file(path, source, touching)
        assert fast == slow, name


def test_a_file_without_the_patch_s_names_is_planned_without_importing_libcst():
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ddops.patching.plan import plan_file\n"
        "from ddops.patching.playbook import load_playbook\n"
        "patches = load_playbook(Path('playbooks/hybrid-cache.yaml')).patches\n"
        "plan = plan_file('ddtree.py', b'import os\\n', patches)\n"
        "print(plan.state, plan.changed, 'libcst' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [DRIFTED, "False", "False"]


def test_the_prefilter_declines_a_syntax_error_so_libcst_words_it():
    source = b"def generate(:\n    past_key_values_target = DynamicCache()\n"
    assert prefilter.plan_without_libcst("set_call_kwarg", SET_CALL_KWARG[6], 1, "m.py", source) is None
    assert prefilter.plan_without_libcst("replace_expression", dict(OTHER_KINDS[2][1]), 1, "m.py", source) is None


def test_a_file_without_the_anchor_names_is_drifted_without_a_parse_by_libcst():
    outcome = prefilter.plan_without_libcst("replace_expression", dict(match="old_name(x)", replace="new_name(x)"),
                                            1, "m.py", b"x = 1\n")
    assert outcome.state == DRIFTED
    assert outcome.message == "m.py: `old_name(x)` not found, patched or not: the code changed upstream"
