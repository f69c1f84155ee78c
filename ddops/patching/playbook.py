"""Patch playbooks: YAML files of patches (files, one transform, checks), validated with `file:line:` errors.

No libcst here: transform params are checked against the libcst-free registry in ddops.patching.kinds."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

from ddops import settings
from ddops.errors import PlaybookError
from ddops.inventory import Inventory, looks_like_playbook_path
from ddops.ownership import UNTRUSTED_PLAYBOOKS, untrusted_in
from ddops.patching.kinds import (ADD_MODULE, CHECK_COMMON, CHECK_KINDS, DEFAULT_COMMAND_TIMEOUT, SINGLE_SITE_KINDS,
                                  TEXT_KINDS, TRANSFORM_KINDS, Param, substitute_placeholders, syntax_problem)
from ddops.yamlsrc import YamlDoc, describe, dotted, load_yaml_file, suggest, type_name

TOP_KEYS: dict[str, type | tuple[type, ...]] = {"name": str, "description": str, "kind": str, "patches": list}
PATCH_KEYS: dict[str, type | tuple[type, ...]] = {
    "id": str, "description": str, "files": list, "transform": dict, "checks": list, "requires": list,
}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FORBIDDEN_DIRS = (".git", ".ddops")
_BENCH_KEYS = ("summarizer", "requires_patches", "matrix", "results")


@dataclass(frozen=True, slots=True)
class TransformSpec:
    """A transform kind and its validated params; `expect` sites per file (default 1)."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    expect: int = 1
    expect_by_file: tuple[tuple[str, int], ...] = ()
    where: str = field(default="", compare=False, hash=False)
    module: bytes | None = field(default=None, repr=False)  # add_module: the source file's bytes, read at load

    def expect_for(self, path: str) -> int:
        """How many sites this transform must find in path."""
        return dict(self.expect_by_file).get(path, self.expect)

    @property
    def plain_text(self) -> bool:
        return self.kind in TEXT_KINDS

    def to_dict(self) -> dict[str, Any]:
        expect: Any = dict(self.expect_by_file) if self.expect_by_file else self.expect
        module = {"source_sha256": hashlib.sha256(self.module).hexdigest()} if self.module is not None else {}
        return {"kind": self.kind, **dict(self.params), **module, "expect": expect}


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One check run after a write: contains | absent | unchanged | count | compiles | command."""

    kind: str
    text: str | None = None
    regex: str | None = None
    count: int | None = None
    run: str | None = None
    timeout: float = DEFAULT_COMMAND_TIMEOUT
    file: str | None = None
    label: str | None = None
    where: str = field(default="", compare=False, hash=False)

    @property
    def name(self) -> str:
        """The user's name for it, or a readable default like `contains 'x = 1'`."""
        if self.label:
            return self.label
        if self.kind == "compiles":
            return "compiles"
        if self.kind == "command":
            return f"command {self.run!r}"
        pattern = f"/{self.regex}/" if self.regex is not None else repr(self.text)
        return f"count {pattern} == {self.count}" if self.kind == "count" else f"{self.kind} {pattern}"

    @property
    def runs_on_host(self) -> bool:
        """Command checks are carried to the host and run there by the agent; the rest are pure."""
        return self.kind == "command"

    def applies_to(self, path: str) -> bool:
        return self.file is None or self.file == path

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("text", "regex", "count", "run", "file"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.kind == "command":
            out["timeout"] = self.timeout
        if self.label:
            out["name"] = self.label
        return out


@dataclass(frozen=True, slots=True)
class Patch:
    """One named change: which files, how (one transform), what proves it (checks), what must come first."""

    id: str
    description: str
    files: tuple[str, ...]
    transform: TransformSpec
    checks: tuple[CheckSpec, ...] = ()
    requires: tuple[str, ...] = ()
    where: str = field(default="", compare=False, hash=False)

    def checks_for(self, path: str) -> tuple[CheckSpec, ...]:
        return tuple(c for c in self.checks if c.applies_to(path))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "description": self.description, "files": list(self.files),
                "transform": self.transform.to_dict(), "checks": [c.to_dict() for c in self.checks],
                "requires": list(self.requires)}


@dataclass(frozen=True, slots=True)
class PatchPlaybook:
    """A named list of patches, in an order that honours every `requires`."""

    name: str
    description: str
    patches: tuple[Patch, ...]
    path: str = field(default="", compare=False)

    def patch(self, patch_id: str) -> Patch:
        for p in self.patches:
            if p.id == patch_id:
                return p
        raise KeyError(patch_id)

    @property
    def files(self) -> tuple[str, ...]:
        """Every file any patch touches, in first-mention order."""
        return tuple(dict.fromkeys(f for p in self.patches for f in p.files))


# Folders (separated by ':') searched for playbooks and bench plans after the inventory's `playbook_dirs:` and
# before the built-ins.
PLAYBOOK_PATH_ENV = settings.PLAYBOOK_PATH.name


def builtin_dirs() -> tuple[Path, ...]:
    """Where the built-in playbooks and bench plans are (ddops.resources)."""
    from ddops.resources import playbooks_dir

    return (playbooks_dir(),)


def search_path(playbook_dirs: Iterable[str] = ()) -> tuple[Path, ...]:
    """Where a bare playbook or plan name is looked up, first match wins: an inventory's `playbook_dirs:` (checked
    when it loads), then $DDOPS_PLAYBOOK_PATH, then the built-ins; a folder of the user's that another user could
    change is refused."""
    env = [Path(d).expanduser() for d in (settings.PLAYBOOK_PATH.value() or "").split(os.pathsep) if d]
    for folder in env:
        untrusted = untrusted_in(folder) if folder.is_dir() else None
        if untrusted:
            raise PlaybookError(f"{settings.PLAYBOOK_PATH.name}: {untrusted}: {UNTRUSTED_PLAYBOOKS}")
    return (*(Path(d).expanduser() for d in playbook_dirs), *env, *builtin_dirs())


def find_named(name: str, dirs: Iterable[Path]) -> Path | None:
    """`<dir>/<name>.yaml` (or .yml) from the first of dirs that has it; a note on stderr when a folder of the user's
    shadows the built-in of that name (so that no one runs a copy believing it is ddops' own)."""
    builtins = {d.resolve() for d in builtin_dirs()}
    for folder in dirs:
        for candidate in (folder / f"{name}.yaml", folder / f"{name}.yml"):
            if candidate.is_file():
                if folder.resolve() not in builtins and find_named(name, builtin_dirs()) is not None:
                    _say_once(f"ddops: note: {candidate} shadows the built-in {name}")
                return candidate
    return None


@functools.cache
def _say_once(note: str) -> None:
    print(note, file=sys.stderr)


def load_inventory_playbooks(inventory: Inventory, names: Sequence[str] | None = None) -> list[PatchPlaybook]:
    """The playbooks named on the command line, else the inventory's `patches:`, found along its search path; a
    bad entry in `patches:` is an error at its file:line."""
    dirs = search_path(inventory.playbook_dirs)
    if names:
        return load_playbooks(names, dirs)
    books = []
    for i, name in enumerate(inventory.patches):
        try:
            books.append(load_playbook(name, dirs))
        except PlaybookError as exc:
            where = inventory.patches_where[i] if i < len(inventory.patches_where) else inventory.path
            raise PlaybookError(f"{where}: patches[{i}]: {exc}") from None
    return check_unique_ids(books)


def playbooks_defining(patch_ids: Iterable[str], inventory: Inventory | None = None) -> list[PatchPlaybook]:
    """The playbooks that hold any of patch_ids: the inventory's `patches:` given as paths, then those along its
    search path (of two with one name, the first found, as `ddops patch NAME` loads it)."""
    wanted = set(patch_ids)
    if not wanted:
        return []
    dirs = search_path(inventory.playbook_dirs if inventory is not None else ())
    paths = [p for p in (inventory.patches if inventory is not None else ()) if looks_like_playbook_path(p)]
    books = [load_playbook(p) for p in paths] + [load_playbook(name, dirs) for name in list_playbooks(dirs)]
    found: dict[str, PatchPlaybook] = {}
    for book in books:
        if wanted & {p.id for p in book.patches}:
            found.setdefault(str(book.path), book)
    return list(found.values())


def list_playbooks(search_dirs: Iterable[Path | str] | None = None) -> list[str]:
    """Names of the patch playbooks found in search_dirs (default: the built-in ones)."""
    names: dict[str, None] = {}
    for d in (search_dirs if search_dirs is not None else search_path()):
        for p in sorted(Path(d).glob("*.y*ml")):
            if p.suffix in (".yaml", ".yml") and _is_patch_file(p):
                names.setdefault(p.stem)
    return list(names)


def resolve_playbook(name_or_path: str, search_dirs: Iterable[Path | str] | None = None) -> Path:
    """A bare name -> `<dir>/<name>.yaml` from search_dirs (default: search_path()); anything path-like -> that
    path."""
    dirs = [Path(d) for d in (search_dirs if search_dirs is not None else search_path())]
    if looks_like_playbook_path(name_or_path):
        return Path(name_or_path).expanduser()
    found = find_named(name_or_path, dirs)
    if found is not None:
        return found
    known = list_playbooks(dirs)
    where = ", ".join(str(d) for d in dirs) or "no directories"
    raise PlaybookError(f"no playbook named '{name_or_path}' (looked in {where}){suggest(name_or_path, known)}")


def load_playbook(name_or_path: str | Path, search_dirs: Iterable[Path | str] | None = None) -> PatchPlaybook:
    """Load and validate a patch playbook by name or path; every error is a PlaybookError starting `file:line:`."""
    path = resolve_playbook(str(name_or_path), search_dirs)
    return parse_playbook(load_yaml_file(path, PlaybookError))


def load_playbooks(names: Sequence[str], search_dirs: Iterable[Path | str] | None = None) -> list[PatchPlaybook]:
    """Several playbooks; patch ids must be unique across all of them (the journal keys on them)."""
    return check_unique_ids([load_playbook(n, search_dirs) for n in names])


def check_unique_ids(books: list[PatchPlaybook]) -> list[PatchPlaybook]:
    """The books, when no patch id is used by two of them."""
    seen: dict[str, str] = {}
    for book in books:
        for p in book.patches:
            if p.id in seen and seen[p.id] != book.path:
                raise PlaybookError(f"{p.where}: patch id '{p.id}' is also used in {seen[p.id]}")
            seen[p.id] = book.path
    return books


def is_bench_plan(data: object) -> bool:
    """A document with a bench plan's keys and no patches."""
    return isinstance(data, dict) and "patches" not in data and any(k in data for k in _BENCH_KEYS)


def parse_playbook(doc: YamlDoc) -> PatchPlaybook:
    """Validate a parsed YAML document as a patch playbook."""
    data = doc.data
    if data is None:
        raise _err(doc, (), "the playbook is empty (expected `name:`, `description:` and `patches:`)")
    if isinstance(data, dict) and data.get("kind", "patch") != "patch":
        raise _err(doc, ("kind",), f"is '{data['kind']}': this file is not a patch playbook (kind: patch)")
    if is_bench_plan(data):
        raise _err(doc, (), "this is a bench plan (run it with `ddops bench`), not a patch playbook")
    _expect_keys(doc, (), data, TOP_KEYS, required=("name", "patches"))
    name = data["name"]
    if not _ID.match(name):
        raise _err(doc, ("name",), "use letters, digits, '.', '_' and '-' only")
    raw_patches = data["patches"]
    if not raw_patches:
        raise _err(doc, ("patches",), "must list at least one patch")
    patches: list[Patch] = []
    for i, raw in enumerate(raw_patches):
        patches.append(_parse_patch(doc, ("patches", i), raw))
    return PatchPlaybook(name=name, description=data.get("description") or "", patches=_ordered(doc, patches),
                         path=doc.path)


def _parse_patch(doc: YamlDoc, kp: tuple, raw: Any) -> Patch:
    _expect_keys(doc, kp, raw, PATCH_KEYS, required=("id", "files", "transform"))
    pid = raw["id"]
    if not _ID.match(pid):
        raise _err(doc, kp + ("id",), f"'{pid}': use letters, digits, '.', '_' and '-' only")
    files = raw["files"]
    if not files:
        raise _err(doc, kp + ("files",), "must list at least one file")
    clean_files: list[str] = []
    for j, f in enumerate(files):
        clean = _clean_path(doc, kp + ("files", j), f)
        if clean in clean_files:
            raise _err(doc, kp + ("files", j), f"'{clean}' is listed twice")
        clean_files.append(clean)
    transform = _parse_transform(doc, kp + ("transform",), raw["transform"], tuple(clean_files))
    checks = tuple(_parse_check(doc, kp + ("checks", j), c, tuple(clean_files))
                   for j, c in enumerate(raw.get("checks") or []))
    requires = raw.get("requires") or []
    for j, r in enumerate(requires):
        if not isinstance(r, str):
            raise _err(doc, kp + ("requires", j), f"must be a patch id, not {describe(r)}")
    return Patch(id=pid, description=raw.get("description") or "", files=tuple(clean_files), transform=transform,
                 checks=checks, requires=tuple(requires), where=doc.where(kp))


def _parse_transform(doc: YamlDoc, kp: tuple, raw: dict, files: tuple[str, ...]) -> TransformSpec:
    if "kind" not in raw:
        raise _err(doc, kp, f"missing `kind:` (one of {', '.join(TRANSFORM_KINDS)})")
    kind = raw["kind"]
    if kind not in TRANSFORM_KINDS:
        raise _err(doc, kp + ("kind",), f"unknown transform kind '{kind}'{suggest(kind, TRANSFORM_KINDS)}"
                   f"; known: {', '.join(TRANSFORM_KINDS)}")
    spec = TRANSFORM_KINDS[kind]
    allowed = {"kind": Param(str), "expect": Param((int, dict)), **spec}
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in allowed:
            raise _err(doc, kp + (key,), f"unknown param for {kind}{suggest(key, allowed)}"
                       f"; {kind} takes: {', '.join(spec) or 'no params'}, expect")
        _check_param(doc, kp + (key,), allowed[key], value)
        if key not in ("kind", "expect"):
            params[key] = value
    for key, param in spec.items():
        if param.required and key not in params:
            raise _err(doc, kp, f"{kind} needs `{key}:` ({param.doc})")
    if kind == "insert_statement":
        position = params.get("position", "after")
        if position == "after_imports" and "anchor" in params:
            raise _err(doc, kp + ("anchor",), "position after_imports takes no anchor")
        if position != "after_imports" and "anchor" not in params:
            raise _err(doc, kp, "insert_statement needs `anchor:` (or `position: after_imports`)")
        for key in ("in_function", "not_in_function"):
            if position == "after_imports" and key in params:
                raise _err(doc, kp + (key,), "position after_imports inserts at module level")
    if kind == "text_replace":
        for key in ("old", "new"):
            if params[key] == "":
                raise _err(doc, kp + (key,), "must not be empty (the new text is how ddops sees the patch applied)")
    if kind == "replace_expression":
        _, bound = substitute_placeholders(params["match"])
        _, used = substitute_placeholders(params["replace"])
        unbound = [f"${n}" for n in used if n not in bound]
        if unbound:
            raise _err(doc, kp + ("replace",), f"uses {', '.join(unbound)}, which `match` does not bind")
    if kind == "text_replace" and params["old"] == params["new"]:
        raise _err(doc, kp + ("new",), "is the same as old: the patch would do nothing")
    expect, by_file = _parse_expect(doc, kp, raw.get("expect", 1), kind, files)
    module = _read_module(doc, kp, params["source"], files) if kind == ADD_MODULE else None
    return TransformSpec(kind=kind, params=MappingProxyType(params), expect=expect, expect_by_file=by_file,
                         where=doc.where(kp), module=module)


def _read_module(doc: YamlDoc, kp: tuple, source: str, files: tuple[str, ...]) -> bytes:
    """The bytes of add_module's source, a Python file beside the playbook that compiles."""
    if len(files) != 1 or not files[0].endswith(".py"):
        raise _err(doc, kp[:-1] + ("files",), "add_module creates exactly one file, a Python module (`files: [x.py]`)")
    if "/" in source or "\\" in source or not source.endswith(".py") or source.startswith("."):
        raise _err(doc, kp + ("source",), f"'{source}': name a .py file beside the playbook (no folder)")
    path = Path(doc.path).parent / source
    try:
        data = path.read_bytes()
        compile(data, str(path), "exec", dont_inherit=True)
    except OSError as exc:
        raise _err(doc, kp + ("source",), f"cannot read {path}: {exc.strerror}") from None
    except SyntaxError as exc:
        raise _err(doc, kp + ("source",), f"{path}:{exc.lineno or 1}: does not compile: {exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise _err(doc, kp + ("source",), f"{path}: does not compile: {exc}") from None
    return data


def _parse_expect(doc: YamlDoc, kp: tuple, value: Any, kind: str, files: tuple[str, ...]
                  ) -> tuple[int, tuple[tuple[str, int], ...]]:
    if isinstance(value, dict):
        by_file: list[tuple[str, int]] = []
        for f, n in value.items():
            if f not in files:
                raise _err(doc, kp + ("expect", f), f"'{f}' is not one of this patch's files{suggest(f, files)}")
            _positive_count(doc, kp + ("expect", f), n, kind)
            by_file.append((f, n))
        missing = [f for f in files if f not in value]
        if missing:
            raise _err(doc, kp + ("expect",), f"gives no count for {', '.join(missing)}")
        return 1, tuple(by_file)
    _positive_count(doc, kp + ("expect",), value, kind)
    return value, ()


def _positive_count(doc: YamlDoc, kp: tuple, n: Any, kind: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise _err(doc, kp, f"must be a positive integer (sites to find), not {n!r}")
    if kind in SINGLE_SITE_KINDS and n != 1:
        raise _err(doc, kp, f"{kind} always has exactly one site")


def _parse_check(doc: YamlDoc, kp: tuple, raw: Any, files: tuple[str, ...]) -> CheckSpec:
    if isinstance(raw, str):
        raw = {"kind": raw}
    if not isinstance(raw, dict):
        raise _err(doc, kp, f"must be a mapping with `kind:` (or the word `compiles`), not {describe(raw)}")
    kind = raw.get("kind")
    if kind is None:
        raise _err(doc, kp, f"missing `kind:` (one of {', '.join(CHECK_KINDS)})")
    if kind not in CHECK_KINDS:
        raise _err(doc, kp + ("kind",) if "kind" in raw else kp,
                   f"unknown check kind '{kind}'{suggest(kind, CHECK_KINDS)}; known: {', '.join(CHECK_KINDS)}")
    allowed = {**CHECK_COMMON, **CHECK_KINDS[kind]}
    for key, value in raw.items():
        if key not in allowed:
            raise _err(doc, kp + (key,), f"unknown key for a {kind} check{suggest(key, allowed)}")
        _check_param(doc, kp + (key,), allowed[key], value)
    for key, param in CHECK_KINDS[kind].items():
        if param.required and key not in raw:
            raise _err(doc, kp, f"a {kind} check needs `{key}:`")
    if kind in ("contains", "absent", "count"):
        if ("text" in raw) == ("regex" in raw):
            raise _err(doc, kp, f"a {kind} check needs exactly one of `text:` or `regex:`")
    if "regex" in raw:
        try:
            re.compile(raw["regex"])
        except re.error as exc:
            raise _err(doc, kp + ("regex",), f"invalid regular expression: {exc}") from None
    for key in ("text", "regex", "run"):
        if key in raw and raw[key] == "":
            raise _err(doc, kp + (key,), "must not be empty")
    if "count" in raw and raw["count"] < 0:
        raise _err(doc, kp + ("count",), "must be zero or more")
    if "timeout" in raw and raw["timeout"] <= 0:
        raise _err(doc, kp + ("timeout",), "must be a positive number of seconds")
    file = raw.get("file")
    if file is not None:
        file = _clean_path(doc, kp + ("file",), file)
        if file not in files:
            raise _err(doc, kp + ("file",), f"'{file}' is not one of this patch's files{suggest(file, files)}")
    return CheckSpec(kind=kind, text=raw.get("text"), regex=raw.get("regex"), count=raw.get("count"),
                     run=raw.get("run"), timeout=float(raw.get("timeout", DEFAULT_COMMAND_TIMEOUT)), file=file,
                     label=raw.get("name"), where=doc.where(kp))


def _check_param(doc: YamlDoc, kp: tuple, param: Param, value: Any) -> None:
    expected = param.type
    bad_bool = isinstance(value, bool) and expected is not bool and (
        expected is int or (isinstance(expected, tuple) and bool not in expected))
    if not isinstance(value, expected) or bad_bool:
        raise _err(doc, kp, f"must be {type_name(expected)}, not {describe(value)}")
    if param.choices and value not in param.choices:
        raise _err(doc, kp, f"'{value}' is not one of {', '.join(param.choices)}{suggest(str(value), param.choices)}")
    if param.syntax and isinstance(value, str):
        problem = syntax_problem(value, param.syntax)
        if problem:
            raise _err(doc, kp, problem)


def _clean_path(doc: YamlDoc, kp: tuple, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _err(doc, kp, f"must be a relative file path, not {describe(value)}")
    if value.startswith(("/", "~", "\\")) or re.match(r"^[A-Za-z]:", value):
        raise _err(doc, kp, f"'{value}' is absolute: paths are relative to the repo")
    if "\\" in value:
        raise _err(doc, kp, f"'{value}': use '/' between path parts")
    parts = PurePosixPath(value).parts
    if ".." in parts:
        raise _err(doc, kp, f"'{value}' contains '..': paths must stay inside the repo")
    clean = str(PurePosixPath(*[p for p in parts if p != "."])) if parts else ""
    if not clean or clean == ".":
        raise _err(doc, kp, f"'{value}' is not a file path")
    if clean.split("/")[0] in _FORBIDDEN_DIRS:
        raise _err(doc, kp, f"'{value}' is inside {clean.split('/')[0]}/, which ddops does not patch")
    return clean


def _ordered(doc: YamlDoc, patches: list[Patch]) -> tuple[Patch, ...]:
    """Declaration order, moved only as much as `requires` demands; unknown ids and cycles are errors."""
    by_id: dict[str, Patch] = {}
    for i, p in enumerate(patches):
        if p.id in by_id:
            raise _err(doc, ("patches", i, "id"), f"duplicate patch id '{p.id}'")
        by_id[p.id] = p
    for i, p in enumerate(patches):
        for j, r in enumerate(p.requires):
            if r not in by_id:
                raise _err(doc, ("patches", i, "requires", j), f"no patch '{r}' in this playbook{suggest(r, by_id)}")
            if r == p.id:
                raise _err(doc, ("patches", i, "requires", j), "a patch cannot require itself")
    out: list[Patch] = []
    placed: set[str] = set()
    visiting: list[str] = []

    def place(p: Patch) -> None:
        if p.id in placed:
            return
        if p.id in visiting:
            cycle = " -> ".join(visiting[visiting.index(p.id):] + [p.id])
            raise PlaybookError(f"{p.where}: requires form a cycle: {cycle}")
        visiting.append(p.id)
        for r in p.requires:
            place(by_id[r])
        visiting.pop()
        placed.add(p.id)
        out.append(p)

    for p in patches:
        place(p)
    return tuple(out)


def _expect_keys(doc: YamlDoc, kp: tuple, data: Any, allowed: Mapping[str, type | tuple[type, ...]],
                 required: tuple[str, ...] = ()) -> None:
    if not isinstance(data, dict):
        raise _err(doc, kp, f"must be a mapping, not {describe(data)}")
    for key, value in data.items():
        if key not in allowed:
            raise _err(doc, kp + (key,), f"unknown key{suggest(key, allowed)}")
        expected = allowed[key]
        if value is None and expected in (list, str):
            if key in required:
                raise _err(doc, kp + (key,), f"must be {type_name(expected)}, not nothing")
            continue
        if not isinstance(value, expected) or isinstance(value, bool):
            raise _err(doc, kp + (key,), f"must be {type_name(expected)}, not {describe(value)}")
    for key in required:
        if key not in data:
            raise _err(doc, kp, f"missing `{key}:`")


def _is_patch_file(path: Path) -> bool:
    try:
        head = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"^patches\s*:", head, re.MULTILINE) is not None and re.search(
        r"^kind\s*:\s*(?!patch\b)", head, re.MULTILINE) is None


def _err(doc: YamlDoc, keypath: tuple, message: str) -> PlaybookError:
    return PlaybookError(f"{doc.where(keypath)}: {dotted(keypath)}: {message}")


def fingerprint(patches: Sequence[Patch]) -> str:
    """A stable text naming exactly what the patches do (not where they were written)."""
    return json.dumps([p.to_dict() for p in patches], sort_keys=True, separators=(",", ":"))
