"""Run one per-host function across many hosts, in parallel, never letting one host stop the others."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

from ddops.errors import Cancelled, ConnectionLost, DdopsError, message_for
from ddops.inventory import Host
from ddops.strenum import StrEnum


class HostStatus(StrEnum):
    """How one host came out of one ddops command."""

    OK = "ok"                    # as wanted, nothing changed
    CHANGED = "changed"          # as wanted now, something changed (or, with --check, would)
    FAILED = "failed"
    UNREACHABLE = "unreachable"  # no session, or it was lost
    DRIFTED = "drifted"          # the host's files are not what the patches expect: nothing written
    SKIPPED = "skipped"          # nothing to do here (no such run, no repo)


OK, CHANGED, FAILED, UNREACHABLE, DRIFTED, SKIPPED = HostStatus
STATUSES = tuple(HostStatus)
FAILING = frozenset({FAILED, UNREACHABLE, DRIFTED})
DEFAULT_FORKS = 32
INTERNAL = "internal"  # the reason of a host's surprise: an exception that is no DdopsError (a bug)


class Report(Protocol):
    """What a task found and did on one host, as a value (mostly a JsonValue): --json shows its to_json() as `data`."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What a per-host task reports back: how the host came out, in a word and a line, and its report."""

    status: HostStatus
    message: str = ""
    report: Report | None = None
    reason: str | None = None  # the kind of the error that decided it (DdopsError.kind), for machines

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", HostStatus(self.status))  # a typo'd status fails here, not in a report
        if self.report is not None and not hasattr(self.report, "to_json"):  # a dict, say: its keys would have no home
            raise TypeError(f"a task reports a value with to_json(), not a {type(self.report).__name__}")


@dataclass(frozen=True, slots=True)
class HostResult:
    """One host's result of one ddops command."""

    host: str
    address: str
    status: HostStatus
    message: str = ""  # what happened, without the host's name: every view shows it beside the host
    report: Any = None  # the task's Report (Any: a renderer reads the fields of the one its command's task gives)
    elapsed: float = 0.0
    connect_time: float | None = None
    round_trips: int = 0
    agent: str | None = None  # how the host's agent was reached: "resident", "started", or None (not called)
    interrupted: str | None = None  # in a run the user interrupted: NOT_STARTED, FINISHED or CANCELLED; else None
    reason: str | None = None  # the kind of the error that decided the status (DdopsError.kind); None when none did

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "address": self.address, "status": self.status, "message": self.message,
                "reason": self.reason, "elapsed_s": round(self.elapsed, 4),
                "connect_s": None if self.connect_time is None else round(self.connect_time, 4),
                "round_trips": self.round_trips, "agent": self.agent,
                "data": {} if self.report is None else self.report.to_json(),
                **({"interrupted": self.interrupted} if self.interrupted else {})}


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """Progress: a host entered a phase ("connecting", "running", "done"); `result` set when done."""

    host: str
    phase: str
    result: HostResult | None = None


# What an interrupted run did with a host that had not finished when the user interrupted it.
NOT_STARTED = "not_started"  # never started: no connection, nothing run
FINISHED = "finished"        # was in flight and ran to its end (a commit is never cut in half)
CANCELLED = "cancelled"      # was only running a command, which was ended on the host


class Interrupt:
    """The user's Ctrl-C for one fleet run: once requested, no host starts, and cancellable tasks end their
    commands (they wait on `event`)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def request(self) -> None:
        self.event.set()


Task = Callable[[Host, Any], TaskOutcome]
Connect = Callable[[Host], Any]


def run_fleet(hosts: Sequence[Host], task: Task, connect: Connect, *, forks: int = DEFAULT_FORKS,
              on_event: Callable[[FleetEvent], None] | None = None,
              interrupt: Interrupt | None = None) -> list[HostResult]:
    """Run task(host, session) on every host with at most `forks` at once; results in host order. Once `interrupt`
    is requested, hosts not yet started are not started (their results say so) and those in flight finish."""
    if forks < 1:
        raise ValueError("forks must be at least 1")
    emit = _serialised(on_event)
    interrupt = interrupt or Interrupt()

    def one(host: Host) -> HostResult:
        return run_one(host, task, connect, emit, interrupt)

    if len(hosts) == 1:
        return [one(hosts[0])]
    with ThreadPoolExecutor(max_workers=min(forks, len(hosts)), thread_name_prefix="ddops-host") as pool:
        return list(pool.map(one, hosts))


def run_one(host: Host, task: Task, connect: Connect, emit: Callable[[FleetEvent], None],
            interrupt: Interrupt | None = None) -> HostResult:
    interrupt = interrupt or Interrupt()
    started = time.monotonic()
    if interrupt.requested:
        return _not_started(host, emit)
    emit(FleetEvent(host.name, "connecting"))
    try:
        session = connect(host)
    except Exception as exc:  # noqa: BLE001 - one host's surprise must not stop the fleet
        failed = outcome_of_error(host.name, exc)
        message = failed.message if isinstance(exc, DdopsError) else f"{type(exc).__name__}: {exc}"
        result = HostResult(host.name, host.address, UNREACHABLE, message, reason=failed.reason,
                            elapsed=time.monotonic() - started)
        emit(FleetEvent(host.name, "done", result))
        return result
    if interrupt.requested:  # connected meanwhile: the task itself never starts
        close_quietly(session)
        return _not_started(host, emit)
    emit(FleetEvent(host.name, "running"))
    try:
        outcome = task(host, session)
    except Exception as exc:  # noqa: BLE001
        outcome = outcome_of_error(host.name, exc)
    finally:
        close_quietly(session)
    result = HostResult(host.name, host.address, outcome.status, outcome.message, outcome.report,
                        elapsed=time.monotonic() - started, connect_time=getattr(session, "connect_time", None),
                        round_trips=getattr(session, "round_trips", 0), agent=getattr(session, "agent_mode", None),
                        interrupted=CANCELLED if outcome.reason == Cancelled.kind else
                        FINISHED if interrupt.requested else None, reason=outcome.reason)
    emit(FleetEvent(host.name, "done", result))
    return result


def outcome_of_error(host: str, exc: BaseException) -> TaskOutcome:
    """What an error that ended a host's task makes of it: unreachable when the connection died, failed otherwise,
    with the error's kind as the reason."""
    if isinstance(exc, DdopsError):
        return TaskOutcome(UNREACHABLE if isinstance(exc, ConnectionLost) else FAILED, message_for(host, exc),
                           reason=exc.kind)
    return TaskOutcome(FAILED, f"internal error: {type(exc).__name__}: {exc}", reason=INTERNAL)


def _not_started(host: Host, emit: Callable[[FleetEvent], None]) -> HostResult:
    result = HostResult(host.name, host.address, SKIPPED, "not started: interrupted", interrupted=NOT_STARTED)
    emit(FleetEvent(host.name, "done", result))
    return result


def close_quietly(session: Any) -> None:
    """Close a session whatever state it is in (None: there is none)."""
    if session is None:
        return
    with suppress(Exception):  # closing a dead connection may raise; the result stands
        session.close()


def _serialised(on_event: Callable[[FleetEvent], None] | None) -> Callable[[FleetEvent], None]:
    if on_event is None:
        return lambda event: None
    lock = threading.Lock()

    def emit(event: FleetEvent) -> None:
        with lock:
            on_event(event)

    return emit


def worst_exit_code(results: Iterable[HostResult]) -> int:
    """0 when every host is fine, 1 when at least one failed."""
    return 1 if any(r.failed for r in results) else 0


def counts(results: Iterable[HostResult]) -> dict[str, int]:
    out = {s: 0 for s in STATUSES}
    for r in results:
        out[r.status] = out.get(r.status, 0) + 1
    return {k: v for k, v in out.items() if v}


def interrupted_summary(results: Sequence[HostResult]) -> str:
    """`interrupted: N done, M finished their commit, K not started` (and C cancelled, when some were)."""
    done = sum(1 for r in results if r.interrupted is None)
    finished = sum(1 for r in results if r.interrupted == FINISHED)
    cancelled = sum(1 for r in results if r.interrupted == CANCELLED)
    not_started = sum(1 for r in results if r.interrupted == NOT_STARTED)
    parts = [f"{done} done", f"{finished} finished their commit"] + ([f"{cancelled} cancelled"] if cancelled else [])
    return "interrupted: " + ", ".join(parts + [f"{not_started} not started"])


# A recap longer than a screen folds: the hosts that need a look (failed, unreachable, drifted, changed) in full,
# hosts with identical rows grouped into one, the rest (ok, skipped) counted on one line.
FOLD_OVER = 20
SHOWN_IN_FULL = frozenset({FAILED, UNREACHABLE, DRIFTED, CHANGED})


@dataclass(frozen=True, slots=True)
class RecapRow:
    """One row of a recap: one host, or hosts whose status, message and extra cells are all the same."""

    hosts: tuple[str, ...]
    status: HostStatus
    message: str
    cells: tuple[str, ...]
    elapsed: float  # the longest of the group's
    results: tuple[HostResult, ...]


@dataclass(frozen=True, slots=True)
class Recap:
    """What a recap shows: its rows, and per status how many hosts were folded into the count line."""

    rows: tuple[RecapRow, ...]
    folded: dict[str, int]


def fold_recap(results: Sequence[HostResult], cells: Callable[[HostResult], tuple[str, ...]] = lambda r: (), *,
               all_rows: bool = False, fold_over: int = FOLD_OVER) -> Recap:
    """Every host a row (up to fold_over hosts, or all_rows); past that, the hosts to look at grouped by identical
    rows, in the order their first host comes, and the others folded into counts."""
    if all_rows or len(results) <= fold_over:
        return Recap(tuple(RecapRow((r.host,), r.status, r.message, cells(r), r.elapsed, (r,)) for r in results), {})
    groups: dict[tuple, list[HostResult]] = {}
    folded: dict[str, int] = {}
    for r in results:
        if r.status in SHOWN_IN_FULL:
            groups.setdefault((r.status, r.message, cells(r)), []).append(r)
        else:
            folded[r.status] = folded.get(r.status, 0) + 1
    rows = tuple(RecapRow(tuple(r.host for r in rs), status, message, shown, max(r.elapsed for r in rs), tuple(rs))
                 for (status, message, shown), rs in groups.items())
    return Recap(rows, folded)
