"""The vocabulary of patching without libcst: transform kinds and their params, check kinds, outcome states.

playbook.py validates YAML against these tables, and the CLI renders the outcome values, without importing libcst;
only transforms.py (and what imports it) pays for the parser."""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddops.strenum import StrEnum


class PatchState(StrEnum):
    """The state of one patch on one file (the plan's view), or on a host (`modified` then comes from the journal)."""

    PENDING = "pending"      # every expected site found in its unpatched form: applying changes the file
    APPLIED = "applied"      # every expected site already in its patched form: nothing to do
    PARTIAL = "partial"      # the expected sites are all there, some patched and some not: applying patches the rest
    DRIFTED = "drifted"      # fewer sites than expected (0 = the anchor is gone): upstream changed, nothing is written
    AMBIGUOUS = "ambiguous"  # more sites than expected: refusing to guess which one was meant
    ERROR = "error"          # the file cannot be read as the transform needs (syntax error, not UTF-8)
    BLOCKED = "blocked"      # a patch it `requires` did not apply cleanly to this file
    MODIFIED = "modified"    # ddops applied it and the file changed since ddops last wrote it (journal.py; a plan
                             # says it of an add_module, whose whole file is the site: never overwritten)


PENDING, APPLIED, PARTIAL, DRIFTED = PatchState.PENDING, PatchState.APPLIED, PatchState.PARTIAL, PatchState.DRIFTED
AMBIGUOUS, ERROR, BLOCKED, MODIFIED = PatchState.AMBIGUOUS, PatchState.ERROR, PatchState.BLOCKED, PatchState.MODIFIED
STATES = (PENDING, APPLIED, PARTIAL, DRIFTED, AMBIGUOUS, ERROR, BLOCKED, MODIFIED)  # what a plan can find in a file
CHANGING_STATES = (PENDING, PARTIAL)
FAILED_STATES = (DRIFTED, AMBIGUOUS, ERROR, BLOCKED)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one transform found in one file: a state, why, and where.

    Lines are 1-based, in the file as the patches before this one in the same plan left it."""

    state: str
    message: str
    pending_lines: tuple[int, ...] = ()
    applied_lines: tuple[int, ...] = ()
    expected: int = 1
    plain_text: bool = False  # text_replace: matched as plain text, not through the Python syntax tree

    @property
    def changes(self) -> bool:
        """True when applying this outcome rewrites the file."""
        return self.state in CHANGING_STATES

    @property
    def ok(self) -> bool:
        """True when the patch is, or can be, in place."""
        return self.state not in FAILED_STATES

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "message": self.message, "pending_lines": list(self.pending_lines),
                "applied_lines": list(self.applied_lines), "expected": self.expected, "plain_text": self.plain_text}


@dataclass(frozen=True, slots=True)
class Param:
    """One transform parameter: its type, whether it is required, and what its text must parse as."""

    type: type | tuple[type, ...]
    required: bool = False
    syntax: str | None = None  # "expression" | "statement" | "statements" | "dotted" | "identifier" | None
    choices: tuple[str, ...] = ()
    doc: str = ""


_SCOPE = {  # where the kinds that match code look
    "in_function": Param(str, syntax="identifier", doc="only inside a function (or method) of this name, at any depth"),
    "not_in_function": Param(str, syntax="identifier", doc="never inside a function (or method) of this name"),
}

# Every transform kind and its params. `expect` (int, or a mapping file -> int) is accepted by every kind and
# validated by playbook.py; add_import and add_module always have exactly one site.
TRANSFORM_KINDS: dict[str, dict[str, Param]] = {
    "set_call_kwarg": {
        "callee": Param(str, True, "dotted", doc="the called name, e.g. DynamicCache or torch.zeros"),
        "keyword": Param(str, True, "identifier", doc="the keyword argument to add or set"),
        "value": Param(str, True, "expression", doc="its value, as Python source"),
        "assigned_to": Param(str, syntax="identifier", doc="only calls assigned to this name (`x = f(...)`)"),
        **_SCOPE,
    },
    "replace_expression": {
        "match": Param(str, True, "expression", doc="expression to find; `$name` matches any sub-expression"),
        "replace": Param(str, True, "expression", doc="its replacement; `$name` re-uses what was matched"),
        **_SCOPE,
    },
    "insert_statement": {
        "statement": Param(str, True, "statements", doc="statement(s) to insert, as Python source"),
        "anchor": Param(str, syntax="statement", doc="statement next to which to insert (`def f(...):` header ok)"),
        "position": Param(str, choices=("after", "before", "after_imports"), doc="default: after"),
        **_SCOPE,
    },
    "wrap_statement_in_if": {
        "statement": Param(str, True, "statement", doc="the simple statement to guard"),
        "condition": Param(str, True, "expression", doc="the `if` condition"),
        **_SCOPE,
    },
    "add_import": {
        "module": Param(str, True, "dotted", doc="`import module`, or `from module import name`"),
        "name": Param(str, syntax="identifier", doc="the name to import from module"),
        "alias": Param(str, syntax="identifier", doc="`as alias`"),
    },
    "text_replace": {
        "old": Param(str, True, doc="exact text to find (any file type)"),
        "new": Param(str, True, doc="its replacement; its presence marks the patch applied"),
    },
    "add_module": {
        "source": Param(str, True, doc="a Python file beside the playbook: the whole module the patch's one file gets"),
    },
}
ADD_MODULE = "add_module"
SINGLE_SITE_KINDS = ("add_import", ADD_MODULE)
TEXT_KINDS = ("text_replace",)

CHECK_KINDS: dict[str, dict[str, Param]] = {
    "contains": {"text": Param(str), "regex": Param(str)},
    "absent": {"text": Param(str), "regex": Param(str)},
    "unchanged": {"text": Param(str, True)},
    "count": {"text": Param(str), "regex": Param(str), "count": Param(int, True)},
    "compiles": {},
    "command": {"run": Param(str, True), "timeout": Param((int, float))},
}
CHECK_COMMON = {"kind": Param(str, True), "name": Param(str), "file": Param(str)}
DEFAULT_COMMAND_TIMEOUT = 60.0

_PLACEHOLDER = re.compile(r"\$(\$|[A-Za-z_][A-Za-z0-9_]*)")
PLACEHOLDER_PREFIX = "__ddops_var_"


def substitute_placeholders(text: str) -> tuple[str, tuple[str, ...]]:
    """`$cache.crop($n)` -> (`__ddops_var_cache__.crop(__ddops_var_n__)`, ('cache', 'n')); `$$` is a literal `$`."""
    names: list[str] = []

    def repl(m: re.Match[str]) -> str:
        if m.group(1) == "$":
            return "$"
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"{PLACEHOLDER_PREFIX}{m.group(1)}__"

    return _PLACEHOLDER.sub(repl, text), tuple(names)


def placeholder_name(identifier: str) -> str | None:
    """'cache' for `__ddops_var_cache__`, else None."""
    if identifier.startswith(PLACEHOLDER_PREFIX) and identifier.endswith("__"):
        return identifier[len(PLACEHOLDER_PREFIX):-2]
    return None


def describe(kind: str, params: Mapping[str, Any]) -> str:
    """How outcomes name a transform's sites, from its params alone: the prefilter and libcst word them alike."""
    scope = f" in {params['in_function']}()" if params.get("in_function") else ""
    if kind == "set_call_kwarg":
        target = f"{params['assigned_to']} = " if params.get("assigned_to") else ""
        return f"`{target}{params['callee']}(...)`{scope}"
    if kind == "insert_statement":
        anchor = params.get("anchor")
        where = f"{params.get('position') or 'after'} `{_first_line(anchor)}`" if anchor is not None else \
            "after the imports"
        return f"`{_first_line(params['statement'], ' ...')}` {where}{scope}"
    if kind == "add_import":
        alias = f" as {params['alias']}" if params.get("alias") else ""
        name = params.get("name")
        return f"`from {params['module']} import {name}{alias}`" if name else f"`import {params['module']}{alias}`"
    if kind == "text_replace":
        return f"text `{_first_line(params['old'], ' (+ more lines)')}`"
    if kind == ADD_MODULE:
        return f"module {params['source']}"
    return f"`{params['match' if kind == 'replace_expression' else 'statement'].strip()}`{scope}"


def _first_line(text: str, more: str = "") -> str:
    """The first line of a snippet, and `more` when it has others."""
    lines = textwrap.dedent(text).strip().splitlines() or [""]
    return lines[0] + (more if len(lines) > 1 else "")


def is_header(text: str) -> bool:
    """True for a compound statement's header given alone, like `def cuda_time() -> float:`."""
    return text.rstrip().endswith(":")


def syntax_problem(text: str, syntax: str) -> str | None:
    """Why text is not valid Python of the given syntax, or None (stdlib ast only: no libcst here)."""
    if syntax in ("dotted", "identifier"):
        parts = text.split(".") if syntax == "dotted" else [text]
        if not all(p.isidentifier() for p in parts):
            return f"must be {'a dotted name' if syntax == 'dotted' else 'an identifier'}, not {text!r}"
        return None
    source, _ = substitute_placeholders(text)
    try:
        if syntax == "expression":
            ast.parse(source.strip(), mode="eval")
        elif syntax == "statement":
            src = source.strip()
            tree = ast.parse(src + "\n    pass\n" if is_header(src) else src + "\n")
            if len(tree.body) != 1:
                return f"must be exactly one statement, not {len(tree.body)}"
        elif syntax == "statements":
            if not ast.parse(source.strip("\n") + "\n").body:
                return "must hold at least one statement"
    except SyntaxError as exc:
        return f"not a Python {syntax}: {exc.msg} (line {exc.lineno})"
    return None


def decide(path: str, what: str, pending: Sequence[int], applied: Sequence[int], expect: int,
           plain_text: bool = False, conflict: str | None = None) -> Outcome:
    """The outcome of finding `pending` unpatched and `applied` patched sites where `expect` were expected."""
    pending_t, applied_t = tuple(sorted(pending)), tuple(sorted(applied))
    found = len(pending_t) + len(applied_t)
    lines = ", ".join(str(n) for n in sorted(pending_t + applied_t))

    def out(state: str, message: str) -> Outcome:
        return Outcome(state, message, pending_t, applied_t, expect, plain_text)

    first = min(pending_t + applied_t) if found else 1
    if conflict:
        return out(DRIFTED, f"{path}:{first}: {what}: {conflict}")
    if found == 0:
        return out(DRIFTED, f"{path}: {what} not found, patched or not: the code changed upstream")
    if found > expect:
        return out(AMBIGUOUS, f"{path}:{first}: {what} found {found} times (lines {lines}), expected {expect}: "
                              "refusing to guess")
    if found < expect:
        return out(DRIFTED, f"{path}:{first}: {what} found {found} of {expect} expected times (lines {lines}): "
                            "the code changed upstream")
    if not pending_t:
        return out(APPLIED, f"{path}:{first}: {what}: already applied (lines {lines})")
    if not applied_t:
        return out(PENDING, f"{path}:{first}: {what}: would change lines {lines}")
    done = ", ".join(str(n) for n in applied_t)
    todo = ", ".join(str(n) for n in pending_t)
    return out(PARTIAL, f"{path}:{first}: {what}: applied at lines {done}, would change lines {todo}")
