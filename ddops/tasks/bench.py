"""The bench tasks: preflight and launch a plan on each host, follow, stop, list and collect its runs.

Per host, through the agent's bench_* verbs (remote/ddops_agent/bench.py); what a run is and what the preflight
decides live in ddops/bench/ (pure). Returns TaskOutcomes and events; never prints."""

from __future__ import annotations

import base64
import codecs
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddops.bench.collect import DEFAULT_MAX_FILE_BYTES, host_manifest, oversized, safe_relpath, sha256_file
from ddops.bench.plan import BenchPlan, expand_runs
from ddops.bench.preflight import (EnvironmentCheck, environment_check, facts_request, host_values,
                                   patch_states_from_journal, preflight_problems, provenance_of, run_spec)
from ddops.bench.runs import (NO_RUN_KINDS, CollectReport, HostRun, LaunchReport, LogReport, PreflightReport, RunEntry,
                              RunList, RunReport, RunStatus, StopReport)
from ddops.errors import AgentError, DdopsError, TransportError
from ddops.fleet import CHANGED, FAILED, OK, SKIPPED, HostResult, TaskOutcome, close_quietly
from ddops.inventory import Host, Inventory
from ddops.patching.journal import JournalState
from ddops.patching.kinds import PatchState
from ddops.patching.playbook import playbooks_defining
from ddops.patching.reports import StatusReport
from ddops.patching.snapshot import make_planner
from ddops.pins import Pin, Pins
from ddops.tasks.base import AgentSession, default_actor
from ddops.tasks.patch import status_host
from ddops.tasks.slurm import bench_call, is_slurm, submit

# --- launching -----------------------------------------------------------------------------------------------------


def required_patch_states(host: Host, session: AgentSession, patch_ids: Sequence[str], facts: Mapping[str, Any], *,
                          planner: Any = None, books: Sequence[Any] = ()) -> dict[str, str]:
    """patch id -> state on this host (applied, pending, drifted, modified ...): re-planned from the files by
    `status_host` for patches one of `books` (playbooks_defining's) defines, from the journal alone for the
    others."""
    if not patch_ids:
        return {}
    states: dict[str, str] = {}
    if books:
        outcome = status_host(host, session, books, planner=planner)
        assert isinstance(outcome.report, StatusReport)  # what status_host always reports
        states = {pid: s for pid, s in outcome.report.patches.items() if pid in patch_ids}
    journal = patch_states_from_journal([p for p in patch_ids if p not in states], facts)
    return {pid: states.get(pid) or (PatchState.APPLIED if journal[pid] == JournalState.APPLIED
                                     else "unknown (no playbook defines it)")
            for pid in patch_ids}


@dataclass(frozen=True, slots=True)
class Preflight:
    """What the preflight learnt of one host: its facts, patch states and pin, and the refusal when refused."""

    facts: dict[str, Any]
    states: dict[str, str]
    pin: Pin | None
    refused: TaskOutcome | None
    environment: EnvironmentCheck = EnvironmentCheck()

    @property
    def provenance(self) -> dict[str, Any]:
        return provenance_of(self.facts, self.states, self.pin)

    @property
    def said(self) -> str:
        """What a ready host's line adds: what the environment check saw, and its warnings."""
        return "".join(f"; {s}" for s in self.environment.seen) + \
            "".join(f"; warning: {w}" for w in self.environment.warnings)


def _preflight(plan: BenchPlan, pins: Pins | None = None, inventory: Inventory | None = None, *,
               allow_busy_gpus: bool = False) -> Callable[[Host, AgentSession], Preflight]:
    """The preflight of one host; every distinct pin resolved once for the whole launch, on the controller, and
    the required patches' playbooks found once, where `ddops patch` finds them for this inventory. The host's
    packages and GPUs are checked against the plan too (ddops/bench/preflight.py: environment_check)."""
    # One planner for all hosts of a launch: hosts with the same file contents share one transform.
    planner = make_planner() if plan.requires_patches else None
    pins = pins or Pins()
    books = playbooks_defining(plan.requires_patches, inventory)

    def check(host: Host, session: AgentSession) -> Preflight:
        pin = pins.for_host(host) if host.commit else None
        # The host is asked whether it has the commit the controller resolved, never what its own branch says.
        commit = pin.commit if pin is not None else None
        facts = session.call_agent("bench_facts", {"repo": host.repo, "commit": commit, **facts_request(plan, host)})
        states = required_patch_states(host, session, plan.requires_patches, facts, planner=planner, books=books)
        environment = environment_check(plan, host, facts, [b.name for b in books], allow_busy_gpus=allow_busy_gpus)
        problems = [*preflight_problems(plan, host, facts, states, pin), *environment.refusals]
        if not problems:
            return Preflight(facts, states, pin, None, environment)
        report = PreflightReport(states, pin.described if pin else None, problems=tuple(problems),
                                 environment=environment.seen or None, warnings=environment.warnings or None)
        return Preflight(facts, states, pin, TaskOutcome(FAILED, "refused: " + "; ".join(problems), report),
                         environment)

    return check


def launch_task(plan: BenchPlan, run_id: str, pins: Pins | None = None, inventory: Inventory | None = None, *,
                allow_busy_gpus: bool = False) -> Callable[[Host, AgentSession], TaskOutcome]:
    """Task: check this host's preconditions, then start the run detached; FAILED with the reasons when refused."""

    preflight = _preflight(plan, pins, inventory, allow_busy_gpus=allow_busy_gpus)

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        checked = preflight(host, session)
        if checked.refused is not None:
            return checked.refused
        facts, states = checked.facts, checked.states
        if is_slurm(host):  # the host is a Slurm login node: one job array (ddops/tasks/slurm.py)
            return submit(plan, run_id, host, session, facts, states, host_values(host, facts),
                          lambda runs: run_spec(plan, host, runs, checked.provenance, actor=default_actor()))
        result_dir = f"{facts['repo_real']}/.ddops/runs/{run_id}/results"
        runs = expand_runs(plan, host_values(host, facts), result_dir=result_dir)
        spec = run_spec(plan, host, runs, checked.provenance, actor=default_actor())
        result = session.call_agent("bench_launch", {"repo": host.repo, "run_id": run_id, "spec": spec})
        return TaskOutcome(CHANGED, f"launched {len(runs)} run{'s' if len(runs) != 1 else ''} (runner pid "
                                    f"{result.get('pid')}){checked.said}",
                           LaunchReport(run_id, len(runs), result.get("run_dir"), states, pid=result.get("pid"),
                                        warnings=checked.environment.warnings or None))

    return task


def check_task(plan: BenchPlan, pins: Pins | None = None, inventory: Inventory | None = None, *,
               allow_busy_gpus: bool = False) -> Callable[[Host, AgentSession], TaskOutcome]:
    """Task: only the preconditions (what `ddops bench --check` reports)."""

    preflight = _preflight(plan, pins, inventory, allow_busy_gpus=allow_busy_gpus)

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        checked = preflight(host, session)
        if checked.refused is not None:
            return checked.refused
        runs = expand_runs(plan, host_values(host, checked.facts), result_dir="<result_dir>")
        pin = f" at {checked.pin.described}" if checked.pin is not None else ""
        environment = checked.environment
        return TaskOutcome(OK, f"ready: {len(runs)} run{'s' if len(runs) != 1 else ''}{pin}{checked.said}",
                           PreflightReport(checked.states, checked.pin.described if checked.pin else None,
                                           commands=tuple(r.command for r in runs),
                                           environment=environment.seen or None, warnings=environment.warnings or None))

    return task


# --- runs ------------------------------------------------------------------------------------------------------------

def _call_or_skip_if_no_run(host: Host, session: AgentSession, run_id: str, verb: str, payload: dict[str, Any],
                            **kwargs: Any) -> dict[str, Any] | TaskOutcome:
    """bench_call for a verb about one run; a SKIPPED outcome instead when the host has no such run."""
    try:
        return bench_call(host, session, verb, payload, **kwargs)
    except AgentError as exc:
        if exc.kind in NO_RUN_KINDS:
            return TaskOutcome(SKIPPED, f"no run {run_id} here")
        raise


def status_task(run_id: str) -> Callable[[Host, AgentSession], TaskOutcome]:
    """Task: the run's state on a host (skipped when the host has no such run)."""

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        result = _call_or_skip_if_no_run(host, session, run_id, "bench_status", {"repo": host.repo, "run_id": run_id})
        if isinstance(result, TaskOutcome):
            return result
        run = HostRun.from_state(host.name, result["state"], result.get("failures"))
        return TaskOutcome(OK if run.ok else FAILED, run.summary(), RunReport(run))

    return task


def stop_task(run_id: str, actor: str, grace: float = 5.0,
              tasks: Sequence[int] = ()) -> Callable[[Host, AgentSession], TaskOutcome]:
    """Task: end every process of the run on a host and record it as stopped (Slurm: scancel, or only `tasks`)."""

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        payload = {"repo": host.repo, "run_id": run_id, "grace": grace, "actor": actor,
                   **({"tasks": list(tasks)} if tasks else {})}
        result = _call_or_skip_if_no_run(host, session, run_id, "bench_stop", payload, timeout=grace + 60)
        if isinstance(result, TaskOutcome):
            return result
        report = StopReport.of(result)
        if report.already_ended:
            return TaskOutcome(OK, f"already {report.status}; nothing to stop", report)
        if report.cancelled:
            return TaskOutcome(CHANGED, f"scancel {' '.join(report.cancelled)}", report)
        if report.remaining:
            return TaskOutcome(FAILED, f"processes still alive after SIGKILL: {report.remaining}", report)
        return TaskOutcome(CHANGED, f"stopped ({len(report.killed or ())} processes ended)", report)

    return task


def list_task(host: Host, session: AgentSession) -> TaskOutcome:
    """Task: every run found in the host's repo."""
    try:
        result = session.call_agent("bench_list", {"repo": host.repo})
    except AgentError as exc:
        if exc.kind == "no_repo":
            return TaskOutcome(SKIPPED, "no repo here")
        raise
    runs = tuple(RunEntry.of(r) for r in result.get("runs") or ())
    return TaskOutcome(OK, f"{len(runs)} run{'s' if len(runs) != 1 else ''}", RunList(runs))


def read_logs(host: Host, session: AgentSession, run_id: str,
              max_bytes: int = 4 * 1024 * 1024) -> tuple[str, HostRun | None]:
    """The whole log of a run on one host (read in chunks) and its state."""
    offset, chunks, run = 0, [], None
    while True:
        result = bench_call(host, session, "bench_poll", {"repo": host.repo, "run_id": run_id, "offset": offset,
                                                          "max_bytes": max_bytes})
        data = base64.b64decode(result.get("log_b64") or "")
        chunks.append(data)
        offset = int(result.get("offset", offset))
        if result.get("state"):
            run = HostRun.from_state(host.name, result["state"], result.get("failures"))
        if not data or offset >= int(result.get("log_size", 0)):
            return b"".join(chunks).decode("utf-8", "replace"), run


def logs_task(run_id: str) -> Callable[[Host, AgentSession], TaskOutcome]:
    """Task: the run's whole log on a host (data["log"]), failed when the run did (skipped: no such run)."""

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        try:
            text, run = read_logs(host, session, run_id)
        except AgentError as exc:
            if exc.kind in NO_RUN_KINDS:
                return TaskOutcome(SKIPPED, f"no run {run_id} here")
            raise
        return TaskOutcome(OK if run is None or run.ok else FAILED, run.summary() if run else "", LogReport(text))

    return task


# --- following -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogText:
    """New log output of one host (decoded; may end mid-line)."""

    host: str
    text: str


@dataclass(frozen=True, slots=True)
class HostUpdate:
    """A host's run changed state; `final` once the run is over and its log fully read (or we gave up)."""

    host: str
    run: HostRun | None = None
    error: str | None = None
    final: bool = False


FollowEvent = LogText | HostUpdate


@dataclass
class _HostCursor:
    host: Host
    offset: int = 0
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    last_key: tuple | None = None


class Follower:
    """Polls every host's run (state + log from a byte offset) in background threads; iterate `events()`.

    Events come out on the calling thread, so a Ctrl-C there stops following and leaves the runs alone.
    Connections that drop are reopened; a host unreachable for `give_up_after` seconds is reported final."""

    def __init__(self, hosts: Sequence[Host], run_id: str, connect: Callable[[Host], Any], *,
                 interval: float = 1.0, from_offsets: Mapping[str, int] | None = None, logs: bool = True,
                 give_up_after: float = 600.0, max_bytes: int = 256 * 1024) -> None:
        self.run_id = run_id
        self.interval = interval
        self.logs = logs
        self.give_up_after = give_up_after
        self.max_bytes = max_bytes
        self._connect = connect
        self._cursors = [_HostCursor(h, (from_offsets or {}).get(h.name, 0)) for h in hosts]
        self._queue: queue.Queue[FollowEvent] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.final: dict[str, HostUpdate] = {}

    def events(self) -> Iterator[FollowEvent]:
        """Every event until each host is final (or close() was called)."""
        for cursor in self._cursors:
            thread = threading.Thread(target=self._follow, args=(cursor,), daemon=True,
                                      name=f"ddops-follow-{cursor.host.name}")
            thread.start()
            self._threads.append(thread)
        pending = {c.host.name for c in self._cursors}
        while pending and not self._stop.is_set():
            try:
                event = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(event, HostUpdate) and event.final:
                pending.discard(event.host)
                self.final[event.host] = event
            yield event

    def close(self) -> None:
        self._stop.set()

    def _follow(self, cursor: _HostCursor) -> None:
        name = cursor.host.name
        session = None
        failing_since: float | None = None
        try:
            while not self._stop.is_set():
                try:
                    if session is None:
                        session = self._connect(cursor.host)
                    done = self._poll_once(cursor, session)
                    failing_since = None
                    if done:
                        return
                except AgentError as exc:
                    if exc.kind in NO_RUN_KINDS:
                        self._queue.put(HostUpdate(name, error=f"no run {self.run_id} here", final=True))
                        return
                    raise
                except TransportError as exc:
                    close_quietly(session)
                    session = None
                    now = time.monotonic()
                    failing_since = failing_since or now
                    if now - failing_since > self.give_up_after:
                        self._queue.put(HostUpdate(name, error=f"gave up: {exc}", final=True))
                        return
                    self._queue.put(HostUpdate(name, error=str(exc)))
                self._stop.wait(self.interval)
        except DdopsError as exc:
            self._queue.put(HostUpdate(name, error=str(exc), final=True))
        except Exception as exc:  # noqa: BLE001 - a surprise on one host must not hang the others' follow
            self._queue.put(HostUpdate(name, error=f"{type(exc).__name__}: {exc}", final=True))
        finally:
            close_quietly(session)

    def _poll_once(self, cursor: _HostCursor, session: AgentSession) -> bool:
        """One bench_poll (repeated while more log is waiting); True once the run is over and fully read."""
        while True:
            payload = {"repo": cursor.host.repo, "run_id": self.run_id, "offset": cursor.offset,
                       "max_bytes": self.max_bytes if self.logs else 0}
            result = bench_call(cursor.host, session, "bench_poll", payload)
            data = base64.b64decode(result.get("log_b64") or "")
            cursor.offset = int(result.get("offset", cursor.offset))
            state = result.get("state")
            if data and self.logs:
                text = cursor.decoder.decode(data)
                if text:
                    self._queue.put(LogText(cursor.host.name, text))
            if state is None:
                self._queue.put(HostUpdate(cursor.host.name, error="the run has no readable state.json", final=True))
                return True
            run = HostRun.from_state(cursor.host.name, state, result.get("failures"))
            key = (run.status, run.done, run.current)
            more = self.logs and cursor.offset < int(result.get("log_size", 0))
            if run.terminal and not more:
                tail = cursor.decoder.decode(b"", final=True)
                if tail:
                    self._queue.put(LogText(cursor.host.name, tail))
                self._queue.put(HostUpdate(cursor.host.name, run=run, final=True))
                return True
            if key != cursor.last_key:
                cursor.last_key = key
                self._queue.put(HostUpdate(cursor.host.name, run=run))
            if not more:
                return False


# --- collecting ------------------------------------------------------------------------------------------------------


def fetch_file(session: AgentSession, remote: Mapping[str, Any], local: Path) -> bool:
    """Download one file unless `local` already holds it; True when fetched. The hash is checked before the file
    takes its name, so a file swapped on the host (for a symlink, say) after it was listed is never kept."""
    if local.is_file() and not local.is_symlink() and sha256_file(local) == remote["sha256"]:
        return False
    local.parent.mkdir(parents=True, exist_ok=True)
    part = local.with_name(local.name + ".ddops-part")
    try:
        # Never more than the host listed: a file that grows after the listing stops the download there.
        session.get_file(remote["real_path"], part, max_bytes=int(remote["size"]))
        got = sha256_file(part)
        if got != remote["sha256"]:
            raise DdopsError(f"{remote['path']}: sha256 {got[:12]} after download, the host listed "
                             f"{remote['sha256'][:12]} (changed while copying?); run collect again")
        os.replace(part, local)
    finally:
        if part.exists():
            part.unlink()
    return True


def collect_task(run_id: str, root: Path, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
                 ) -> Callable[[Host, AgentSession], TaskOutcome]:
    """Task: copy the run's result files from one host (none bigger than max_file_bytes); data carries its
    manifest entry."""

    def task(host: Host, session: AgentSession) -> TaskOutcome:
        if not host.name.strip("."):  # the inventory refuses such names; results/<run>/.. would be results/ itself
            return TaskOutcome(FAILED, f"refusing to collect into {root / run_id / host.name}")
        listing = _call_or_skip_if_no_run(host, session, run_id, "bench_files", {"repo": host.repo, "run_id": run_id})
        if isinstance(listing, TaskOutcome):
            return listing
        dest = root / run_id / host.name
        fetched = kept = 0
        files = []
        wanted, too_big = oversized(listing.get("files") or [], max_file_bytes)
        if too_big:
            listing = {**listing, "refused": [*(listing.get("refused") or []), *too_big]}
        unsafe = []
        for remote in wanted:
            try:
                local = dest.joinpath(*safe_relpath(str(remote.get("path"))).parts)
            except DdopsError as exc:  # that file alone: the others are still the host's results
                unsafe.append({"path": str(remote.get("path")), "reason": str(exc)})
                continue
            if fetch_file(session, remote, local):
                fetched += 1
            else:
                kept += 1
            files.append(remote)
        if unsafe:
            listing = {**listing, "refused": [*(listing.get("refused") or []), *unsafe]}
        manifest = host_manifest(host, listing, files)
        run = HostRun.from_state(host.name, listing.get("state") or {}, listing.get("failures"))
        parts = [f"{fetched} file{'s' if fetched != 1 else ''} fetched"]
        if kept:
            parts.append(f"{kept} already here")
        if listing.get("refused"):
            parts.append("refused: " + ", ".join(f"{r['path']} ({r['reason']})" for r in listing["refused"]))
        if listing.get("skipped"):
            parts.append("not followed: " + ", ".join(f"{r['path']} ({r['reason']})" for r in listing["skipped"]))
        if not run.terminal:
            parts.append(f"run still {run.status} ({run.done}/{run.total}): collect again when it ends")
        elif run.status != RunStatus.COMPLETED:
            parts.append(f"run {run.summary()}")
        status = CHANGED if fetched else OK
        if listing.get("refused") or run.status in (RunStatus.FAILED, RunStatus.ERROR, RunStatus.LOST,
                                                    RunStatus.STOPPED):
            status = FAILED
        return TaskOutcome(status, "; ".join(parts), CollectReport(manifest, fetched, kept, run))

    return task


def manifest_entries(results: Sequence[HostResult]) -> dict[str, dict[str, Any]]:
    """host -> its manifest entry, from collect_task's results (hosts that had nothing to give are left out)."""
    return {r.host: dict(r.report.manifest) for r in results
            if isinstance(r.report, CollectReport) and r.report.manifest}
