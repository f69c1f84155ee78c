"""Bench runs as values: run ids, a host's run state (from its state.json), and the local launch records.

A run lives on each host under `<repo>/.ddops/runs/<run-id>/` (see remote/ddops_agent/bench.py); ddops/tasks/bench.py
asks the hosts about it. Pure: no session, no rich, no typer."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddops import settings
from ddops.errors import UsageError
from ddops.inventory import Host
from ddops.jsonvalue import OMIT_NONE, JsonValue, omitted_when_none
from ddops.strenum import StrEnum


class RunStatus(StrEnum):
    """A run's state on one host, as its state.json says (remote/ddops_agent/bench.py writes it)."""

    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"  # every command ran and exited 0
    FAILED = "failed"        # every command ran, at least one did not exit 0
    STOPPED = "stopped"      # `ddops bench stop`
    ERROR = "error"          # the runner itself failed
    LOST = "lost"            # the runner is gone without saying how it ended (the host rebooted, say)
    UNKNOWN = "unknown"      # no status, or one this ddops does not know

    @classmethod
    def of(cls, value: Any) -> RunStatus:
        return cls._value2member_map_.get(str(value or ""), cls.UNKNOWN)  # type: ignore[return-value]


class StepStatus(StrEnum):
    """One command of a run."""

    PENDING = "pending"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    # A Slurm array task's ends besides those (ddops/bench/slurm.py STATUS_OF)
    CANCELLED = "cancelled"
    NODE_FAIL = "node_fail"
    OUT_OF_MEMORY = "out_of_memory"
    BOOT_FAIL = "boot_fail"
    DEADLINE = "deadline"
    PREEMPTED = "preempted"
    LOST = "lost"  # Slurm forgot a task that never recorded its end
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, value: Any) -> StepStatus:
        return cls._value2member_map_.get(str(value or "pending"), cls.UNKNOWN)  # type: ignore[return-value]


# The agent's error kinds that mean "this host has no such run" (no repo: no runs at all), which is not a fault.
NO_RUN_KINDS = ("no_run", "no_repo")
RUNNING_STATUSES = (RunStatus.STARTING, RunStatus.RUNNING)
TERMINAL_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.ERROR, RunStatus.LOST)
RESULTS_ENV = settings.RESULTS_DIR.name
LAUNCH_RECORD = "launch.json"
MANIFEST = "manifest.json"


def new_run_id(now: datetime | None = None, token: str | None = None) -> str:
    """`20261130-0812-ab12`: UTC minute, then four random hex digits (sorts by launch time)."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%d-%H%M}-{token or secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    """The run id itself, or a UsageError when it could not name a run directory."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", run_id or ""):
        raise UsageError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (e.g. 20261130-0812-ab12)")
    return run_id


# --- state values --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRecord(JsonValue):
    """One command of a run on one host."""

    index: int
    label: str
    status: StepStatus
    exit_code: int | None = None
    signal: int | None = None
    started: str | None = None
    ended: str | None = None
    seconds: float | None = None
    log_tail: str | None = omitted_when_none()  # the end of this command's own log, for failed runs
    slurm: Mapping[str, Any] | None = field(default=None, hash=False, compare=False,  # its array task (Slurm runs)
                                            metadata=OMIT_NONE)

    @property
    def failed(self) -> bool:
        from ddops.bench.slurm import FAILED_STATUSES

        return self.status in FAILED_STATUSES


@dataclass(frozen=True, slots=True)
class HostRun(JsonValue):
    """One host's view of a run, from its state.json."""

    host: str
    run_id: str
    status: RunStatus
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
    def from_state(cls, host: str, state: Mapping[str, Any], failures: Mapping[str, str] | None = None) -> HostRun:
        failures = failures or {}
        runs = tuple(
            RunRecord(index=int(r.get("index", i)), label=str(r.get("label") or f"run {i}"),
                      status=StepStatus.of(r.get("status")), exit_code=r.get("exit_code"), signal=r.get("signal"),
                      started=r.get("started"), ended=r.get("ended"), seconds=r.get("seconds"),
                      log_tail=failures.get(str(r.get("index", i))), slurm=r.get("slurm") or None)
            for i, r in enumerate(state.get("runs") or []))
        return cls(host=host, run_id=str(state.get("run_id") or ""), status=RunStatus.of(state.get("status")),
                   total=int(state.get("total") or len(runs)), done=int(state.get("done") or 0),
                   current=state.get("current"), plan=state.get("plan"), created=state.get("created"),
                   started=state.get("started"), ended=state.get("ended"), message=state.get("message"), runs=runs)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def ok(self) -> bool:
        """Still going, or finished with every command exiting 0."""
        return self.status in RUNNING_STATUSES or self.status == RunStatus.COMPLETED

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
        text = f"{self.status} {sum(1 for r in self.runs if r.status == StepStatus.OK)}/{self.total} ok"
        if bad:
            text += "; " + ", ".join(f"{r.label}: exit {r.exit_code}" for r in bad)
        if self.message and self.status in (RunStatus.ERROR, RunStatus.LOST, RunStatus.STOPPED):
            text += f" ({self.message})"
        return text


# --- what each bench task reports of one host ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreflightReport(JsonValue):
    """What the preflight found on one host: the required patches' states, the pin, and then either why the launch
    is refused or (bench --check) the commands it would run."""

    patches: Mapping[str, str]
    pin: str | None = omitted_when_none()
    problems: tuple[str, ...] | None = omitted_when_none()
    commands: tuple[str, ...] | None = omitted_when_none()
    environment: tuple[str, ...] | None = omitted_when_none()  # what the environment check saw fit (`... (tested)`)
    # untested transformers; GPU trouble --allow-busy-gpus let by
    warnings: tuple[str, ...] | None = omitted_when_none()


@dataclass(frozen=True, slots=True)
class LaunchReport(JsonValue):
    """A run started on one host: how many commands, where, and its runner's pid (bare) or job id (Slurm)."""

    run_id: str
    total: int
    run_dir: str | None
    patches: Mapping[str, str]
    pid: int | None = omitted_when_none()
    job_id: str | None = omitted_when_none()
    executor: str | None = omitted_when_none()
    warnings: tuple[str, ...] | None = omitted_when_none()  # as the preflight's


@dataclass(frozen=True, slots=True)
class RunReport(JsonValue):
    """A run's state on one host (`bench status`)."""

    run: HostRun


@dataclass(frozen=True, slots=True)
class LogReport(JsonValue):
    """A run's whole log on one host (`bench logs`)."""

    log: str


@dataclass(frozen=True, slots=True)
class StopReport(JsonValue):
    """What `bench stop` ended on one host: processes killed and left (bare), array tasks cancelled (Slurm)."""

    run_id: str | None
    status: str | None
    killed: Sequence[Any] = ()
    remaining: Sequence[Any] = ()
    already_ended: bool = False
    job_id: str | None = omitted_when_none()
    cancelled: Sequence[str] | None = omitted_when_none()


@dataclass(frozen=True, slots=True)
class RunEntry(JsonValue):
    """One run found in a host's repo (`bench list`)."""

    run_id: str | None
    plan: str | None
    status: str | None
    done: int | None
    total: int | None
    created: str | None
    started: str | None
    ended: str | None


@dataclass(frozen=True, slots=True)
class RunList(JsonValue):
    """Every run in one host's repo, newest first."""

    runs: tuple[RunEntry, ...]


@dataclass(frozen=True, slots=True)
class CollectReport(JsonValue):
    """What `bench collect` copied from one host: its manifest entry, files fetched and already here, the run."""

    manifest: Mapping[str, Any]
    fetched: int
    kept: int
    run: HostRun

    @property
    def files(self) -> int:
        """How many of the run's result files the manifest lists."""
        return len(self.manifest.get("files") or ())


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
    return Path(explicit or settings.RESULTS_DIR.value() or "results")


def write_launch_record(root: Path, run_id: str, plan: Any, hosts: Sequence[str], inventory: str) -> Path:
    """results/<run-id>/launch.json: which hosts and plan a run was started with (for status/collect later)."""
    record = {"run_id": run_id, "plan": plan.name, "plan_path": str(plan.path), "hosts": list(hosts),
              "inventory": inventory, "launched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
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
