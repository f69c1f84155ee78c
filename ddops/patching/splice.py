"""Planning without libcst where the standard library is enough: text kinds, a prefilter, and an `ast` splice engine.

libcst costs ~0.35 s to import and ~0.1-0.3 s per file (parse, position metadata, visit); CPython's own parser
reads the same file in a few ms. So before a Python transform runs with libcst:

- the prefilter asks whether the file's text can contain a site at all (every site needs certain names, e.g. the
  callee's); when it cannot, and `ast` parses the file, the outcome is libcst's `not found` without libcst;
- set_call_kwarg, whose edit is local, finds its sites with `ast` (exact line/column spans) and splices the edit
  into the original bytes, laying the text out exactly as libcst's code generator does.

Either returns None whenever it could disagree with the libcst transform (a syntax error, whose message libcst
words; nested sites; literals that `ast` folds; a layout it does not know), and the caller then runs libcst: the
output never depends on which engine ran. tests/unit/test_engine_corpus.py holds the two to the same bytes and
outcomes.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import functools
import io
import re
import textwrap
import threading
import tokenize
import warnings
from typing import Any, Mapping

from ddops.patching.kinds import TEXT_KINDS, Outcome, decide, is_header, substitute_placeholders

# ---------------------------------------------------------------------------------------------------------------
# Text kinds and encodings: no parser at all.


def is_text_kind(kind: str) -> bool:
    return kind in TEXT_KINDS


def utf8_error(path: str, source: bytes) -> Outcome | None:
    """An error outcome when source is not UTF-8 (ddops edits UTF-8 only), else None."""
    from ddops.patching.kinds import ERROR

    try:
        source.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = source[: exc.start].count(b"\n") + 1
        return Outcome(ERROR, f"{path}:{line}: not valid UTF-8 (byte {exc.start}): ddops edits UTF-8 files only")
    return None


def text_replace(source: bytes, old: str, new: str, expect: int, path: str) -> tuple[Outcome, bytes]:
    """Exact text `old` -> `new`; an occurrence of `new` is an applied site. Keeps the file's CRLF line endings."""
    error = utf8_error(path, source)
    if error is not None:
        return dataclasses.replace(error, plain_text=True, expected=expect), source
    text = source.decode("utf-8")
    first_nl = text.find("\n")
    if first_nl > 0 and text[first_nl - 1] == "\r":
        old, new = _crlf(old), _crlf(new)
    olds = _spans(text, old)
    news = _spans(text, new)
    pending = [o for o in olds if not any(n[0] <= o[0] and o[1] <= n[1] for n in news)]
    applied = [n for n in news if not any(o[0] <= n[0] and n[1] <= o[1] for o in pending)]

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    first_line = old.strip().splitlines()[0] if old.strip() else old
    what = f"text `{first_line}`" + (" (+ more lines)" if old.strip().count("\n") else "")
    outcome = decide(path, what, [line(s) for s, _ in pending], [line(s) for s, _ in applied], expect,
                     plain_text=True)
    if not outcome.changes:
        return outcome, source
    parts: list[str] = []
    pos = 0
    for start, end in pending:
        parts.append(text[pos:start])
        parts.append(new)
        pos = end
    parts.append(text[pos:])
    return outcome, "".join(parts).encode("utf-8")


def _crlf(s: str) -> str:
    return s.replace("\r\n", "\n").replace("\n", "\r\n")


def _spans(text: str, needle: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    start = text.find(needle)
    while start != -1:
        out.append((start, start + len(needle)))
        start = text.find(needle, start + len(needle))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Parsing the file with the standard library.

class Decline(Exception):
    """The fast path cannot vouch for libcst's answer here: run the libcst transform."""


_PARSE_LOCK = threading.Lock()
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def parse(source: bytes) -> ast.Module:
    """The file's stdlib syntax tree, or Decline where libcst might read the file differently."""
    if source.startswith(b"\xef\xbb\xbf") or source.count(b"\r") != source.count(b"\r\n"):
        raise Decline("byte-order mark or lone CR")  # line and column arithmetic below assumes \n line ends
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
# What libcst's transformers call a site, and the names any site needs.

def describe(kind: str, params: Mapping[str, Any]) -> str:
    """The transformer's describe() for a kind, without building it (Decline where that needs libcst)."""
    scope = f" in {params['in_function']}()" if params.get("in_function") else ""
    if kind == "set_call_kwarg":
        target = f"{params['assigned_to']} = " if params.get("assigned_to") else ""
        return f"`{target}{params['callee']}(...)`{scope}"
    if kind in ("replace_expression",):
        return f"`{params['match'].strip()}`{scope}"
    if kind == "wrap_statement_in_if":
        return f"`{params['statement'].strip()}`{scope}"
    if kind == "insert_statement" and params.get("anchor") is not None:
        statement = params["statement"]
        many, compound = _statement_shape(statement)
        lines = textwrap.dedent(statement).strip().splitlines()
        shown = (lines[0] if lines else "") + (" ..." if many or compound else "")
        anchor_lines = textwrap.dedent(params["anchor"]).strip().splitlines()
        where = f"{params.get('position') or 'after'} `{anchor_lines[0] if anchor_lines else ''}`"
        return f"`{shown}` {where}{scope}"
    raise Decline(f"no description for {kind}")


def _statement_shape(text: str) -> tuple[bool, bool]:
    """(more than one libcst statement line, the first is compound) for insert_statement's text."""
    source, _ = substitute_placeholders(textwrap.dedent(text).strip("\n") + "\n")
    try:
        body = ast.parse(source).body
    except SyntaxError:
        raise Decline("statement does not parse") from None
    if not body:
        raise Decline("no statement")
    # libcst groups `a; b` on one line into one statement; ast gives two.
    lines = 1
    for prev, stmt in zip(body, body[1:]):
        if _is_compound(prev) or _is_compound(stmt) or stmt.lineno != prev.end_lineno:
            lines += 1
    return lines > 1, _is_compound(body[0])


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


def required_names(kind: str, params: Mapping[str, Any]) -> list[set[str]] | None:
    """Alternatives of names: every site of the kind contains all names of at least one set (None: no filter).

    A name absent from the file's text cannot be a name in its syntax tree (libcst keeps identifiers verbatim).
    """
    scope = {params["in_function"]} if params.get("in_function") else set()
    try:
        if kind == "set_call_kwarg":
            needed = {params["callee"].split(".")[-1]} | scope
            if params.get("assigned_to"):
                needed.add(params["assigned_to"])
            return [needed]
        if kind == "replace_expression":
            # a site is the pattern (pending) or the replacement (applied)
            alternatives = [_names(params["match"], "eval") | scope, _names(params["replace"], "eval") | scope]
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
        what = describe(kind, params)
        parse(source)
    except Decline:
        return None
    return decide(path, what, [], [], expect)


# ---------------------------------------------------------------------------------------------------------------
# set_call_kwarg by splicing.

class _Source:
    """The file's bytes with (line, column) -> offset; ast columns are UTF-8 byte offsets."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        starts = [0]
        find = data.find
        i = find(b"\n")
        while i != -1:
            starts.append(i + 1)
            i = find(b"\n", i + 1)
        self.starts = starts

    def start(self, node: Any) -> int:
        return self.starts[node.lineno - 1] + node.col_offset

    def end(self, node: Any) -> int:
        return self.starts[node.end_lineno - 1] + node.end_col_offset

    def skip_layout(self, i: int, end: int, closers: bool = False) -> int:
        """The first offset in [i, end) that is not whitespace, a comment, a line continuation (or `)`)."""
        data = self.data
        while i < end:
            c = data[i]
            if c in b" \t\f\r\n":
                i += 1
            elif c == 0x23:  # '#'
                nl = data.find(b"\n", i, end)
                i = end if nl == -1 else nl + 1
            elif c == 0x5C:  # '\\' line continuation
                i += 1
            elif closers and c == 0x29:  # ')'
                i += 1
            else:
                break
        return i

    def code_end(self, node: Any, limit: int) -> int:
        """Where an argument's code ends: after its own closing parentheses (before `limit`)."""
        data = self.data
        i = self.end(node)
        last = i
        while i < limit:
            i = self.skip_layout(i, limit)
            if i < limit and data[i] == 0x29:
                i += 1
                last = i
            else:
                break
        return last


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def _verbatim_dotted(src: _Source, node: ast.AST, text: str) -> None:
    """Decline when a matched name is spelled otherwise in the file (ast NFKC-normalises identifiers)."""
    if src.data.isascii():
        return
    parts = text.split(".")
    while isinstance(node, ast.Attribute):
        end = src.end(node)
        if src.data[end - len(parts[-1].encode()):end] != parts[-1].encode():
            raise Decline("identifier spelled with other characters")
        node, parts = node.value, parts[:-1]
    if src.data[src.start(node):src.end(node)] != parts[0].encode():
        raise Decline("identifier spelled with other characters")


class _CallSites:
    """The calls of `callee` in scope (assigned to `assigned_to` when given), as libcst's SetCallKwarg sees them.

    Only the nodes whose lines hold the callee's last name are entered (`hits`, sorted line numbers): every site,
    the assignment and the functions around it span such a line, and most of a file is skipped unvisited.
    """

    def __init__(self, callee: str, assigned_to: str | None, in_function: str | None,
                 not_in_function: str | None, hits: list[int]) -> None:
        self.callee, self.assigned_to = callee, assigned_to
        self.in_function, self.not_in_function = in_function, not_in_function
        self.hits = hits
        self.functions: list[str] = []
        self.assigned: dict[int, ast.Name] = {}  # id(call) -> the target naming it
        self.calls: list[ast.Call] = []
        self.scope_defs: list[ast.AST] = []  # functions named in_function or not_in_function (spelling checked)

    def children(self, node: ast.AST) -> None:
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    def visit(self, node: ast.AST) -> None:
        first = getattr(node, "lineno", None)
        if first is not None:
            hits = self.hits
            i = bisect.bisect_left(hits, first)
            if i == len(hits) or hits[i] > node.end_lineno:  # type: ignore[attr-defined]
                return
        kind = type(node)
        if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
            # libcst enters the function before its decorators, defaults and annotations: they count as inside.
            self.functions.append(node.name)  # type: ignore[attr-defined]
            if node.name in (self.in_function, self.not_in_function):  # type: ignore[attr-defined]
                self.scope_defs.append(node)
            self.children(node)
            self.functions.pop()
            return
        if kind is ast.Call:
            if _dotted(node.func) == self.callee and self._in_scope():  # type: ignore[attr-defined]
                if not self.assigned_to or id(node) in self.assigned:
                    self.calls.append(node)  # type: ignore[arg-type]
        elif kind is ast.Assign and self.assigned_to and isinstance(node.value, ast.Call):  # type: ignore[attr-defined]
            for t in node.targets:  # type: ignore[attr-defined]
                if isinstance(t, ast.Name) and t.id == self.assigned_to:
                    self.assigned[id(node.value)] = t  # type: ignore[attr-defined]
                    break
        elif kind is ast.AnnAssign and self.assigned_to and isinstance(node.value, ast.Call):  # type: ignore
            if isinstance(node.target, ast.Name) and node.target.id == self.assigned_to:  # type: ignore
                self.assigned[id(node.value)] = node.target  # type: ignore[attr-defined]
        self.children(node)

    def _in_scope(self) -> bool:
        if self.not_in_function is not None and self.not_in_function in self.functions:
            return False
        return self.in_function is None or self.in_function in self.functions


_DEF = re.compile(rb"(?:async[ \t\f]+)?def[ \t\f]+([^\s(]+)")


def _hit_lines(source: bytes, name: bytes) -> list[int]:
    """1-based numbers of the lines that contain name."""
    lines = []
    i = source.find(name)
    while i != -1:
        line = source.count(b"\n", 0, i) + 1
        lines.append(line)
        nl = source.find(b"\n", i)
        if nl == -1:
            break
        i = source.find(name, nl + 1)
    return lines


@functools.lru_cache(maxsize=64)
def _value_tree(value_code: str) -> ast.expr:
    return ast.parse(value_code, mode="eval").body


def set_call_kwarg(source: bytes, params: Mapping[str, Any], expect: int, path: str) -> tuple[Outcome, bytes]:
    """SetCallKwarg's outcome and bytes without libcst (raises Decline where it cannot be sure of them)."""
    callee, keyword, value = params["callee"], params["keyword"], params["value"]
    assigned_to = params.get("assigned_to")
    in_function, not_in_function = params.get("in_function"), params.get("not_in_function")
    value_code, placeholders = substitute_placeholders(value.strip())
    names = [callee, keyword, value_code, assigned_to or "", in_function or "", not_in_function or ""]
    if placeholders or not all(n.isascii() for n in names) or any(c in value_code for c in "\n\r#\\"):
        raise Decline("a parameter libcst might read differently")
    try:
        value_tree = _value_tree(value_code)
    except SyntaxError:
        raise Decline("value does not parse") from None
    what = describe("set_call_kwarg", params)
    tree = parse(source)
    hits = _hit_lines(source, callee.split(".")[-1].encode())
    if not hits:
        return decide(path, what, [], [], expect), source
    src = _Source(source)
    finder = _CallSites(callee, assigned_to, in_function, not_in_function, hits)
    try:
        finder.visit(tree)
    except RecursionError:
        raise Decline("deeply nested") from None
    if not source.isascii():
        # ast NFKC-normalises identifiers, libcst compares them as written: the names that decided must be verbatim
        for node in finder.scope_defs:
            if not _DEF.match(source, src.start(node)) or _DEF.match(source, src.start(node)).group(1) != \
                    node.name.encode():  # type: ignore[attr-defined]
                raise Decline("a function name spelled with other characters")
        for target in finder.assigned.values():
            if source[src.start(target):src.end(target)] != target.id.encode():
                raise Decline("an assignment target spelled with other characters")
    calls = sorted(finder.calls, key=src.start)
    spans = [(src.start(c), src.end(c)) for c in calls]
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        if s2 < e1:
            raise Decline("a site inside another site")  # libcst edits the inner one first, then the outer
    pending: list[int] = []
    applied: list[int] = []
    edits: list[tuple[int, int, bytes]] = []
    new_value = value_code.encode()
    value_source = _Source(value_code.encode())
    for call in calls:
        _verbatim_dotted(src, call.func, callee)
        rpar = src.end(call) - 1
        if src.data[rpar] != 0x29:
            raise Decline("call does not end with `)`")
        args: list[ast.AST] = sorted([*call.args, *call.keywords], key=src.start)
        if len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.GeneratorExp) \
                and src.end(call.args[0]) >= src.end(call):
            raise Decline("a bare generator argument")
        existing = None
        for kw in call.keywords:
            if kw.arg is not None and kw.arg == keyword:
                existing = kw
            elif kw.arg is not None and not source.isascii():
                start = src.start(kw)
                if source[start:start + len(kw.arg.encode())] != kw.arg.encode():
                    raise Decline("keyword spelled with other characters")
        if existing is not None:
            kw_start = src.start(existing)
            if source[kw_start:kw_start + len(keyword)] != keyword.encode():
                raise Decline("keyword spelled with other characters")
            if _same_expression(value_tree, value_source, existing.value, src):
                applied.append(call.lineno)
                continue
            pending.append(call.lineno)
            eq = src.skip_layout(kw_start + len(keyword), rpar)
            if source[eq:eq + 1] != b"=":
                raise Decline("keyword without `=`")
            start = src.skip_layout(eq + 1, rpar)
            edits.append((start, src.end(existing), new_value))
            continue
        pending.append(call.lineno)
        new_arg = keyword.encode() + b"=" + new_value
        if not args:
            edits.append((rpar, rpar, new_arg))
            continue
        last = args[-1]
        last_end = src.code_end(last, rpar)
        comma = src.skip_layout(last_end, rpar)
        if comma == rpar:
            # No trailing comma: libcst writes ", " after the last argument's code, before its whitespace.
            edits.append((last_end, last_end, b", "))
            edits.append((rpar, rpar, new_arg))
            continue
        if source[comma:comma + 1] != b",":
            raise Decline("unexpected text after the last argument")
        # A trailing comma: the new argument takes the last line, between the previous comma and the trailing one.
        trailing = source[last_end:rpar]
        if len(args) >= 2:
            before = args[-2]
            prev_end = src.code_end(before, rpar)
            prev_comma = src.skip_layout(prev_end, rpar)
            if source[prev_comma:prev_comma + 1] != b",":
                raise Decline("no comma between arguments")
            between = source[prev_end:src.skip_layout(prev_comma + 1, rpar)]
        else:
            between = trailing
        edits.append((last_end, rpar, between + new_arg + trailing))
    outcome = decide(path, what, pending, applied, expect)
    if not outcome.changes:
        return outcome, source
    return outcome, _splice(source, edits)


def _splice(source: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    edits.sort(key=lambda e: (e[0], e[1]))
    out: list[bytes] = []
    pos = 0
    for start, end, text in edits:
        if start < pos:
            raise Decline("overlapping edits")
        out.append(source[pos:start])
        out.append(text)
        pos = end
    out.append(source[pos:])
    return b"".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Structural equality as libcst's `matches` has it (layout, parentheses and quotes aside), or Decline.

_IGNORED_FIELDS = frozenset({"ctx", "kind", "type_comment"})


def _same_expression(a: ast.AST, a_src: _Source, b: ast.AST, b_src: _Source) -> bool:
    _guard(a, a_src)
    _guard(b, b_src)
    return _equal(a, a_src, b, b_src)


def _guard(node: ast.AST, src: _Source) -> None:
    """Decline on the constructs where ast's view differs from libcst's."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.JoinedStr):
            raise Decline("f-string")  # libcst compares an f-string's quotes and parts
        if isinstance(sub, ast.BoolOp) and any(isinstance(v, ast.BoolOp) and type(v.op) is type(sub.op)
                                               for v in sub.values):
            raise Decline("regrouped boolean operation")  # ast flattens `(a and b) and c`, libcst does not
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Tuple):
            raise Decline("tuple subscript")  # `x[a,]` and `x[a]` are one thing to libcst
        if isinstance(sub, ast.Call) and sub.keywords and any(isinstance(x, ast.Starred) for x in sub.args):
            raise Decline("starred and keyword arguments")  # ast separates them, libcst keeps their order
        if isinstance(sub, ast.Constant) and isinstance(sub.value, (str, bytes)):
            segment = src.data[src.start(sub):src.end(sub)].decode("utf-8", "replace")
            try:
                strings = sum(1 for t in tokenize.generate_tokens(io.StringIO(segment).readline)
                              if t.type == tokenize.STRING)
            except (tokenize.TokenError, SyntaxError):
                raise Decline("string literal") from None
            if strings != 1:
                raise Decline("implicitly concatenated strings")  # one literal to ast, several to libcst
        if isinstance(sub, ast.expr) and not src.data[src.start(sub):src.end(sub)].isascii():
            raise Decline("non-ASCII expression")  # identifiers are NFKC-normalised by ast, not by libcst


def _equal(a: Any, a_src: _Source, b: Any, b_src: _Source) -> bool:
    if isinstance(a, ast.AST):
        if type(a) is not type(b):
            return False
        if isinstance(a, ast.Constant):
            if type(a.value) is not type(b.value) or a.value != b.value:
                return False
            if isinstance(a.value, (int, float, complex)) and not isinstance(a.value, bool):
                # libcst compares a number's spelling (1_000 is not 1000 to it)
                return a_src.data[a_src.start(a):a_src.end(a)] == b_src.data[b_src.start(b):b_src.end(b)]
            return True
        for name in a._fields:
            if name in _IGNORED_FIELDS:
                continue
            if not _equal(getattr(a, name, None), a_src, getattr(b, name, None), b_src):
                return False
        return True
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_equal(x, a_src, y, b_src) for x, y in zip(a, b))
    return a == b


# ---------------------------------------------------------------------------------------------------------------
# The entry point plan.py calls before libcst.

FAST_KINDS = ("set_call_kwarg",)


def plan_fast(kind: str, params: Mapping[str, Any], expect: int, path: str,
              source: bytes) -> tuple[Outcome, bytes] | None:
    """The outcome and new bytes libcst's transform would give, computed without libcst; None = ask libcst."""
    try:
        if kind in FAST_KINDS:
            return set_call_kwarg(source, params, expect, path)
        outcome = prefiltered(kind, params, expect, path, source)
        return (outcome, source) if outcome is not None else None
    except Decline:
        return None
    except (KeyError, TypeError, ValueError, IndexError, RecursionError):
        return None  # odd params or input: libcst's own path reports it
