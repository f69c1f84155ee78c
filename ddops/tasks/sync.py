"""The research repo at a pinned commit on every host: pins resolved once, fetched or pushed, never over local work.

Per host, a sync that changes nothing costs one agent round trip (`sync_inspect`). Moving the commit:
inspect → [save foreign edits] → [fetch, roll ddops' patches back] → checkout (fetching or unbundling the commit)
→ [re-apply the patches]. The host never loses work: tracked files changed by anyone but ddops stop the sync
(or, with force, go into a git stash first); files ddops patched are rolled back and patched again.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import ddops
from ddops.errors import AgentError, DdopsError, UsageError, message_for
from ddops.inventory import SYNC_MODES
from ddops.fleet import CHANGED, FAILED, FAILING, OK, TaskOutcome
from ddops.patching.playbook import load_playbooks, search_path
from ddops.patching.snapshot import make_planner
from ddops.pins import Pin, Pins, SyncError, check_url, checked_clone, local_git, short
from ddops.tasks.base import AgentSession, default_actor
from ddops.tasks.patch import patch_host, rollback_host, verify_host

if TYPE_CHECKING:
    from ddops.inventory import Host, Inventory

BUNDLE_REF = "refs/ddops/sync"


# -- values ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncOptions:
    """What the user asked of one sync or deploy run."""

    rev: str | None = None          # --commit: overrides every selected host's pin
    check: bool = False
    force: bool = False
    reapply: bool | None = None     # None: re-apply when the inventory lists `patches:`
    mode: str | None = None         # --mode: overrides each host's `sync:`
    from_clone: str | None = None   # --from: a local clone to resolve pins and make bundles from
    actor: str = ""
    fetch_timeout: float | None = None  # default: the host's command_timeout


@dataclass(frozen=True, slots=True)
class DirtyReport:
    """A host's changed tracked files, split into ddops' intact patches and everybody else's edits."""

    patched: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # file -> patch ids applied there
    foreign: tuple[str, ...] = ()

    @property
    def patch_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for ids in self.patched.values() for p in ids))


@dataclass(frozen=True, slots=True)
class Bundle:
    path: Path
    sha256: str
    size: int


# -- pure helpers ---------------------------------------------------------------------------------------------


def classify_dirty(dirty: Iterable[Mapping[str, Any]]) -> DirtyReport:
    """Split the inspect verb's dirty files: intact ddops patches (the file is what ddops last wrote) vs the rest."""
    from ddops.patching.journal import active_applications, last_written

    patched: dict[str, tuple[str, ...]] = {}
    foreign: list[str] = []
    for item in dirty:
        path, sha, entries = item["path"], item.get("sha256"), item.get("journal") or []
        try:
            active = [a.patch for a in active_applications(entries) if a.file == path]
            written = last_written(entries, path)
        except DdopsError:  # a journal this version cannot read: nothing in it can vouch for the file
            active, written = [], None
        if active and sha is not None and sha == written and not item.get("orig"):
            patched[path] = tuple(dict.fromkeys(active))
        else:
            foreign.append(path)
    return DirtyReport(patched, tuple(foreign))


def make_bundle(source: str | os.PathLike[str], commit: str, out: Path, scratch: Path) -> Bundle:
    """A git bundle of `commit` and its history from the clone at `source`, written without touching the clone.

    `git bundle` needs a ref to record: a scratch bare repo borrowing the clone's objects (alternates) holds it.
    """
    try:
        local_git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=source)
    except SyncError:
        raise SyncError(f"the local clone {source} does not have commit {commit}: fetch it there first "
                        f"(git -C {source} fetch)") from None
    common = Path(local_git(["rev-parse", "--git-common-dir"], cwd=source))
    objects = (common if common.is_absolute() else Path(source) / common).resolve() / "objects"
    local_git(["init", "--bare", "--quiet", str(scratch)])
    (scratch / "objects" / "info").mkdir(parents=True, exist_ok=True)
    (scratch / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    local_git(["update-ref", BUNDLE_REF, commit], cwd=scratch)
    local_git(["bundle", "create", "--quiet", str(out), BUNDLE_REF], cwd=scratch, timeout=600)
    digest = hashlib.sha256()
    with open(out, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return Bundle(out, digest.hexdigest(), out.stat().st_size)


class Bundles:
    """One bundle per commit per run, made from --from's clone or, without it, a temporary mirror of the URL."""

    def __init__(self, from_clone: str | None) -> None:
        self.from_clone = from_clone
        self._lock = threading.Lock()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._made: dict[str, Bundle | SyncError] = {}
        self._mirrors: dict[str, Path | SyncError] = {}
        self.created = 0

    def get(self, url: str | None, commit: str) -> Bundle:
        # One lock for all: bundles are rare, and hosts waiting for the same one is what makes it one.
        with self._lock:
            made = self._made.get(commit)
            if made is None:
                try:
                    made = self._make(url, commit)
                    self.created += 1
                except SyncError as exc:
                    made = exc
                self._made[commit] = made
        if isinstance(made, SyncError):
            raise made
        return made

    def _dir(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ddops-sync-")
        return Path(self._tmp.name)

    def _make(self, url: str | None, commit: str) -> Bundle:
        source = self.from_clone or self._mirror(url)
        tmp = self._dir()
        return make_bundle(source, commit, tmp / f"{commit}.bundle", tmp / f"scratch-{commit}")

    def _mirror(self, url: str | None) -> Path:
        if not url:
            raise SyncError("push mode needs a local clone: pass --from LOCAL_CLONE (the host has no repo_url)")
        mirror = self._mirrors.get(url)
        if mirror is None:
            path = self._dir() / f"mirror-{len(self._mirrors)}.git"
            try:
                check_url(url)
                local_git(["clone", "--bare", "--quiet", "--", url, str(path)], timeout=1800)
                mirror = path
            except SyncError as exc:
                mirror = SyncError(f"push mode: cannot clone {url} on this machine ({exc}); pass --from LOCAL_CLONE")
            self._mirrors[url] = mirror
        if isinstance(mirror, SyncError):
            raise mirror
        return mirror

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


# -- one run ----------------------------------------------------------------------------------------------------


class SyncRun:
    """Everything a sync or deploy run shares across hosts: resolved pins, bundles, playbooks, the planner."""

    def __init__(self, options: SyncOptions, pins: Pins, patches: Sequence[str] = (),
                 search_dirs: Sequence[Any] | None = None) -> None:
        self.options = options
        self.pins = pins
        self.patches = tuple(patches)
        self.search_dirs = search_dirs  # where the patches' names are looked up (None: search_path())
        self.bundles = Bundles(options.from_clone)
        self._lock = threading.Lock()
        self._playbooks: Any = None
        self._planner: Any = None

    @property
    def actor(self) -> str:
        return self.options.actor or default_actor()

    @property
    def reapply(self) -> bool:
        return bool(self.patches) if self.options.reapply is None else self.options.reapply

    def pin_for(self, host: "Host") -> Pin:
        return self.pins.for_host(host)

    def mode_for(self, host: "Host") -> str:
        return self.options.mode or host.sync

    def fetch_timeout(self, host: "Host") -> float:
        return self.options.fetch_timeout or host.command_timeout

    def playbooks(self) -> Any:
        with self._lock:
            if self._playbooks is None:
                self._playbooks = load_playbooks(list(self.patches), self.search_dirs)
            return self._playbooks

    def planner(self) -> Any:
        with self._lock:
            if self._planner is None:
                self._planner = make_planner()
            return self._planner

    def sync_task(self, host: "Host", session: AgentSession) -> TaskOutcome:
        return sync_host(host, session, self)

    def deploy_task(self, host: "Host", session: AgentSession) -> TaskOutcome:
        return deploy_host(host, session, self)

    def close(self) -> None:
        self.bundles.close()

    def __enter__(self) -> "SyncRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepare_sync(inventory: "Inventory", hosts: Sequence["Host"], options: SyncOptions) -> SyncRun:
    """Check the options, resolve every pin once, and return the run to hand to the fleet."""
    if options.mode is not None and options.mode not in SYNC_MODES:
        raise UsageError(f"--mode {options.mode}: must be one of {', '.join(SYNC_MODES)}")
    if options.from_clone is not None:
        options = replace(options, from_clone=checked_clone(options.from_clone))
    if options.reapply and not inventory.patches:
        raise UsageError(f"--reapply needs `patches:` in {inventory.path} (the playbooks to apply again)")
    if not options.actor:
        options = replace(options, actor=default_actor())
    pins = Pins(rev=options.rev, from_clone=options.from_clone)
    pins.resolve_all(hosts)
    run = SyncRun(options, pins, inventory.patches, search_path(inventory))
    if run.reapply:
        run.playbooks()  # a broken playbook is a usage error (exit 2) before any host is touched
    return run


# -- per host ----------------------------------------------------------------------------------------------------


def _choose_source(mode: str, info: Mapping[str, Any], host: "Host") -> str | None:
    """None when the host has the commit; else "remote" (it fetches itself) or "bundle" (we push it)."""
    if info.get("has_commit"):
        return None
    if mode == "remote":
        return "remote"
    if mode == "push" or not host.repo_url:
        return "bundle"
    probe = info.get("probe") or {}
    return "remote" if probe.get("reachable") else "bundle"


def _agent_payload(host: "Host", run: SyncRun, commit: str, **extra: Any) -> dict[str, Any]:
    return {"repo": host.repo, "commit": commit, "repo_url": host.repo_url, "actor": run.actor,
            "ddops_version": ddops.__version__, "fetch_timeout": run.fetch_timeout(host), **extra}


def _bring_in(host: "Host", session: AgentSession, run: SyncRun, verb: str, commit: str, source: str | None,
              staging: str | None) -> dict[str, Any]:
    """Call sync_fetch / sync_checkout, uploading the run's bundle first in push mode; adds uploaded_bytes."""
    payload = _agent_payload(host, run, commit, source=source or "remote")
    uploaded = 0
    if source == "bundle":
        if not staging:
            raise DdopsError("the host gave no staging directory for the bundle")
        bundle = run.bundles.get(host.repo_url, commit)
        remote_path = f"{staging}/{commit}-{secrets.token_hex(8)}.bundle"
        session.put_file(bundle.path, remote_path)  # streamed from disk, never read into memory whole
        uploaded = bundle.size
        payload["bundle"] = {"path": remote_path, "sha256": bundle.sha256}
    result = session.call_agent(verb, payload, timeout=run.fetch_timeout(host) + 60)
    return {**result, "uploaded_bytes": uploaded}


def _fetch_with_fallback(host: "Host", session: AgentSession, run: SyncRun, verb: str, commit: str, source: str | None,
                         info: Mapping[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """_bring_in, and in auto mode a failed fetch from the URL falls back to pushing a bundle."""
    try:
        result = _bring_in(host, session, run, verb, commit, source, info.get("staging_dir"))
    except AgentError as exc:
        if not (source == "remote" and run.mode_for(host) == "auto" and exc.kind in ("fetch_failed", "timeout")):
            raise
        data["fallback"] = str(exc)
        source = "bundle"
        result = _bring_in(host, session, run, verb, commit, source, info.get("staging_dir"))
    if result.get("fetched") or result.get("source"):
        data["source"] = result.get("source") or source
    bundled = data.get("source") == "bundle"
    data["bytes_moved"] += result["uploaded_bytes"] if bundled else result.get("fetched_bytes", 0)
    data["uploaded_bytes"] = data.get("uploaded_bytes", 0) + result["uploaded_bytes"]
    return result


def _failed(message: str, data: dict[str, Any]) -> TaskOutcome:
    return TaskOutcome(FAILED, message, data)


def sync_host(host: "Host", session: AgentSession, run: SyncRun, *, reapply: bool | None = None) -> TaskOutcome:
    """Put host's repo at its pinned commit without losing anything on it; see the module docstring."""
    opts = run.options
    pin = run.pin_for(host)
    mode = run.mode_for(host)
    data: dict[str, Any] = {"pin": pin.rev, "commit": pin.commit, "pin_shown": pin.shown,
                            "resolved_in": pin.resolved_in if pin.commit else None, "mode": mode, "before": None, "after": None,
                            "source": None, "bytes_moved": 0, "rolled_back": [], "reapplied": [], "saved": None,
                            "dirty": [], "check": opts.check}
    if pin.error or not pin.commit:
        return _failed(pin.error or "no commit to sync to", data)
    commit = pin.commit
    probe = host.repo_url if mode == "auto" and host.repo_url else None
    info = session.call_agent("sync_inspect", {"repo": host.repo, "commit": commit, "probe_url": probe,
                                               "probe_timeout": host.connect_timeout,
                                               "staging": mode != "remote" and not opts.check})
    before = info.get("head")
    data["before"] = before
    if info.get("exists") and not info.get("is_git") and not info.get("empty"):
        return _failed(f"{host.repo} is not a git checkout and is not empty: ddops will not clone over "
                       "it (move it away, or point `repo:` elsewhere)", data)
    dirty = classify_dirty(info.get("dirty") or [])
    data["dirty"] = list(dirty.foreign)
    if before == commit:
        data["after"] = commit
        local = f" (local changes in {', '.join(dirty.foreign)})" if dirty.foreign else ""
        return TaskOutcome(OK, f"at {short(commit)}{local}", data)
    if dirty.foreign and not opts.force:
        return _failed(f"refusing to move {short(before)} → {short(commit)}: local changes ddops did "
                       f"not make in {', '.join(dirty.foreign)}. Commit or stash them, or re-run with --force "
                       "to save them in a git stash first", data)
    source = _choose_source(mode, info, host)
    if source == "remote" and not host.repo_url:
        return _failed(f"the host lacks {short(commit)} and has no repo_url to fetch it from", data)
    patch_ids = list(dirty.patch_ids)
    reapply = run.reapply if reapply is None else reapply
    if opts.check:
        return TaskOutcome(CHANGED, _check_message(before, commit, source, dirty, reapply, info, run, host), data)

    saved_note = ""
    if dirty.foreign:
        saved = session.call_agent("sync_save", {"repo": host.repo, "paths": list(dirty.foreign),
                                                 "message": f"ddops sync --force {_now()} by {run.actor}: local "
                                                            f"edits saved before moving to {short(commit)}"})
        data["saved"] = saved
        saved_note = (f"; local edits to {', '.join(saved['paths'])} saved in git stash {saved['stash'][:12]} "
                      f"(on the host: git -C {host.repo} stash list)")
    if patch_ids:
        # The commit comes in first: a failed fetch must leave the patches in place.
        if source is not None:
            _fetch_with_fallback(host, session, run, "sync_fetch", commit, source, info, data)
            source = None
        rolled = rollback_host(host, session, patch_ids, force=opts.force, actor=run.actor)
        if rolled.status in FAILING:
            return _failed(f"could not roll back {', '.join(patch_ids)} before moving (the checkout "
                           f"stays at {short(before)}): {rolled.message}{saved_note}", data)
        data["rolled_back"] = patch_ids
    try:
        result = _fetch_with_fallback(host, session, run, "sync_checkout", commit, source, info, data)
    except DdopsError as exc:
        message = f"moving to {short(commit)} failed: {message_for(host.name, exc)}"
        if patch_ids and reapply:
            again = patch_host(host, session, run.playbooks(), planner=run.planner(), actor=run.actor)
            message += (f"; patches re-applied at {short(before)}" if again.status not in FAILING
                        else f"; re-applying patches at {short(before)} failed too: {again.message}")
        elif patch_ids:
            message += f"; {', '.join(patch_ids)} stay rolled back"
        return _failed(message + saved_note, data)
    data["after"] = result["after"]
    data["created"] = bool(result.get("created"))
    moved = (f"cloned at {short(result['after'])}" if result.get("created") or before is None
             else f"moved {short(before)} → {short(result['after'])}")
    if data.get("source"):
        moved += f" ({'pushed' if data['source'] == 'bundle' else 'fetched'} {human_size(data['bytes_moved'])})"
    moved += saved_note
    if not patch_ids:
        return TaskOutcome(CHANGED, moved, data)
    if not reapply:
        return TaskOutcome(CHANGED, f"{moved}; rolled back {', '.join(patch_ids)} (not re-applied)", data)
    playbooks = run.playbooks()
    again = patch_host(host, session, playbooks, planner=run.planner(), actor=run.actor)
    data["reapply"] = _step(again)
    if again.status in FAILING:
        return _failed(f"{moved}, but re-applying {', '.join(run.patches)} failed ({again.status}): "
                       f"{again.message} — the host is at {short(commit)} WITHOUT those patches", data)
    applied = [p.id for book in playbooks for p in book.patches]
    data["reapplied"] = applied
    left_out = [p for p in patch_ids if p not in applied]
    note = f"; {', '.join(left_out)} not re-applied: not in the inventory's `patches:`" if left_out else ""
    return TaskOutcome(CHANGED, f"{moved}; rolled back and re-applied {', '.join(applied)}{note}", data)


def _step(outcome: TaskOutcome) -> dict[str, Any]:
    """A patch-layer outcome as kept in sync/deploy data: status, message and per-patch states (no diffs)."""
    return {"status": outcome.status, "message": outcome.message, "patches": outcome.data.get("patches")}


def _check_message(before: str | None, commit: str, source: str | None, dirty: DirtyReport, reapply: bool,
                   info: Mapping[str, Any], run: SyncRun, host: "Host") -> str:
    verb = "would clone" if not info.get("is_git") else "would move"
    parts = [f"{verb} {short(before)} → {short(commit)}"]
    if source == "remote":
        parts.append(f"fetching from {host.repo_url}")
    elif source == "bundle":
        parts.append("pushing a bundle")
    if dirty.foreign:
        parts.append(f"saving local edits to {', '.join(dirty.foreign)} in a git stash")
    if dirty.patched:
        parts.append(f"rolling back {', '.join(dirty.patch_ids)}" + (" and re-applying" if reapply else ""))
    return "; ".join(parts)


def deploy_host(host: "Host", session: AgentSession, run: SyncRun) -> TaskOutcome:
    """Sync to the pin, apply the inventory's patches, verify them: a new GPU host ready in one call."""
    synced = sync_host(host, session, run, reapply=False)
    data: dict[str, Any] = {"sync": synced.data, "patch": None, "verify": None}
    if synced.status in FAILING:
        return TaskOutcome(FAILED, synced.message, data)
    if not run.patches:
        return TaskOutcome(synced.status, f"{synced.message}; no `patches:` in the inventory, nothing to patch", data)
    if run.options.check and synced.status == CHANGED:
        return TaskOutcome(CHANGED, f"{synced.message}; then would apply {', '.join(run.patches)}", data)
    playbooks = run.playbooks()
    patched = patch_host(host, session, playbooks, planner=run.planner(), check=run.options.check,
                                actor=run.actor)
    data["patch"] = _step(patched)
    if patched.status in FAILING:
        return TaskOutcome(FAILED, f"{synced.message}; patching failed ({patched.status}): {patched.message}", data)
    status = CHANGED if CHANGED in (synced.status, patched.status) else OK
    if run.options.check:
        return TaskOutcome(status, f"{synced.message}; {patched.message or patched.status}", data)
    verified = verify_host(host, session, playbooks, planner=run.planner())
    data["verify"] = _step(verified)
    if verified.status != OK:
        return TaskOutcome(FAILED, f"{synced.message}; patched, but verify says {verified.status}: "
                                   f"{verified.message}", data)
    return TaskOutcome(status, f"{synced.message}; {', '.join(run.patches)} applied and verified", data)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
