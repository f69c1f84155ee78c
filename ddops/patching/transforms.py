"""The transforms: one small libcst class per kind, guard first, so applying twice is applying once.

Each transformer walks the whole module, recognises every site in its patched form (counted as applied, left
alone) or its unpatched form (counted as pending, rewritten), and `decide` turns the two counts and the
playbook's `expect` into an Outcome. The rewritten tree is kept only when the outcome says so; every byte that is
not part of a site (comments, blank lines, layout, CRLF, tabs) is kept by libcst's lossless tree."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, cast

import libcst as cst
from libcst.metadata import PositionProvider

from ddops.patching.kinds import ERROR, Outcome, decide, describe, is_header, placeholder_name, substitute_placeholders

# ---------------------------------------------------------------------------------------------------------------
# Structural matching: two snippets are the same code when they differ only in layout, parentheses and quotes.

_LAYOUT_FIELDS = frozenset({
    "lpar", "rpar", "comma", "semicolon", "leading_lines", "lines_after_decorators", "trailing_whitespace",
    "header", "footer", "indent", "newline", "equal", "colon", "dot", "first_colon", "second_colon",
})
_LAYOUT_TYPES = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Comment,
                 cst.Newline, cst.LeftParen, cst.RightParen, cst.Comma, cst.Colon, cst.AssignEqual, cst.Semicolon,
                 cst.Dot)
_COMPOUND_BODY_FIELDS = frozenset({"body", "orelse", "handlers", "finalbody"})

# A statement as a module's body holds it: libcst's BaseStatement has no `leading_lines`, its two kinds have.
Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement


def _is_layout(value: Any) -> bool:
    return isinstance(value, _LAYOUT_TYPES) or isinstance(value, cst.MaybeSentinel)


def matches(pattern: Any, node: Any, bindings: dict[str, cst.BaseExpression] | None = None,
            header_only: bool = False) -> bool:
    """True when node is pattern up to layout; `$name` placeholders in pattern bind (consistently) in bindings.

    header_only compares a compound statement's header alone (`def f(x):`, decorators only if the pattern has any)."""
    if bindings is None:
        bindings = {}
    if isinstance(pattern, cst.Name) and isinstance(node, cst.BaseExpression):
        ph = placeholder_name(pattern.value)
        if ph is not None:
            if ph in bindings:
                return matches(bindings[ph], node)
            bindings[ph] = node
            return True
    if isinstance(pattern, cst.CSTNode):
        if type(pattern) is not type(node):
            return _is_layout(pattern) and _is_layout(node)
        if isinstance(pattern, cst.SimpleString) and isinstance(node, cst.SimpleString):
            return _string_value(pattern) == _string_value(node)
        for f in dataclasses.fields(pattern):
            name = f.name
            if name in _LAYOUT_FIELDS or name.startswith("whitespace"):
                continue
            a, b = getattr(pattern, name), getattr(node, name)
            if header_only and (name in _COMPOUND_BODY_FIELDS or (name == "decorators" and not a)):
                continue
            if not matches(a, b, bindings):
                return False
        return True
    if isinstance(pattern, (list, tuple)):
        return (isinstance(node, (list, tuple)) and len(pattern) == len(node)
                and all(matches(a, b, bindings) for a, b in zip(pattern, node)))
    if _is_layout(pattern) or _is_layout(node):
        return _is_layout(pattern) and _is_layout(node)
    return pattern == node


def _string_value(node: cst.SimpleString) -> Any:
    try:
        return ("b" in node.prefix.lower(), node.evaluated_value)
    except Exception:  # an odd literal: fall back to comparing its text
        return node.value


def dotted_name(node: cst.CSTNode) -> str | None:
    """'torch.cuda.synchronize' for that Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base is not None else None
    return None


def parse_expression(text: str) -> cst.BaseExpression:
    source, _ = substitute_placeholders(text.strip())
    return cst.parse_expression(source)


def parse_statements(text: str) -> list[Statement]:
    source, _ = substitute_placeholders(textwrap.dedent(text).strip("\n") + "\n")
    return list(cst.parse_module(source).body)


def with_newline(statements: list[Statement], newline: str) -> list[Statement]:
    """The statements as a file with `newline` line endings holds them: a multi-line string's own line breaks too
    (libcst writes the breaks between lines in the file's style, but a string token as it was parsed)."""
    if newline == "\n":
        return statements
    return list(cst.parse_module(cst.Module(body=statements).code.replace("\n", newline)).body)


def parse_anchor(text: str) -> tuple[Statement, bool]:
    """The anchor statement, and whether only its header (`def f(...):`) is to be compared."""
    source, _ = substitute_placeholders(textwrap.dedent(text).strip())
    if is_header(source):
        return cst.parse_statement(source + "\n    pass\n"), True
    return cst.parse_statement(source + "\n"), False


def _single_small(stmt: cst.CSTNode) -> cst.BaseSmallStatement | None:
    return stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None


# ---------------------------------------------------------------------------------------------------------------
# Parentheses: substituted expressions keep their meaning wherever they land.

_ATOMIC = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.Imaginary,
           cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.List, cst.Dict, cst.Set,
           cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Ellipsis)
# Parents whose expression slots need no parentheses whatever the expression is.
_SAFE_PARENTS = (cst.Arg, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Expr, cst.Element,
                 cst.DictElement, cst.Index, cst.If, cst.While, cst.Param, cst.Assert)


def _needs_parens(expr: cst.BaseExpression, parent: cst.CSTNode | None) -> bool:
    if isinstance(expr, _ATOMIC) or getattr(expr, "lpar", None):
        return False
    return parent is not None and not isinstance(parent, _SAFE_PARENTS)


def _parenthesize(expr: cst.BaseExpression) -> cst.BaseExpression:
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class _ParentTracker(cst.CSTVisitor):
    """Records the parent of each placeholder Name in a template."""

    def __init__(self) -> None:
        self.stack: list[cst.CSTNode] = []
        self.parent_of: dict[int, cst.CSTNode | None] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Name) and placeholder_name(node.value) is not None:
            self.parent_of[id(node)] = self.stack[-1] if self.stack else None
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


class _Substitute(cst.CSTTransformer):
    def __init__(self, bindings: dict[str, cst.BaseExpression], parent_of: dict[int, cst.CSTNode | None]) -> None:
        super().__init__()
        self.bindings = bindings
        self.parent_of = parent_of

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        ph = placeholder_name(original_node.value)
        if ph is None:
            return updated_node
        if ph not in self.bindings:
            raise ValueError(f"replacement uses ${ph}, which the match pattern does not bind")
        bound = self.bindings[ph].deep_clone()
        if _needs_parens(bound, self.parent_of.get(id(original_node))):
            bound = _parenthesize(bound)
        return bound


def fill_template(template: cst.BaseExpression, bindings: dict[str, cst.BaseExpression]) -> cst.BaseExpression:
    """The template with each `$name` replaced by what it matched (parenthesized where precedence needs it)."""
    tracker = _ParentTracker()
    template.visit(tracker)
    if not tracker.parent_of:
        return template.deep_clone()
    # A fresh copy: a node object must appear only once in a tree (metadata and our site maps key on identity).
    filled = template.visit(_Substitute(bindings, tracker.parent_of))
    if not isinstance(filled, cst.BaseExpression):  # never: _Substitute replaces names by expressions only
        raise TypeError(f"a template filled in is {type(filled).__name__}, not an expression")
    return filled.deep_clone()


# ---------------------------------------------------------------------------------------------------------------
# The transformers. Each records 1-based lines of pending and applied sites, and may note a conflict.

class SiteTransformer(cst.CSTTransformer):
    """Base: counts sites, knows which function it is in, and whether that is in scope."""

    METADATA_DEPENDENCIES = (PositionProvider,)  # a site's lines, as libcst counts them (syntactic positions)

    def __init__(self, in_function: str | None = None, not_in_function: str | None = None) -> None:
        super().__init__()
        self.in_function = in_function
        self.not_in_function = not_in_function
        self.functions: list[str] = []
        self.pending: list[int] = []
        self.applied: list[int] = []
        self.conflict: str | None = None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.functions.append(node.name.value)
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.BaseStatement:
        self.functions.pop()
        return updated_node

    def in_scope(self) -> bool:
        if self.not_in_function is not None and self.not_in_function in self.functions:
            return False
        return self.in_function is None or self.in_function in self.functions

    def line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def last_line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).end.line


class SetCallKwarg(SiteTransformer):
    """`callee(...)` -> `callee(..., keyword=value)`; a call already passing that value is left alone."""

    def __init__(self, callee: str, keyword: str, value: str, assigned_to: str | None = None,
                 in_function: str | None = None, not_in_function: str | None = None) -> None:
        super().__init__(in_function, not_in_function)
        self.callee, self.keyword, self.assigned_to = callee, keyword, assigned_to
        self.value = parse_expression(value)
        self._assigned_calls: set[int] = set()

    def _note_assignment(self, targets: Sequence[cst.BaseExpression], value: cst.BaseExpression | None) -> None:
        if self.assigned_to and isinstance(value, cst.Call):
            if any(isinstance(t, cst.Name) and t.value == self.assigned_to for t in targets):
                self._assigned_calls.add(id(value))

    def visit_Assign(self, node: cst.Assign) -> bool:
        self._note_assignment([t.target for t in node.targets], node.value)
        return True

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        self._note_assignment([node.target], node.value)
        return True

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.in_scope() or dotted_name(original_node.func) != self.callee:
            return updated_node
        if self.assigned_to and id(original_node) not in self._assigned_calls:
            return updated_node
        args = list(updated_node.args)
        for i, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == self.keyword:
                if matches(self.value, arg.value):
                    self.applied.append(self.line(original_node))
                    return updated_node
                self.pending.append(self.line(original_node))
                args[i] = arg.with_changes(value=self.value.deep_clone())
                return updated_node.with_changes(args=args)
        self.pending.append(self.line(original_node))
        new_arg = cst.Arg(keyword=cst.Name(self.keyword), value=self.value.deep_clone(),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
        if len(args) == 1 and isinstance(args[0].value, cst.GeneratorExp) and not args[0].value.lpar:
            # `f(x for x in y)`: a bare generator must be the only argument, so it takes its own parentheses.
            args[0] = args[0].with_changes(value=args[0].value.with_changes(lpar=[cst.LeftParen()],
                                                                             rpar=[cst.RightParen()]))
        if args and isinstance(args[-1].comma, cst.Comma):
            # A trailing comma means a one-argument-per-line layout: the new argument takes the last line.
            trailing = args[-1].comma
            between = args[-2].comma if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else trailing
            args[-1] = args[-1].with_changes(comma=between)
            new_arg = new_arg.with_changes(comma=trailing)
        return updated_node.with_changes(args=[*args, new_arg])


class ReplaceExpression(SiteTransformer):
    """Every expression matching `match` (with `$name` placeholders) -> `replace`; the replaced form is skipped."""

    def __init__(self, match: str, replace: str, in_function: str | None = None,
                 not_in_function: str | None = None) -> None:
        super().__init__(in_function, not_in_function)
        self.pattern = parse_expression(match)
        self.replacement = parse_expression(replace)
        self._parents: list[cst.CSTNode] = []
        self._sites: dict[int, tuple[dict[str, cst.BaseExpression], cst.CSTNode | None]] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        walk = super().on_visit(node)
        parent = self._parents[-1] if self._parents else None
        self._parents.append(node)
        if isinstance(node, cst.BaseExpression) and self.in_scope():
            if matches(self.replacement, node):  # guard first: the patched form is left as it is
                self.applied.append(self.line(node))
                return False
            bindings: dict[str, cst.BaseExpression] = {}
            if matches(self.pattern, node, bindings):
                self.pending.append(self.line(node))
                self._sites[id(node)] = (bindings, parent)
                return False  # the outermost match wins; its parts are not matched again
        return walk

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        self._parents.pop()
        result = super().on_leave(original_node, updated_node)
        site = self._sites.get(id(original_node))
        if site is None:
            return result
        bindings, parent = site
        new = fill_template(self.replacement, bindings)
        if getattr(original_node, "lpar", None) and not new.lpar:
            new = new.with_changes(lpar=original_node.lpar, rpar=original_node.rpar)  # type: ignore[attr-defined]
        elif _needs_parens(new, parent):
            new = _parenthesize(new)
        return new


class InsertStatement(SiteTransformer):
    """Insert statement(s) next to each anchor statement, or after the module's imports; present -> applied."""

    def __init__(self, statement: str, anchor: str | None = None, position: str = "after",
                 in_function: str | None = None, not_in_function: str | None = None) -> None:
        super().__init__(in_function, not_in_function)
        self.statements = parse_statements(statement)
        self.position = position
        self.anchor: Statement | None = None
        self.header_only = False
        if anchor is not None:
            self.anchor, self.header_only = parse_anchor(anchor)

    def visit_Module(self, node: cst.Module) -> bool:
        self.statements = with_newline(self.statements, node.default_newline)
        return True

    def _anchor_at(self, stmt: cst.BaseStatement) -> bool:
        return matches(self.anchor, stmt, header_only=self.header_only)

    def _present_at(self, body: Sequence[cst.BaseStatement], start: int) -> bool:
        k = len(self.statements)
        return start >= 0 and start + k <= len(body) and matches(self.statements, list(body[start:start + k]))

    def _new_statements(self, module_level: bool) -> list[Statement]:
        out = [s.deep_clone() for s in self.statements]
        if module_level and _is_compound(out[0]) and not out[0].leading_lines:
            out[0] = out[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        return out

    def _insert(self, original: Sequence[cst.BaseStatement], body: Sequence[cst.BaseStatement],
                module_level: bool) -> list[cst.BaseStatement] | None:
        k = len(self.statements)
        inserts: dict[int, str] = {}
        for i, stmt in enumerate(body):
            if not self._anchor_at(stmt):
                continue
            start = i + 1 if self.position == "after" else i - k
            if self._present_at(body, start):
                self.applied.append(self.line(original[i]))
            else:
                self.pending.append(self.line(original[i]))
                inserts[i] = self.position
        if not inserts:
            return None
        compound_end = module_level and _is_compound(self.statements[-1])
        out: list[cst.BaseStatement] = []
        pad_next = False
        for i, stmt in enumerate(body):
            if pad_next or (inserts.get(i) == "before" and compound_end):
                # PEP 8: two blank lines after a top-level def or class. A cast: libcst types a block's statements
                # as BaseStatement, whose only kinds are the two of Statement.
                stmt = _with_blank_lines(cast(Statement, stmt), 2)
            pad_next = False
            if inserts.get(i) == "before":
                out.extend(self._new_statements(module_level))
                out.append(stmt)
            elif inserts.get(i) == "after":
                out.append(stmt)
                out.extend(self._new_statements(module_level))
                pad_next = compound_end
            else:
                out.append(stmt)
        return out

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.BaseSuite:
        if self.anchor is None or not self.in_scope():
            return updated_node
        new_body = self._insert(original_node.body, updated_node.body, module_level=False)
        return updated_node if new_body is None else updated_node.with_changes(body=new_body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.anchor is None:
            return self._after_imports(original_node, updated_node)
        if not self.in_scope():
            return updated_node
        new_body = self._insert(original_node.body, updated_node.body, module_level=True)
        return updated_node if new_body is None else updated_node.with_changes(body=new_body)

    def _after_imports(self, original: cst.Module, module: cst.Module) -> cst.Module:
        body = list(module.body)
        for i in range(len(body)):
            if self._present_at(body, i):
                self.applied.append(self.line(original.body[i]))
                return module
        defined = {s.name.value: s for s in self.statements if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
        for i, stmt in enumerate(body):
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value in defined:
                self.conflict = (f"line {self.line(original.body[i])} already defines {stmt.name.value} "
                                 "differently; remove or rename it")
                return module
        at = _after_import_block(body)
        self.pending.append(self.last_line(original.body[at - 1]) + 1 if at else 1)
        new = self._new_statements(module_level=True)
        if at == 0 and not _is_compound(new[0]):
            new[0] = new[0].with_changes(leading_lines=())
        rest = body[at:]
        if rest and _is_compound(self.statements[-1]):
            rest[0] = _with_blank_lines(rest[0], 2)
        return module.with_changes(body=[*body[:at], *new, *rest])


class WrapStatementInIf(SiteTransformer):
    """`stmt` -> `if condition:\\n    stmt`; a stmt already directly under `if condition:` is left alone."""

    def __init__(self, statement: str, condition: str, in_function: str | None = None,
                 not_in_function: str | None = None) -> None:
        super().__init__(in_function, not_in_function)
        stmts = parse_statements(statement)
        small = _single_small(stmts[0]) if len(stmts) == 1 else None
        if small is None:
            raise ValueError("wrap_statement_in_if takes one simple statement")
        self.statement = small
        self.condition = parse_expression(condition)
        self._guarded: set[int] = set()

    def visit_If(self, node: cst.If) -> bool:
        if node.orelse is None and matches(self.condition, node.test):
            if isinstance(node.body, cst.SimpleStatementSuite):
                if self.in_scope() and any(matches(self.statement, s) for s in node.body.body):
                    self.applied.append(self.line(node))
            else:
                self._guarded.add(id(node.body))
        return True

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.BaseSuite:
        if not self.in_scope():
            return updated_node
        guarded = id(original_node) in self._guarded
        body = list(updated_node.body)
        changed = False
        for i, stmt in enumerate(body):
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            small = _single_small(stmt)
            if small is None or not matches(self.statement, small):
                continue
            line = self.line(original_node.body[i])
            if guarded:
                self.applied.append(line)
                continue
            self.pending.append(line)
            inner = stmt.with_changes(leading_lines=())
            body[i] = cst.If(test=self.condition.deep_clone(), body=cst.IndentedBlock(body=[inner]),
                             leading_lines=stmt.leading_lines)
            changed = True
        return updated_node.with_changes(body=body) if changed else updated_node


class AddImport(SiteTransformer):
    """`import module [as alias]` or `from module import name [as alias]`, unless it is already imported."""

    def __init__(self, module: str, name: str | None = None, alias: str | None = None) -> None:
        super().__init__()
        self.module, self.name, self.alias = module, name, alias

    def _binds(self, alias: cst.ImportAlias, name: str) -> bool:
        asname = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None
        return dotted_name(alias.name) == name and asname == self.alias

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        # Where to extend an import of the module: the line's index, its import, the import's names, the new name.
        extend: tuple[int, cst.ImportFrom, Sequence[cst.ImportAlias], str] | None = None
        for i, stmt in enumerate(body):
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if isinstance(small, cst.Import) and self.name is None:
                    if any(self._binds(a, self.module) for a in small.names):
                        self.applied.append(self.line(original_node.body[i]))
                        return updated_node
                if (isinstance(small, cst.ImportFrom) and self.name is not None and not small.relative
                        and small.module is not None and dotted_name(small.module) == self.module
                        and not isinstance(small.names, cst.ImportStar)):
                    if any(self._binds(a, self.name) for a in small.names):
                        self.applied.append(self.line(original_node.body[i]))
                        return updated_node
                    if extend is None and len(stmt.body) == 1:
                        extend = (i, small, small.names, self.name)
        asname = cst.AsName(name=cst.Name(self.alias)) if self.alias else None
        if extend is not None:
            extend_at, import_from, aliases, name = extend
            names = list(aliases)
            new_alias = cst.ImportAlias(name=cst.Name(name), asname=asname)
            if isinstance(names[-1].comma, cst.Comma):
                trailing = names[-1].comma
                between = names[-2].comma if len(names) >= 2 and isinstance(names[-2].comma, cst.Comma) else trailing
                names[-1] = names[-1].with_changes(comma=between)
                new_alias = new_alias.with_changes(comma=trailing)
            body[extend_at] = body[extend_at].with_changes(body=[import_from.with_changes(names=[*names, new_alias])])
            self.pending.append(self.line(original_node.body[extend_at]))
            return updated_node.with_changes(body=body)
        if self.name is None:
            new_small: cst.BaseSmallStatement = cst.Import(names=[cst.ImportAlias(name=_dotted_expr(self.module),
                                                                                  asname=asname)])
        else:
            new_small = cst.ImportFrom(module=_dotted_expr(self.module),
                                       names=[cst.ImportAlias(name=cst.Name(self.name), asname=asname)])
        at = _after_import_block(body)
        self.pending.append(self.line(original_node.body[at]) if at < len(body) else max(1, len(body)))
        new_line = cst.SimpleStatementLine(body=[new_small])
        rest = body[at:]
        if at == 0 and rest:
            # The first statement's leading comments stay at the top, above the new import.
            new_line = new_line.with_changes(leading_lines=rest[0].leading_lines)
            rest[0] = rest[0].with_changes(leading_lines=())
        return updated_node.with_changes(body=[*body[:at], new_line, *rest])


def _dotted_expr(dotted: str) -> cst.Attribute | cst.Name:
    parts = dotted.split(".")
    node: cst.Attribute | cst.Name = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _is_compound(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.BaseCompoundStatement)


def _is_import_line(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    small = _single_small(stmt)
    return isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))


def _after_import_block(body: Sequence[cst.BaseStatement]) -> int:
    """Index just after the module's leading docstring and import lines."""
    at = 0
    for i, stmt in enumerate(body):
        if _is_import_line(stmt):
            at = i + 1
        elif i == 0 and _is_docstring(stmt):
            at = 1
        else:
            break
    return at


def _with_blank_lines(stmt: Statement, n: int) -> Statement:
    lines = list(stmt.leading_lines)
    blanks = 0
    for line in lines:
        if line.comment is not None:
            break
        blanks += 1
    if blanks >= n:
        return stmt
    return stmt.with_changes(leading_lines=[cst.EmptyLine() for _ in range(n - blanks)] + lines)


TRANSFORMERS: dict[str, Callable[..., SiteTransformer]] = {
    "set_call_kwarg": SetCallKwarg,
    "replace_expression": ReplaceExpression,
    "insert_statement": InsertStatement,
    "wrap_statement_in_if": WrapStatementInIf,
    "add_import": AddImport,
}


# ---------------------------------------------------------------------------------------------------------------
# Running one transform: counts -> outcome.

def syntax_error_outcome(path: str, exc: cst.ParserSyntaxError, expect: int = 1) -> Outcome:
    message = getattr(exc, "message", None) or str(exc).splitlines()[0]
    return Outcome(ERROR, f"{path}:{exc.editor_line}:{exc.editor_column}: syntax error: {message}", expected=expect)


def parse_module(source: bytes) -> cst.Module:
    """Parse (raises cst.ParserSyntaxError)."""
    return cst.parse_module(source)


def transform_module(kind: str, params: dict[str, Any], expect: int, module: cst.Module,
                     path: str) -> tuple[Outcome, cst.Module]:
    """Run one libcst transform over a parsed module; the returned module is changed only when the outcome is."""
    transformer = TRANSFORMERS[kind](**params)
    new_module = cst.MetadataWrapper(module, unsafe_skip_copy=True).visit(transformer)
    outcome = decide(path, describe(kind, params), transformer.pending, transformer.applied, expect,
                     conflict=transformer.conflict)
    return outcome, (new_module if outcome.changes else module)
