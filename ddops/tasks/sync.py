"""The research repo at a pinned commit on every host: pins resolved once, fetched or pushed, never over local work.

Per host, a sync that changes nothing costs one agent round trip (`sync_inspect`). Moving the commit:
inspect → [save foreign edits] → [fetch, roll ddops' patches back] → checkout (fetching or unbundling the commit)
→ [re-apply the patches]. The host never loses work: tracked files changed by anyone but ddops stop the sync
(or, with force, go into a git stash first); files ddops patched are rolled back and patched again."""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ddops
from ddops.errors import AgentError, DdopsError, UsageError, message_for
from ddops.fleet import CHANGED, FAILED, FAILING, OK, TaskOutcome
from ddops.inventory import SYNC_MODES
from ddops.jsonvalue import JsonValue, omitted_when_none
from ddops.patching.playbook import list_playbooks, load_playbooks, search_path
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

    `git bundle` needs a ref to record: a scratch bare repo borrowing the clone's objects (alternates) holds it."""
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

    def pin_for(self, host: Host) -> Pin:
        return self.pins.for_host(host)

    def mode_for(self, host: Host) -> str:
        return self.options.mode or host.sync

    def fetch_timeout(self, host: Host) -> float:
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

    def named(self, patch_ids: Sequence[str]) -> str:
        """Patch ids as a user names them: by the playbooks they make up (search_dirs' playbooks)."""
        return by_playbook(patch_ids, load_playbooks(list_playbooks(self.search_dirs), self.search_dirs))

    def sync_task(self, host: Host, session: AgentSession) -> TaskOutcome:
        return sync_host(host, session, self)

    def deploy_task(self, host: Host, session: AgentSession) -> TaskOutcome:
        return deploy_host(host, session, self)

    def close(self) -> None:
        self.bundles.close()

    def __enter__(self) -> SyncRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def by_playbook(patch_ids: Sequence[str], playbooks: Sequence[Any]) -> str:
    """`crop-relative, hybrid-cache`: each playbook all of whose patches are among patch_ids by its name, one only
    partly there as `crop-relative (crop-helper)`, an id no playbook defines as it is."""
    wanted, named = list(dict.fromkeys(patch_ids)), []
    for book in playbooks:
        mine = [p.id for p in book.patches if p.id in wanted]
        if mine:
            named.append(book.name if len(mine) == len(book.patches) else f"{book.name} ({', '.join(mine)})")
            wanted = [pid for pid in wanted if pid not in mine]
    return ", ".join(named + wanted)


def prepare_sync(inventory: Inventory, hosts: Sequence[Host], options: SyncOptions) -> SyncRun:
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
    run = SyncRun(options, pins, inventory.patches, search_path(inventory.playbook_dirs))
    if run.reapply:
        run.playbooks()  # a broken playbook is a usage error (exit 2) before any host is touched
    return run


# -- per host ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step(JsonValue):
    """A patch or verify run inside sync or deploy: its status, message and per-patch states (no diffs)."""

    status: str
    message: str
    patches: Mapping[str, str] | None

    @classmethod
    def from_outcome(cls, outcome: TaskOutcome) -> Step:
        return cls(outcome.status, outcome.message, getattr(outcome.report, "patches", None))


@dataclass(frozen=True, slots=True)
class SyncReport(JsonValue):
    """One host's sync: its pin as resolved, where its checkout was and went, what moved it, and what it kept safe."""

    pin: str | None
    commit: str | None
    pin_shown: str
    resolved_in: str | None
    mode: str
    check: bool
    before: str | None = None
    after: str | None = None
    dirty: tuple[str, ...] = ()  # tracked files changed by someone other than ddops
    source: str | None = None    # how the commit came: "remote" (the host fetched it) or "bundle" (pushed)
    bytes_moved: int = 0
    rolled_back: tuple[str, ...] = ()
    reapplied: tuple[str, ...] = ()
    saved: Mapping[str, Any] | None = None  # the git stash --force saved local edits in (sync_save's answer)
    created: bool | None = omitted_when_none()  # the checkout was cloned
    fallback: str | None = omitted_when_none()  # why fetching from the URL failed before a bundle was pushed
    uploaded_bytes: int | None = omitted_when_none()
    reapply: Step | None = omitted_when_none()


@dataclass(frozen=True, slots=True)
class DeployReport(JsonValue):
    """One host's deploy: its sync, then the patch and verify steps it got to."""

    sync: SyncReport
    patch: Step | None = None
    verify: Step | None = None


@dataclass(frozen=True, slots=True)
class Move:
    """What one host's sync will do, decided from its sync_inspect answer alone."""

    before: str | None
    commit: str
    dirty: DirtyReport
    source: str | None  # None: the host has the commit; "remote": it fetches it; "bundle": we push it
    clones: bool        # there is no checkout yet
    reapply: bool
    refusal: str = ""   # why the host is not moved at all
    refused_as: str | None = None  # the refusal's error kind

    @property
    def arrived(self) -> bool:
        return self.before == self.commit

    def described(self, host: Host, named: str = "") -> str:
        """What --check says the sync would do (`named`: the patches rolled back, as their playbooks)."""
        parts = [f"{'would clone' if self.clones else 'would move'} {short(self.before)} → {short(self.commit)}"]
        if self.source == "remote":
            parts.append(f"fetching from {host.repo_url}")
        elif self.source == "bundle":
            parts.append("pushing a bundle")
        if self.dirty.foreign:
            parts.append(f"saving local edits to {', '.join(self.dirty.foreign)} in a git stash")
        if self.dirty.patched:
            again = " and re-applying" if self.reapply else ""
            parts.append(f"rolling back {named or ', '.join(self.dirty.patch_ids)}{again}")
        return "; ".join(parts)


def plan_move(host: Host, commit: str, mode: str, info: Mapping[str, Any], *, force: bool, reapply: bool) -> Move:
    """The move sync_inspect's answer calls for: where from, how the commit comes, what it refuses and why."""
    before = info.get("head")
    move = Move(before, commit, classify_dirty(info.get("dirty") or []), _choose_source(mode, info, host),
                clones=not info.get("is_git"), reapply=reapply)
    if info.get("exists") and not info.get("is_git") and not info.get("empty"):
        return replace(move, refusal=f"{host.repo} is not a git checkout and is not empty: ddops will not clone over "
                                     "it (move it away, or point `repo:` elsewhere)", refused_as="not_git")
    if move.arrived:
        return move
    if move.dirty.foreign and not force:
        return replace(move, refusal=f"refusing to move {short(before)} → {short(commit)}: local changes ddops did "
                                     f"not make in {', '.join(move.dirty.foreign)}. Commit or stash them, or re-run "
                                     "with --force to save them in a git stash first", refused_as="dirty")
    if move.source == "remote" and not host.repo_url:
        return replace(move, refusal=f"the host lacks {short(commit)} and has no repo_url to fetch it from")
    return move


def _choose_source(mode: str, info: Mapping[str, Any], host: Host) -> str | None:
    """None when the host has the commit; else "remote" (it fetches itself) or "bundle" (we push it)."""
    if info.get("has_commit"):
        return None
    if mode == "remote":
        return "remote"
    if mode == "push" or not host.repo_url:
        return "bundle"
    probe = info.get("probe") or {}
    return "remote" if probe.get("reachable") else "bundle"


def sync_host(host: Host, session: AgentSession, run: SyncRun, *, reapply: bool | None = None,
              deploying: bool = False) -> TaskOutcome:
    """Put host's repo at its pinned commit without losing anything on it; see the module docstring. `deploying`:
    the first step of deploy, which applies the inventory's playbooks itself next (so nothing is re-applied here)."""
    reapply = False if deploying else reapply
    pin, mode, check = run.pin_for(host), run.mode_for(host), run.options.check
    report = SyncReport(pin.rev, pin.commit, pin.shown, pin.resolved_in if pin.commit else None, mode, check)
    if pin.error or not pin.commit:
        return TaskOutcome(FAILED, pin.error or "no commit to sync to", report, reason=SyncError.kind)
    probe = host.repo_url if mode == "auto" and host.repo_url else None
    info = session.call_agent("sync_inspect", {"repo": host.repo, "commit": pin.commit, "probe_url": probe,
                                               "probe_timeout": host.connect_timeout,
                                               "staging": mode != "remote" and not check})
    move = plan_move(host, pin.commit, mode, info, force=run.options.force,
                     reapply=run.reapply if reapply is None else reapply)
    report = replace(report, before=move.before, dirty=move.dirty.foreign)
    if move.refusal:
        return TaskOutcome(FAILED, move.refusal, report, reason=move.refused_as)
    if move.arrived:
        local = f" (local changes in {', '.join(move.dirty.foreign)})" if move.dirty.foreign else ""
        return TaskOutcome(OK, f"at {short(pin.commit)}{local}", replace(report, after=pin.commit))
    if check:
        return TaskOutcome(CHANGED, move.described(host, run.named(move.dirty.patch_ids)), report)
    return _carry_out(host, session, run, move, info, report, deploying)


def _carry_out(host: Host, session: AgentSession, run: SyncRun, move: Move, info: Mapping[str, Any],
               report: SyncReport, deploying: bool = False) -> TaskOutcome:
    """Save the local edits (--force), bring the commit in and roll ddops' patches back, check it out, re-apply."""
    if move.dirty.foreign:
        report = replace(report, saved=session.call_agent("sync_save", {
            "repo": host.repo, "paths": list(move.dirty.foreign),
            "message": f"ddops sync --force {_now()} by {run.actor}: local edits saved before moving to "
                       f"{short(move.commit)}"}))
    saved = (f"; local edits to {', '.join(report.saved['paths'])} saved in git stash {report.saved['stash'][:12]} "
             f"(on the host: git -C {host.repo} stash list)") if report.saved else ""
    source, patch_ids = move.source, move.dirty.patch_ids
    if patch_ids:
        # The commit comes in first: a failed fetch must leave the patches in place.
        if source is not None:
            report = _bring_in(host, session, run, "sync_fetch", move.commit, source, info, report)[0]
            source = None
        rolled = rollback_host(host, session, patch_ids, force=run.options.force, actor=run.actor)
        if rolled.status in FAILING:
            return TaskOutcome(FAILED, f"could not roll back {run.named(patch_ids)} before moving (the checkout "
                                       f"stays at {short(move.before)}): {rolled.message}{saved}", report,
                               reason=rolled.reason)
        report = replace(report, rolled_back=patch_ids)
    try:
        report, result = _bring_in(host, session, run, "sync_checkout", move.commit, source, info, report)
    except DdopsError as exc:
        return _checkout_failed(host, session, run, move, report, exc, saved)
    after = result["after"]
    report = replace(report, after=after, created=bool(result.get("created")))
    moved = (f"cloned at {short(after)}" if result.get("created") or move.before is None
             else f"moved {short(move.before)} → {short(after)}")
    if report.source:
        moved += f" ({'pushed' if report.source == 'bundle' else 'fetched'} {human_size(report.bytes_moved)})"
    moved += saved
    if not patch_ids:
        return TaskOutcome(CHANGED, moved, report)
    if not move.reapply:
        later = "" if deploying else " (not re-applied)"  # deploy applies the inventory's playbooks next
        return TaskOutcome(CHANGED, f"{moved}; rolled back {run.named(patch_ids)}{later}", report)
    return _reapply(host, session, run, patch_ids, moved, report)


def _checkout_failed(host: Host, session: AgentSession, run: SyncRun, move: Move, report: SyncReport,
                     exc: DdopsError, saved: str) -> TaskOutcome:
    """The checkout failed: the patches rolled back for it go back on (when sync re-applies), and it says so."""
    message = f"moving to {short(move.commit)} failed: {message_for(host.name, exc)}"
    if move.dirty.patch_ids and move.reapply:
        again = patch_host(host, session, run.playbooks(), planner=run.planner(), actor=run.actor)
        message += (f"; patches re-applied at {short(move.before)}" if again.status not in FAILING
                    else f"; re-applying patches at {short(move.before)} failed too: {again.message}")
    elif move.dirty.patch_ids:
        message += f"; {run.named(move.dirty.patch_ids)} stay rolled back"
    return TaskOutcome(FAILED, message + saved, report, reason=exc.kind)


def _reapply(host: Host, session: AgentSession, run: SyncRun, patch_ids: Sequence[str], moved: str,
             report: SyncReport) -> TaskOutcome:
    """Apply the inventory's patches again at the new commit."""
    playbooks = run.playbooks()
    again = patch_host(host, session, playbooks, planner=run.planner(), actor=run.actor)
    report = replace(report, reapply=Step.from_outcome(again))
    if again.status in FAILING:
        return TaskOutcome(FAILED, f"{moved}, but re-applying {', '.join(run.patches)} failed ({again.status}): "
                                   f"{again.message} — the host is at {short(report.commit)} WITHOUT those patches",
                           report, reason=again.reason)
    applied = tuple(p.id for book in playbooks for p in book.patches)
    left_out = [p for p in patch_ids if p not in applied]
    note = f"; {run.named(left_out)} not re-applied: not in the inventory's `patches:`" if left_out else ""
    return TaskOutcome(CHANGED, f"{moved}; rolled back and re-applied {', '.join(b.name for b in playbooks)}{note}",
                       replace(report, reapplied=applied))


def _bring_in(host: Host, session: AgentSession, run: SyncRun, verb: str, commit: str, source: str | None,
              info: Mapping[str, Any], report: SyncReport) -> tuple[SyncReport, dict[str, Any]]:
    """sync_fetch or sync_checkout, the bundle pushed first where it comes as one; in auto mode a failed fetch from
    the URL falls back to pushing a bundle. The report counts what moved."""
    try:
        result, uploaded = _call_bringing(host, session, run, verb, commit, source, info.get("staging_dir"))
    except AgentError as exc:
        if not (source == "remote" and run.mode_for(host) == "auto" and exc.kind in ("fetch_failed", "timeout")):
            raise
        report, source = replace(report, fallback=str(exc)), "bundle"
        result, uploaded = _call_bringing(host, session, run, verb, commit, source, info.get("staging_dir"))
    if result.get("fetched") or result.get("source"):
        report = replace(report, source=result.get("source") or source)
    moved = uploaded if report.source == "bundle" else result.get("fetched_bytes", 0)
    return replace(report, bytes_moved=report.bytes_moved + moved,
                   uploaded_bytes=(report.uploaded_bytes or 0) + uploaded), result


def _call_bringing(host: Host, session: AgentSession, run: SyncRun, verb: str, commit: str, source: str | None,
                   staging: str | None) -> tuple[dict[str, Any], int]:
    """(the verb's answer, bytes uploaded): in push mode the run's bundle goes to the host first."""
    payload: dict[str, Any] = {"repo": host.repo, "commit": commit, "repo_url": host.repo_url, "actor": run.actor,
               "ddops_version": ddops.__version__, "fetch_timeout": run.fetch_timeout(host),
               "source": source or "remote"}
    uploaded = 0
    if source == "bundle":
        if not staging:
            raise DdopsError("the host gave no staging directory for the bundle")
        bundle = run.bundles.get(host.repo_url, commit)
        remote_path = f"{staging}/{commit}-{secrets.token_hex(8)}.bundle"
        session.put_file(bundle.path, remote_path)  # streamed from disk, never read into memory whole
        uploaded = bundle.size
        payload["bundle"] = {"path": remote_path, "sha256": bundle.sha256}
    return session.call_agent(verb, payload, timeout=run.fetch_timeout(host) + 60), uploaded


def deploy_host(host: Host, session: AgentSession, run: SyncRun) -> TaskOutcome:
    """Sync to the pin, apply the inventory's patches, verify them: a new GPU host ready in one call."""
    synced = sync_host(host, session, run, deploying=True)
    assert isinstance(synced.report, SyncReport)  # what sync_host always reports
    report = DeployReport(synced.report)
    if synced.status in FAILING:
        return TaskOutcome(FAILED, synced.message, report, reason=synced.reason)
    if not run.patches:
        return TaskOutcome(synced.status, f"{synced.message}; no `patches:` in the inventory, nothing to patch", report)
    if run.options.check and synced.status == CHANGED:
        return TaskOutcome(CHANGED, f"{synced.message}; then would apply {', '.join(run.patches)}", report)
    playbooks = run.playbooks()
    patched = patch_host(host, session, playbooks, planner=run.planner(), check=run.options.check, actor=run.actor)
    report = replace(report, patch=Step.from_outcome(patched))
    if patched.status in FAILING:
        return TaskOutcome(FAILED, f"{synced.message}; patching failed ({patched.status}): {patched.message}", report,
                           reason=patched.reason)
    status = CHANGED if CHANGED in (synced.status, patched.status) else OK
    if run.options.check:
        return TaskOutcome(status, f"{synced.message}; {patched.message or patched.status}", report)
    verified = verify_host(host, session, playbooks, planner=run.planner())
    report = replace(report, verify=Step.from_outcome(verified))
    if verified.status != OK:
        return TaskOutcome(FAILED, f"{synced.message}; patched, but verify says {verified.status}: "
                                   f"{verified.message}", report, reason=verified.reason)
    return TaskOutcome(status, f"{synced.message}; {', '.join(b.name for b in playbooks)} applied and verified", report)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
