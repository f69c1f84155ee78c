"""Bench runs on the hosts: run ids, their state as values, local launch records, and following them live.

A run lives on each host under `<repo>/.ddops/runs/<run-id>/` (see remote/ddops_agent/bench.py); everything here talks
to it through the agent's bench_* verbs. No rich, no typer: the CLI renders what these functions return.
"""

from __future__ import annotations

import base64
import codecs
import json
import os
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ddops.errors import AgentError, DdopsError, TransportError, UsageError
from ddops.fleet import FAILED, OK, SKIPPED, TaskOutcome
from ddops.inventory import Host

RUNNING_STATUSES = ("starting", "running")
TERMINAL_STATUSES = ("completed", "failed", "stopped", "error", "lost")
RESULTS_ENV = "DDOPS_RESULTS_DIR"
LAUNCH_RECORD = "launch.json"
MANIFEST = "manifest.json"


def new_run_id(now: datetime | None = None, token: str | None = None) -> str:
    """`20261130-0812-ab12`: UTC minute, then four random hex digits (sorts by launch time)."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%d-%H%M}-{token or secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    """The run id itself, or a UsageError when it could not name a run directory."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", run_id or ""):
        raise UsageError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (e.g. 20261130-0812-ab12)")
    return run_id


# --- state values --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One command of a run on one host."""

    index: int
    label: str
    status: str  # pending, running, ok, failed, timeout, stopped
    exit_code: int | None = None
    signal: int | None = None
    started: str | None = None
    ended: str | None = None
    seconds: float | None = None
    log_tail: str | None = None  # the end of this command's own log, for failed runs

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "timeout")


@dataclass(frozen=True, slots=True)
class HostRun:
    """One host's view of a run, from its state.json."""

    host: str
    run_id: str
    status: str  # starting, running, completed, failed, stopped, error, lost
    total: int = 0
    done: int = 0
    current: int | None = None
    plan: str | None = None
    created: str | None = None
    started: str | None = None
    ended: str | None = None
    message: str | None = None
    runs: tuple[RunRecord, ...] = ()

    @classmethod
    def from_state(cls, host: str, state: Mapping[str, Any], failures: Mapping[str, str] | None = None) -> "HostRun":
        failures = failures or {}
        runs = tuple(
            RunRecord(index=int(r.get("index", i)), label=str(r.get("label") or f"run {i}"),
                      status=str(r.get("status") or "pending"), exit_code=r.get("exit_code"), signal=r.get("signal"),
                      started=r.get("started"), ended=r.get("ended"), seconds=r.get("seconds"),
                      log_tail=failures.get(str(r.get("index", i))))
            for i, r in enumerate(state.get("runs") or []))
        return cls(host=host, run_id=str(state.get("run_id") or ""), status=str(state.get("status") or "unknown"),
                   total=int(state.get("total") or len(runs)), done=int(state.get("done") or 0),
                   current=state.get("current"), plan=state.get("plan"), created=state.get("created"),
                   started=state.get("started"), ended=state.get("ended"), message=state.get("message"), runs=runs)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def ok(self) -> bool:
        """Still going, or finished with every command exiting 0."""
        return self.status in RUNNING_STATUSES or self.status == "completed"

    @property
    def current_label(self) -> str | None:
        if self.current is None or not (0 <= self.current < len(self.runs)):
            return None
        return self.runs[self.current].label

    def elapsed(self, now: float | None = None) -> float | None:
        """Seconds from start to end (or to now while it runs), by the host's clock for both ends when known."""
        start = _epoch(self.started)
        if start is None:
            return None
        end = _epoch(self.ended) if self.ended else (now if now is not None else time.time())
        return None if end is None else max(0.0, end - start)

    def summary(self) -> str:
        """`2/4 runs, now: dataset=mini temperature=1.0` or `completed 4/4`."""
        if self.status in RUNNING_STATUSES:
            now = f", now: {self.current_label}" if self.current_label else ""
            return f"{self.done}/{self.total} runs done{now}"
        bad = [r for r in self.runs if r.failed]
        text = f"{self.status} {sum(1 for r in self.runs if r.status == 'ok')}/{self.total} ok"
        if bad:
            text += "; " + ", ".join(f"{r.label}: exit {r.exit_code}" for r in bad)
        if self.message and self.status in ("error", "lost", "stopped"):
            text += f" ({self.message})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "run_id": self.run_id, "status": self.status, "total": self.total,
                "done": self.done, "current": self.current, "plan": self.plan, "created": self.created,
                "started": self.started, "ended": self.ended, "message": self.message,
                "runs": [{"index": r.index, "label": r.label, "status": r.status, "exit_code": r.exit_code,
                          "signal": r.signal, "started": r.started, "ended": r.ended, "seconds": r.seconds,
                          **({"log_tail": r.log_tail} if r.log_tail is not None else {})} for r in self.runs]}


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


# --- local records -------------------------------------------------------------------------------------------------


def results_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where collected results and launch records live: --results-dir, else $DDOPS_RESULTS_DIR, else ./results."""
    return Path(explicit or os.environ.get(RESULTS_ENV) or "results")


def write_launch_record(root: Path, run_id: str, record: Mapping[str, Any]) -> Path:
    """results/<run-id>/launch.json: which hosts and plan a run was started with (for status/collect later)."""
    path = root / run_id / LAUNCH_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_launch_record(root: Path, run_id: str) -> dict[str, Any] | None:
    try:
        data = json.loads((root / run_id / LAUNCH_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def latest_run_id(root: Path, needs: str = LAUNCH_RECORD) -> str | None:
    """The newest run (ids sort by launch time) that has `needs` under results/<run-id>/."""
    try:
        ids = sorted((p.name for p in root.iterdir() if (p / needs).is_file()), reverse=True)
    except OSError:
        return None
    return ids[0] if ids else None


def resolve_run_id(root: Path, run_id: str | None, needs: str = LAUNCH_RECORD) -> str:
    if run_id:
        return check_run_id(run_id)
    found = latest_run_id(root, needs)
    if found is None:
        what = "launched from here" if needs == LAUNCH_RECORD else "collected"
        raise UsageError(f"no run given and none {what} (in {root}); name one (see `ddops bench list`)")
    return found


def run_hosts(all_hosts: Sequence[Host], root: Path, run_id: str) -> list[Host]:
    """The hosts a run was launched on (its launch record), else every inventory host."""
    record = read_launch_record(root, run_id)
    names = set(record.get("hosts") or ()) if record else set()
    chosen = [h for h in all_hosts if h.name in names]
    return chosen or list(all_hosts)


# --- per-host tasks --------------------------------------------------------------------------------------------------


def status_task(run_id: str) -> Callable[[Host, Any], TaskOutcome]:
    """Task: the run's state on a host (skipped when the host has no such run)."""

    def task(host: Host, session: Any) -> TaskOutcome:
        try:
            result = session.call_agent("bench_status", {"repo": host.repo, "run_id": run_id})
        except AgentError as exc:
            if exc.kind in ("no_run", "no_repo"):
                return TaskOutcome(SKIPPED, f"no run {run_id} here")
            raise
        run = HostRun.from_state(host.name, result["state"], result.get("failures"))
        return TaskOutcome(OK if run.ok else FAILED, run.summary(), {"run": run.to_json()})

    return task


def stop_task(run_id: str, actor: str, grace: float = 5.0) -> Callable[[Host, Any], TaskOutcome]:
    """Task: end every process of the run on a host and record it as stopped."""

    def task(host: Host, session: Any) -> TaskOutcome:
        try:
            result = session.call_agent("bench_stop", {"repo": host.repo, "run_id": run_id, "grace": grace,
                                                       "actor": actor}, timeout=grace + 60)
        except AgentError as exc:
            if exc.kind in ("no_run", "no_repo"):
                return TaskOutcome(SKIPPED, f"no run {run_id} here")
            raise
        if result.get("already_ended"):
            return TaskOutcome(OK, f"already {result.get('status')}; nothing to stop", result)
        if result.get("remaining"):
            return TaskOutcome(FAILED, f"processes still alive after SIGKILL: {result['remaining']}", result)
        return TaskOutcome("changed", f"stopped ({len(result.get('killed') or [])} processes ended)", result)

    return task


def list_task(host: Host, session: Any) -> TaskOutcome:
    """Task: every run found in the host's repo."""
    try:
        result = session.call_agent("bench_list", {"repo": host.repo})
    except AgentError as exc:
        if exc.kind == "no_repo":
            return TaskOutcome(SKIPPED, "no repo here")
        raise
    runs = result.get("runs") or []
    return TaskOutcome(OK, f"{len(runs)} run{'s' if len(runs) != 1 else ''}", {"runs": runs})


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
    Connections that drop are reopened; a host unreachable for `give_up_after` seconds is reported final.
    """

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

    def __enter__(self) -> "Follower":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                    if exc.kind in ("no_run", "no_repo"):
                        self._queue.put(HostUpdate(name, error=f"no run {self.run_id} here", final=True))
                        return
                    raise
                except TransportError as exc:
                    _close(session)
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
            _close(session)

    def _poll_once(self, cursor: _HostCursor, session: Any) -> bool:
        """One bench_poll (repeated while more log is waiting); True once the run is over and fully read."""
        while True:
            payload = {"repo": cursor.host.repo, "run_id": self.run_id, "offset": cursor.offset,
                       "max_bytes": self.max_bytes if self.logs else 0}
            result = session.call_agent("bench_poll", payload)
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


def _close(session: Any) -> None:
    if session is not None:
        try:
            session.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may raise
            pass


def read_logs(host: Host, session: Any, run_id: str, max_bytes: int = 4 * 1024 * 1024) -> tuple[str, HostRun | None]:
    """The whole log of a run on one host (read in chunks) and its state."""
    offset, chunks, run = 0, [], None
    while True:
        result = session.call_agent("bench_poll", {"repo": host.repo, "run_id": run_id, "offset": offset,
                                                   "max_bytes": max_bytes})
        data = base64.b64decode(result.get("log_b64") or "")
        chunks.append(data)
        offset = int(result.get("offset", offset))
        if result.get("state"):
            run = HostRun.from_state(host.name, result["state"], result.get("failures"))
        if not data or offset >= int(result.get("log_size", 0)):
            return b"".join(chunks).decode("utf-8", "replace"), run
