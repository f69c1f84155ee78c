"""YAML loading that remembers where every value came from, so errors can say `file:line:`."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KeyPath = tuple[Any, ...]
# libyaml's parser when PyYAML was built with it (it keeps line marks too): several times faster than the pure one.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(slots=True)
class YamlDoc:
    """Plain data (dicts, lists, scalars) plus the line of each key path."""

    path: str
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line(self, keypath: KeyPath) -> int:
        """Line of keypath, or of its nearest ancestor that has one."""
        while keypath:
            if keypath in self.lines:
                return self.lines[keypath]
            keypath = keypath[:-1]
        return self.lines.get((), 1)

    def where(self, keypath: KeyPath) -> str:
        """`file:line` for keypath."""
        return f"{self.path}:{self.line(keypath)}"


def dotted(keypath: KeyPath) -> str:
    """hosts.h200-b.port / hosts.h200-b.groups[0]."""
    out = ""
    for part in keypath:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def load_yaml_text(text: str, path: str, error: Callable[[str], Exception]) -> YamlDoc:
    """Parse text; raise error("file:line: ...") on syntax errors and duplicate keys."""
    try:
        try:
            node = yaml.compose(text, Loader=_LOADER)
        except yaml.YAMLError:
            # Say what is wrong in the pure parser's words, whichever parser this PyYAML has.
            node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{path}:{line}: invalid YAML: {problem}") from None
    doc = YamlDoc(path=path, data=None)
    if node is None:
        doc.data = None
        return doc
    constructor = yaml.constructor.SafeConstructor()
    doc.data = _build(node, (), doc, constructor, error)
    return doc


def load_yaml_file(path: str | os.PathLike[str], error: Callable[[str], Exception]) -> YamlDoc:
    """Read and parse a YAML file; unreadable or non-UTF-8 files are errors naming the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except OSError as exc:
        raise error(f"{p}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{p}:{line}: not valid UTF-8") from None
    return load_yaml_text(text, str(p), error)


def _build(node: yaml.Node, keypath: KeyPath, doc: YamlDoc, constructor: yaml.constructor.SafeConstructor,
           error: Callable[[str], Exception]) -> Any:
    doc.lines[keypath] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise error(f"{doc.path}:{key_node.start_mark.line + 1}: mapping keys must be plain strings")
            key = constructor.construct_object(key_node)
            if key == "<<":
                raise error(f"{doc.path}:{key_node.start_mark.line + 1}: YAML merge keys are not supported")
            if key in out:
                raise error(f"{doc.path}:{key_node.start_mark.line + 1}: {dotted(keypath + (key,))}: duplicate key")
            child = keypath + (key,)
            out[key] = _build(value_node, child, doc, constructor, error)
            doc.lines[child] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, keypath + (i,), doc, constructor, error) for i, item in enumerate(node.value)]
    return constructor.construct_object(node)


def suggest(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'port'?)` or ''."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "a list", dict: "a mapping",
              float: "a number"}


def type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(TYPE_NAMES.get(x, x.__name__) for x in t)
    return TYPE_NAMES.get(t, t.__name__)


def describe(value: Any) -> str:
    return "nothing" if value is None else type_name(type(value))
