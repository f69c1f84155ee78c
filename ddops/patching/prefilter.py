"""A speed trick beside the libcst transforms: the prefilter. Deleting this module (and plan.py's one call of it)
leaves a correct, slower planner.

libcst is slow to import and to run (benchmarks/fleet-speed/RESULTS.md); CPython's own parser reads the same file
far faster. So before a Python transform runs with libcst, the prefilter asks whether the file's text can contain a
site at all (every site needs certain names, e.g. the callee's); when it cannot, and `ast` parses the file, the
outcome is libcst's `not found` without libcst. It returns None whenever it could disagree with the libcst transform
(a syntax error, whose message libcst words; an encoding libcst would read otherwise), and the caller then runs
libcst: the outcome never depends on which ran. tests/unit/test_engine_corpus.py holds the two to the same outcomes."""

from __future__ import annotations

import ast
import re
import textwrap
import threading
import warnings
from collections.abc import Mapping
from typing import Any

from ddops.patching.kinds import Outcome, decide, describe, is_header, substitute_placeholders

# ---------------------------------------------------------------------------------------------------------------
# Parsing the file with the standard library.

class Decline(Exception):
    """The prefilter cannot vouch for libcst's answer here: run the libcst transform."""


_PARSE_LOCK = threading.Lock()
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def parse(source: bytes) -> ast.Module:
    """The file's stdlib syntax tree, or Decline where libcst might read the file differently."""
    if source.startswith(b"\xef\xbb\xbf") or source.count(b"\r") != source.count(b"\r\n"):
        raise Decline("byte-order mark or lone CR")  # left to libcst, which reads them its own way
    for line in source.split(b"\n", 2)[:2]:
        m = _CODING.match(line)
        if m and m.group(1).lower().replace(b"_", b"-") not in (b"utf-8", b"utf8"):
            raise Decline("declared encoding")  # libcst would decode (and re-encode) the file with it
    try:
        # ast.parse may warn (invalid escapes); warnings' filters are process-wide, hence the lock.
        with _PARSE_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Decline(f"stdlib parser: {exc}") from None  # libcst words the error (and its position) itself


# ---------------------------------------------------------------------------------------------------------------
# The names any site needs.

_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
             ast.With, ast.AsyncWith, ast.Try, ast.Match) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


def _is_compound(stmt: ast.stmt) -> bool:
    return isinstance(stmt, _COMPOUND)


def _names(text: str, mode: str) -> set[str]:
    """Identifiers (names, attributes, def/class/argument names) in a pattern; placeholders excluded."""
    source, _ = substitute_placeholders(textwrap.dedent(text).strip())
    if mode == "statement":  # an anchor: a statement, or a compound statement's header alone
        if is_header(source):
            source += "\n    pass"
        mode = "exec"
    tree = ast.parse(source + ("\n" if mode != "eval" else ""), mode=mode)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return {n for n in out if not n.startswith("__ddops_var_")}


def _site_spellings(kind: str, params: Mapping[str, Any]) -> list[set[str]] | None:
    """Alternatives of the names a site's own text spells (each site spells all names of one set), for the kinds
    whose sites are expressions: the callee's; the match's (pending) or the replacement's (applied). None for the
    others. A scope or an assigned name lies outside the site, so neither is here."""
    if kind == "set_call_kwarg":
        return [{params["callee"].split(".")[-1]}]
    if kind == "replace_expression":
        return [_names(params["match"], "eval"), _names(params["replace"], "eval")]
    return None


def required_names(kind: str, params: Mapping[str, Any]) -> list[set[str]] | None:
    """Alternatives of names: every site of the kind contains all names of at least one set (None: no filter).

    A name absent from the file's text cannot be a name in its syntax tree (libcst keeps identifiers verbatim)."""
    scope = {params["in_function"]} if params.get("in_function") else set()
    try:
        own = _site_spellings(kind, params)
        if kind == "set_call_kwarg" and own is not None:  # own: [{the callee's last name}]
            needed = own[0] | scope
            if params.get("assigned_to"):
                needed.add(params["assigned_to"])
            return [needed]
        if own is not None:
            alternatives = [names | scope for names in own]
        elif kind == "wrap_statement_in_if":
            alternatives = [_names(params["statement"], "exec") | scope]
        elif kind == "insert_statement" and params.get("anchor") is not None:
            alternatives = [_names(params["anchor"], "statement") | scope]
        else:
            return None
    except (SyntaxError, ValueError, RecursionError):
        return None
    if any(not names for names in alternatives):
        return None  # a pattern of placeholders and literals only: anything may match
    return alternatives


def _wrap_constructible(params: Mapping[str, Any]) -> bool:
    """WrapStatementInIf raises (an ERROR outcome) unless its statement is one simple statement."""
    source, _ = substitute_placeholders(textwrap.dedent(params["statement"]).strip("\n") + "\n")
    try:
        body = ast.parse(source).body
        ast.parse(substitute_placeholders(params["condition"].strip())[0], mode="eval")
    except SyntaxError:
        return False
    return len(body) == 1 and not _is_compound(body[0])


def prefiltered(kind: str, params: Mapping[str, Any], expect: int, path: str, source: bytes) -> Outcome | None:
    """libcst's `not found` outcome when the text cannot hold a site (and the file parses), else None."""
    alternatives = required_names(kind, params)
    if alternatives is None:
        return None
    text = source.decode("utf-8")
    if any(all(name in text for name in names) for names in alternatives):
        return None
    if kind == "wrap_statement_in_if" and not _wrap_constructible(params):
        return None
    try:
        parse(source)
    except Decline:
        return None
    return decide(path, describe(kind, params), [], [], expect)


# ---------------------------------------------------------------------------------------------------------------
# The entry point plan.py calls before libcst.

def plan_without_libcst(kind: str, params: Mapping[str, Any], expect: int, path: str, source: bytes) -> Outcome | None:
    """libcst's outcome where the file cannot hold a site of the transform (it is then left as it is); None: ask
    libcst."""
    try:
        return prefiltered(kind, params, expect, path, source)
    except Decline:
        return None
    except (KeyError, TypeError, ValueError, IndexError, RecursionError):
        return None  # odd params or input: libcst's own path reports it
