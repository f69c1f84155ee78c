"""Pure planning: (file bytes, patches) -> FilePlan with each patch's outcome, the new bytes and a unified diff.

The AST work is done once per distinct (content, patches): a Planner caches plans by the content's sha256, so
forty hosts on the same commit cost one transform."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from ddops import settings
from ddops.patching.kinds import (ADD_MODULE, AMBIGUOUS, APPLIED, BLOCKED, DRIFTED, ERROR, FAILED_STATES, MODIFIED,
                                  PARTIAL, PENDING, TEXT_KINDS, Outcome, describe)
from ddops.patching.playbook import Patch, TransformSpec, fingerprint
from ddops.patching.text import text_replace, utf8_error

if TYPE_CHECKING:
    import libcst as cst

# libcst (slow to import: benchmarks/fleet-speed/RESULTS.md) and the transforms load only when a plan needs them: a
# rerun whose plans are all in the on-disk cache never pays for the parser, and neither does a file that the prefilter
# (prefilter.py) settles: one whose text lacks the names every site needs. DDOPS_PLAN_ENGINE=libcst turns it off.

# libcst needs minutes for a few MB of code (RESULTS.md, "Costs the code's comments refer to"): bigger Python files
# are refused so that a generated 5 MB module cannot stall a fleet run. Real DDTree modules are tens of KB;
# text_replace has no limit.
MAX_PYTHON_TRANSFORM_BYTES = 1024 * 1024

# Worst first: a file's (or a patch's) state is the worst of its parts.
SEVERITY = (ERROR, AMBIGUOUS, DRIFTED, BLOCKED, MODIFIED, PARTIAL, PENDING, APPLIED)


def worst(states: Iterable[str]) -> str:
    """The most severe state of several (APPLIED when there are none)."""
    found = set(states)
    for s in SEVERITY:
        if s in found:
            return s
    return APPLIED


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class PatchResult:
    """One patch's outcome on one file."""

    patch_id: str
    outcome: Outcome

    @property
    def state(self) -> str:
        return self.outcome.state

    @property
    def message(self) -> str:
        return self.outcome.message


@dataclass(frozen=True, slots=True)
class FilePlan:
    """What applying the patches, in order, does to one file; `new` is what to write (None: file missing)."""

    path: str
    before_sha: str | None
    after_sha: str | None
    new: bytes | None = field(repr=False)
    results: tuple[PatchResult, ...]
    diff: str = ""

    @property
    def changed(self) -> bool:
        return self.before_sha != self.after_sha

    @property
    def state(self) -> str:
        return worst(r.state for r in self.results)

    def outcome(self, patch_id: str) -> Outcome:
        for r in self.results:
            if r.patch_id == patch_id:
                return r.outcome
        raise KeyError(patch_id)


@dataclass(frozen=True, slots=True)
class HostPlan:
    """Every file plan for one host's snapshot."""

    files: tuple[FilePlan, ...]

    @property
    def changed(self) -> bool:
        return any(f.changed for f in self.files)

    def patch_state(self, patch_id: str) -> str:
        """The worst state of a patch over the files it touches."""
        return worst(r.state for f in self.files for r in f.results if r.patch_id == patch_id)

    @property
    def state(self) -> str:
        return worst(f.state for f in self.files)

    @property
    def diff(self) -> str:
        return "".join(f.diff for f in sorted(self.files, key=lambda f: f.path))


class _Working:
    """The file as the patches go: bytes (None: no such file), or a parsed module once a Python transform needed one."""

    def __init__(self, data: bytes | None) -> None:
        self._data = data
        self._module: cst.Module | None = None
        self.syntax_error: cst.ParserSyntaxError | None = None

    def module(self) -> cst.Module:
        import libcst as cst

        from ddops.patching import transforms

        if self._module is None:
            if self.syntax_error is not None:
                raise self.syntax_error
            try:
                self._module = transforms.parse_module(self.data() or b"")
            except cst.ParserSyntaxError as exc:
                self.syntax_error = exc
                raise
        return self._module

    def set_module(self, module: cst.Module) -> None:
        self._module, self._data = module, None

    def data(self) -> bytes | None:
        if self._data is None and self._module is not None:
            self._data = self._module.bytes
        return self._data

    def set_data(self, data: bytes) -> None:
        self._data, self._module, self.syntax_error = data, None, None


def plan_file(path: str, source: bytes | None, patches: Sequence[Patch],
              blocked: Mapping[str, str] | None = None, ours: str | None = None) -> FilePlan:
    """Apply patches (those that touch path, in order) to source, without writing anything; None = no such file.

    A patch whose `requires` did not apply cleanly to this file, or that is named in `blocked` (id -> reason), is
    BLOCKED and changes nothing. `ours`: the sha256 of what ddops last wrote to path for an add_module patch still
    applied (an older version of the module, which it may replace)."""
    blocked = blocked or {}
    encoding_error = utf8_error(path, source) if source is not None else None
    work = _Working(source)
    results: list[PatchResult] = []
    states: dict[str, str] = {}
    for patch in patches:
        spec = patch.transform
        expect = spec.expect_for(path)
        failed = [r for r in patch.requires if states.get(r) in FAILED_STATES]
        if work.data() is None and spec.kind != ADD_MODULE:
            outcome = Outcome(DRIFTED, f"{path}: no such file in the repo (removed or renamed upstream?)",
                              expected=expect, plain_text=spec.plain_text)
        elif encoding_error is not None:
            outcome = dataclasses.replace(encoding_error, expected=expect, plain_text=spec.plain_text)
        elif patch.id in blocked:
            outcome = Outcome(BLOCKED, f"{path}: {blocked[patch.id]}", expected=expect, plain_text=spec.plain_text)
        elif failed:
            outcome = Outcome(BLOCKED, f"{path}: requires {', '.join(failed)}, which is "
                                       f"{states[failed[0]]} here: not applied",
                              expected=expect, plain_text=spec.plain_text)
        elif spec.kind == ADD_MODULE:
            outcome = add_module(path, work.data(), spec, ours)
            if outcome.changes:
                work.set_data(spec.module or b"")
        else:
            outcome = _run(spec.kind, dict(spec.params), expect, path, work)
        states[patch.id] = outcome.state
        results.append(PatchResult(patch.id, outcome))
    new = work.data()
    diff = unified_diff(path, source, new) if new != source else ""
    return FilePlan(path, _sha_or_none(source), _sha_or_none(new), new, tuple(results), diff)


def add_module(path: str, current: bytes | None, spec: TransformSpec, ours: str | None) -> Outcome:
    """add_module's outcome: create the file, leave it, replace the older version ddops wrote, or refuse a file that
    someone else wrote (or edited since)."""
    what = f"{path}: {describe(spec.kind, spec.params)}"
    if current == spec.module:
        return Outcome(APPLIED, f"{what}: already there", applied_lines=(1,))
    if current is None:
        return Outcome(PENDING, f"{what}: would create it", pending_lines=(1,))
    if sha256(current) == ours:
        return Outcome(PENDING, f"{what}: would replace the older version ddops wrote", pending_lines=(1,))
    if ours:
        return Outcome(MODIFIED, f"{what}: changed since ddops wrote it: not overwritten (`ddops rollback --force` "
                                 "saves the edit and removes the file)")
    return Outcome(DRIFTED, f"{what}: a file ddops did not write is there: not overwritten (move it away)")


def _sha_or_none(data: bytes | None) -> str | None:
    return sha256(data) if data is not None else None


def _run(kind: str, params: dict, expect: int, path: str, work: _Working) -> Outcome:
    data = work.data() or b""
    if kind in TEXT_KINDS:
        outcome, data = text_replace(data, params["old"], params["new"], expect, path)
        if outcome.changes:
            work.set_data(data)
        return outcome
    size = len(data)
    if size > MAX_PYTHON_TRANSFORM_BYTES:
        return Outcome(ERROR, f"{path}: {size} bytes, over the {MAX_PYTHON_TRANSFORM_BYTES} byte limit for Python "
                              "transforms (parsing it would take minutes)", expected=expect)
    # The seam of the one speed trick (prefilter.py, beside the transforms): libcst's answer for a file that cannot
    # hold a site, or None where it cannot vouch for it. Without it, libcst answers every file, the same way.
    if work.syntax_error is None and settings.PLAN_ENGINE.value() != "libcst":
        from ddops.patching import prefilter

        settled = prefilter.plan_without_libcst(kind, params, expect, path, data)
        if settled is not None:
            return settled
    return _run_libcst(kind, params, expect, path, work)


def _run_libcst(kind: str, params: dict, expect: int, path: str, work: _Working) -> Outcome:
    import libcst as cst

    from ddops.patching import transforms

    try:
        module = work.module()
    except cst.ParserSyntaxError as exc:
        return transforms.syntax_error_outcome(path, exc, expect)
    try:
        outcome, new_module = transforms.transform_module(kind, params, expect, module, path)
    except Exception as exc:  # a bug or an unusable template must fail this patch, not the whole fleet run
        return Outcome(ERROR, f"{path}: {kind} failed: {type(exc).__name__}: {exc}", expected=expect)
    if outcome.changes:
        work.set_module(new_module)
    return outcome


def _split_lines(text: str) -> list[str]:
    """Lines with their endings, split on \\n only (like grep and diff, unlike str.splitlines)."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def unified_diff(path: str, before: bytes | None, after: bytes | None, context: int = 3) -> str:
    """A `git diff`-style unified diff of before -> after (CRLF shown as plain line ends); None: no file, shown as
    /dev/null."""
    a = _split_lines(before.decode("utf-8", "replace")) if before is not None else []
    b = _split_lines(after.decode("utf-8", "replace")) if after is not None else []
    names = (f"a/{path}" if before is not None else "/dev/null", f"b/{path}" if after is not None else "/dev/null")
    out: list[str] = []
    for line in difflib.unified_diff(a, b, *names, n=context):
        if line.endswith("\n"):
            out.append(line[:-1].removesuffix("\r") + "\n")
        else:
            out.append(line.removesuffix("\r") + "\n\\ No newline at end of file\n")
    return "".join(out)


@lru_cache(maxsize=256)
def _key_for(path: str, patches: tuple[Patch, ...], blocked: tuple[tuple[str, str], ...], ours: str | None) -> str:
    return sha256(f"{path}\0{fingerprint(patches)}\0{blocked!r}\0{ours}".encode())


class PlanCache(Protocol):
    """Where plans outlive a run: `load` gives None when it has no valid entry; `save` may silently fail."""

    def load(self, key: tuple[str | None, str], path: str, source: bytes) -> FilePlan | None: ...

    def save(self, key: tuple[str | None, str], plan: FilePlan) -> None: ...


class Planner:
    """plan_file with a cache keyed by (sha256 of content, patches fingerprint); safe to share between threads.

    Concurrent requests for the same key wait for the first one instead of transforming again."""

    def __init__(self, max_entries: int = 1024, store: PlanCache | None = None) -> None:
        self.max_entries = max_entries
        self.cache_hits = 0
        self.cache_misses = 0  # plans really computed (not from a cache)
        self.disk_hits = 0
        self.disk = store  # plans kept between runs (ddops/patching/plan_store.py), passed in: no I/O here
        self._cache: OrderedDict[tuple[str | None, str], FilePlan] = OrderedDict()
        self._in_flight: dict[tuple[str | None, str], threading.Event] = {}
        self._lock = threading.Lock()
        self._memo: OrderedDict[Any, Any] = OrderedDict()
        self._memo_in_flight: dict[Any, threading.Event] = {}

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """Other pure work on planned contents (the checks over the new bytes), once per run like the plans.

        `key` must identify the inputs (content hashes, not hosts). A thread that finds the key being computed waits
        for that value (32 hosts reach their checks together: each compiling the same file cost 5 compiles a run)."""
        return self._once(self._memo, self._memo_in_flight, key, compute, 4 * self.max_entries)[0]

    def plan_file(self, path: str, source: bytes | None, patches: Sequence[Patch],
                  blocked: Mapping[str, str] | None = None, ours: str | None = None) -> FilePlan:
        key = (sha256(source) if source is not None else None,
               _key_for(path, tuple(patches), tuple(sorted((blocked or {}).items())), ours))

        def from_disk_or_planned() -> FilePlan:
            plan = self.disk.load(key, path, source) if self.disk is not None and source is not None else None
            with self._lock:
                if plan is None:
                    self.cache_misses += 1
                else:
                    self.disk_hits += 1
            if plan is None:
                plan = plan_file(path, source, patches, blocked, ours)
                if self.disk is not None:
                    self.disk.save(key, plan)
            return plan

        plan, computed = self._once(self._cache, self._in_flight, key, from_disk_or_planned, self.max_entries)
        if not computed:
            with self._lock:
                self.cache_hits += 1
        return plan

    def _once(self, store: OrderedDict[Any, Any], in_flight: dict[Any, threading.Event], key: Any,
              compute: Callable[[], Any], limit: int) -> tuple[Any, bool]:
        """(store[key], whether this thread computed it): computed by one thread while any others asking for the same
        key wait for it (if it fails, the next of them tries); the store keeps the `limit` last used."""
        while True:
            with self._lock:
                if key in store:
                    store.move_to_end(key)
                    return store[key], False
                event = in_flight.get(key)
                if event is None:
                    event = in_flight[key] = threading.Event()
                    break
            event.wait()  # another thread is computing this very key; its value will be in the store
        try:
            value = compute()
            with self._lock:
                store[key] = value
                while len(store) > limit:
                    store.popitem(last=False)
        finally:
            with self._lock:
                del in_flight[key]
            event.set()
        return value, True

    def plan_host(self, patches: Sequence[Patch], files: Mapping[str, bytes | None],
                  ours: Mapping[str, str] | None = None) -> HostPlan:
        """Plan every file the patches touch, from a host's snapshot (path -> bytes, None when missing).

        A patch whose required patch failed in any file is BLOCKED in every file, so that no file depends on a
        change that was not made. `ours`: path -> what ddops last wrote there for an add_module still applied."""
        ours = ours or {}
        paths = dict.fromkeys(f for p in patches for f in p.files)
        blocked: dict[str, str] = {}
        while True:
            plans = tuple(self.plan_file(path, files.get(path), [p for p in patches if path in p.files], blocked,
                                         ours.get(path)) for path in paths)
            host = HostPlan(plans)
            newly = {}
            for p in patches:
                if p.id in blocked:
                    continue
                for r in p.requires:
                    state = host.patch_state(r)
                    if state in FAILED_STATES:
                        newly[p.id] = f"requires {r}, which is {state} on this host: not applied"
                        break
            if not newly:
                return host
            blocked.update(newly)


@dataclass(frozen=True, slots=True)
class DiffGroup:
    """One distinct diff and the hosts that share it."""

    diff: str
    hosts: tuple[str, ...]

    @property
    def title(self) -> str:
        n = len(self.hosts)
        if not self.diff:
            return f"{n} host{'s' if n != 1 else ''}: no changes"
        if n == 1:
            return f"{self.hosts[0]}: diff"
        return f"{n} hosts: identical diff"


def group_diffs(plans: Mapping[str, str | FilePlan | HostPlan | Iterable[FilePlan]]) -> list[DiffGroup]:
    """Group hosts by identical diff (all their files together): biggest group first, then by first host.

    A host's value is its plan(s), or the diff text itself (what a host's result carries back to the CLI)."""
    groups: dict[str, list[str]] = {}
    for host, plan in plans.items():
        if isinstance(plan, str):
            diff = plan
        elif isinstance(plan, (FilePlan, HostPlan)):
            diff = plan.diff
        else:
            diff = "".join(f.diff for f in sorted(plan, key=lambda f: f.path))
        groups.setdefault(diff, []).append(host)
    ordered = sorted(groups.items(), key=lambda kv: (not kv[0], -len(kv[1])))
    return [DiffGroup(diff, tuple(hosts)) for diff, hosts in ordered]


__all__ = ["APPLIED", "AMBIGUOUS", "BLOCKED", "DRIFTED", "ERROR", "PARTIAL", "PENDING", "DiffGroup", "FilePlan",
           "HostPlan", "PatchResult", "Planner", "group_diffs", "plan_file", "sha256", "unified_diff", "worst"]
