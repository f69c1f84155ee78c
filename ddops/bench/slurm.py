"""Slurm as a bench executor, the pure part: inventory options, the sbatch command line and batch script of a run's
job array, and what squeue, scontrol and sacct print turned into one state per array task.

No SSH and no subprocess here: the host agent (remote/ddops_agent/slurm.py) runs the Slurm commands and hands back their
raw output; ddops/tasks/slurm.py drives it per host. A run is one job array, one task per run of the plan's
grid; each task is wrapped by the agent (`slurm_task`) so it records its own start, end, exit, node and GPU ids."""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddops.errors import DdopsError
from ddops.slurm_options import SlurmOptions

# --- the job array ----------------------------------------------------------------------------------------------------

# What the batch script runs on the compute node: the shipped agent, written into the run directory at submit
# (bootstrap.py + agent.bundle, loaded as the bootstrap loads it over ssh), answering one request (`slurm_task`, the
# array index comes from Slurm's environment) and exiting with the task's own exit code so that Slurm's
# COMPLETED/FAILED and ExitCode are the command's.
TASK_BOOT = (
    "import sys\n"
    "run_dir = sys.argv[1]\n"
    "boot_path = run_dir + '/bootstrap.py'\n"
    "boot = {'__name__': 'ddops_bootstrap'}\n"
    "exec(compile(open(boot_path).read(), boot_path, 'exec'), boot)\n"
    "bundle = open(run_dir + '/agent.bundle', 'rb').read()\n"
    "importer = boot['BundleImporter'](bundle, boot['compile_bundle'](bundle))\n"
    "sys.meta_path.insert(0, importer)\n"
    "answer = importer.load().protocol.answer(open(run_dir + '/task-request.json', 'rb').read())\n"
    "if not answer.get('ok'):\n"
    "    sys.stderr.write('ddops task: %s\\n' % answer.get('error'))\n"
    "    sys.exit(70)\n"
    "sys.exit(answer['result'].get('exit_code') or 0)\n"
)


def time_limit(options: SlurmOptions, plan_minutes: float) -> str:
    """--time: the inventory's, else the plan's timeout rounded up to whole minutes."""
    return options.time or str(max(1, math.ceil(plan_minutes)))


def sbatch_args(options: SlurmOptions, *, run_id: str, total: int, run_dir: str, plan_minutes: float) -> list[str]:
    """sbatch's options for one run: a job array of `total` tasks, each writing to run_dir/task-<index>.out."""
    if total < 1:
        raise ValueError("a job array needs at least one task")
    if "\\" in run_dir:
        raise DdopsError(f"{run_dir}: a Slurm --output path with a backslash turns off its %a pattern (one output "
                         "file per array task): move the repo to a path without one")
    args = ["--parsable", f"--job-name=ddops-{run_id}", f"--array=0-{total - 1}",
            f"--output={slurm_literal(run_dir)}/task-%a.out", f"--chdir={run_dir}", "--open-mode=append",
            "--export=ALL", f"--time={time_limit(options, plan_minutes)}"]
    for key in ("partition", "gres", "account", "qos", "constraint", "nodes"):
        value = getattr(options, key)
        if value:
            args.append(f"--{key}={value}")
    return args + list(options.extra)


def slurm_literal(path: str) -> str:
    """path inside an sbatch filename pattern, where Slurm expands %j, %a, %u ...: `%%` is a literal `%`."""
    return path.replace("%", "%%")


def batch_script(python: str, run_dir: str, run_id: str) -> str:
    """The batch script of a run: every array task starts the run's agent copy on its own index."""
    boot = shlex.quote(TASK_BOOT)
    return (f"#!/bin/sh\n# ddops bench run {run_id}: one array task per run of the plan's grid.\n"
            f"exec {shlex.quote(python)} -S -c {boot} {shlex.quote(run_dir)}\n")


# --- task states ------------------------------------------------------------------------------------------------------

# Slurm job state -> the bench run status a task shows (lower case, like the bare executor's).
STATUS_OF = {
    "PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending", "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running",
    "SUSPENDED": "running", "STAGE_OUT": "running", "SIGNALING": "running", "RESIZING": "running",
    "COMPLETED": "ok", "FAILED": "failed", "CANCELLED": "cancelled", "TIMEOUT": "timeout",
    "NODE_FAIL": "node_fail", "OUT_OF_MEMORY": "out_of_memory", "BOOT_FAIL": "boot_fail",
    "DEADLINE": "deadline", "PREEMPTED": "preempted", "SPECIAL_EXIT": "failed", "REVOKED": "cancelled",
}
ACTIVE = ("pending", "running")
# Statuses of a task that ended without doing its work (shown and reported as failures).
FAILED_STATUSES = ("failed", "timeout", "node_fail", "out_of_memory", "boot_fail", "deadline", "preempted", "lost")


@dataclass(frozen=True, slots=True)
class TaskState:
    """One array task as Slurm (or, failing that, its own record) says it is."""

    index: int
    state: str  # Slurm's: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ... or UNKNOWN
    source: str  # squeue, scontrol, sacct, record, or none
    reason: str | None = None
    node: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    job_id: str | None = None  # the task's own job id (Slurm gives every array task one)

    @property
    def status(self) -> str:
        if self.state == "UNKNOWN":
            return "lost" if self.source == "record" else "unknown"
        return STATUS_OF.get(self.state, self.state.lower())

    @property
    def detail(self) -> str:
        """`PENDING (Resources)`, `RUNNING on node7`, `FAILED exit 3`, `CANCELLED`, `TIMEOUT on node7`."""
        text = self.state
        if self.state in ("PENDING",) and self.reason and self.reason != "None":
            text += f" ({self.reason})"
        elif self.node and self.state not in ("PENDING", "COMPLETED", "FAILED"):
            text += f" on {self.node}"
        if self.state in ("FAILED", "OUT_OF_MEMORY") and self.exit_code is not None:
            text += f" exit {self.exit_code}"
        if self.signal and self.state not in ("CANCELLED",):
            text += f" signal {self.signal}"
        return text


def _base_state(text: str) -> str:
    """`CANCELLED by 0` -> CANCELLED; `RUNNING` -> RUNNING."""
    return (text or "").strip().split(" ", 1)[0].rstrip("+").upper()


def _exit_pair(text: str | None) -> tuple[int | None, int | None]:
    """Slurm's `3:0` (exit code : signal) as two ints."""
    if not text or ":" not in text:
        return None, None
    code, sig = text.split(":", 1)
    try:
        return int(code), int(sig) or None
    except ValueError:
        return None, None


def _indexes(spec: str, total: int) -> list[int]:
    """Array indexes from `3`, `2-4`, `[2-4,7]`, `0-9:2`, `[5-9%2]`."""
    spec = spec.strip().strip("[]").split("%", 1)[0]
    out: list[int] = []
    for part in spec.split(","):
        if not part:
            continue
        step = 1
        if ":" in part:
            part, step_text = part.split(":", 1)
            step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else 1
        if "-" in part:
            lo, hi = part.split("-", 1)
            if lo.isdigit() and hi.isdigit():
                out.extend(range(int(lo), min(int(hi), total - 1) + 1, step))
        elif part.isdigit():
            out.append(int(part))
    return [i for i in out if 0 <= i < total]


# What squeue's --format codes mean (Slurm's man page). Which of them the agent asks for, in what order, is the
# agent's (remote/ddops_agent/slurm.py SLURM_SQUEUE_FORMAT): it sends that format with the output.
SQUEUE_CODES = {"%i": "own_id", "%F": "array_job_id", "%K": "index", "%T": "state", "%r": "reason", "%N": "node"}


def _columns(text: str, names: Sequence[str], sep: str) -> Iterable[dict[str, str]]:
    """Each line of text as {name: column}, skipping lines whose column count is not the format's."""
    for line in text.splitlines():
        parts = line.strip().split(sep)
        if len(parts) == len(names):
            yield dict(zip(names, parts))


def parse_squeue(text: str, job_id: str, total: int, fmt: str) -> dict[int, TaskState]:
    """`squeue -h -r -j JOB -o FMT` lines (FMT: `%i|%F|%K|%T|%r|%N`, any order) -> live task states."""
    names = [SQUEUE_CODES.get(code, code) for code in fmt.split("|")]
    tasks: dict[int, TaskState] = {}
    for row in _columns(text, names, "|"):
        if row.get("array_job_id") != job_id or "index" not in row:
            continue
        own = row.get("own_id", "")
        for i in _indexes(row["index"], total):
            tasks[i] = TaskState(i, _base_state(row.get("state", "")), "squeue", reason=row.get("reason") or None,
                                 node=row.get("node") or None, job_id=own.split("_")[0] if own and "_" not in own
                                 else None)
    return tasks


def _fields(line: str) -> dict[str, str]:
    """`Key=value Key2=value2` (values without spaces, as `scontrol -o` prints the ones we read)."""
    out = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


def parse_scontrol(text: str, job_id: str, total: int) -> dict[int, TaskState]:
    """`scontrol show job JOB -o` (one line per array task, or per pending range) -> task states."""
    tasks: dict[int, TaskState] = {}
    for line in text.splitlines():
        f = _fields(line)
        if f.get("ArrayJobId") != job_id or "ArrayTaskId" not in f:
            continue
        code, sig = _exit_pair(f.get("ExitCode"))
        node = f.get("NodeList") or None
        if node == "(null)":
            node = None
        for i in _indexes(f["ArrayTaskId"], total):
            tasks[i] = TaskState(i, _base_state(f.get("JobState", "")), "scontrol", reason=f.get("Reason"),
                                 node=node, exit_code=code, signal=sig, job_id=f.get("JobId"))
    return tasks


def parse_sacct(text: str, job_id: str, total: int, fields: str,
                job_ids: Mapping[str, int] | None = None) -> dict[int, TaskState]:
    """`sacct -n -P -o FIELDS` (JobID, State, ExitCode, NodeList in the agent's order) -> task states. IDs are
    `JOB_INDEX` with accounting, or the task's own job id from the job completion log (`sacct -c`), mapped through
    `job_ids` (own id -> index)."""
    tasks: dict[int, TaskState] = {}
    job_ids = job_ids or {}
    for row in _columns(text, fields.split(","), "|"):
        ident, state, node = row.get("JobID", ""), row.get("State", ""), row.get("NodeList", "")
        if not ident or "." in ident:  # JOB_3.batch, JOB_3.extern: steps, not the task
            continue
        code, sig = _exit_pair(row.get("ExitCode"))
        if ident.startswith(job_id + "_"):
            indexes = _indexes(ident[len(job_id) + 1:], total)
        elif ident in job_ids:
            indexes = [job_ids[ident]]
        else:
            continue
        for i in indexes:
            tasks[i] = TaskState(i, _base_state(state), "sacct", node=node or None, exit_code=code, signal=sig)
    return tasks


def state_from_record(index: int, record: Mapping[str, Any] | None) -> TaskState:
    """What a task's own record says when Slurm no longer knows the task: ended (with its exit), or lost."""
    if not record:
        return TaskState(index, "UNKNOWN", "none")
    node = record.get("node")
    if record.get("ended") is None:
        # Started, never ended, and Slurm has forgotten it: the node or the job died under it.
        return TaskState(index, "UNKNOWN", "record", node=node, job_id=record.get("job_id"))
    code = record.get("exit_code")
    return TaskState(index, "COMPLETED" if code == 0 else "FAILED", "record", node=node, exit_code=code,
                     signal=record.get("signal"), job_id=record.get("job_id"))


def task_states(total: int, job_id: str, *, squeue: str = "", squeue_format: str = "", scontrol: str = "",
                sacct: str = "", sacct_fields: str = "",
                records: Mapping[int, Mapping[str, Any]] | None = None) -> tuple[TaskState, ...]:
    """One state per task, from the freshest source that knows it: squeue, then scontrol, then sacct, then the
    task's own record. Slurm's word wins over the record (a task killed for its time limit never wrote its end).
    The formats are the ones the agent ran squeue and sacct with (it sends them with their output)."""
    records = records or {}
    own_ids = {str(r.get("job_id")): i for i, r in records.items() if r.get("job_id") is not None}
    sources = (parse_squeue(squeue, job_id, total, squeue_format), parse_scontrol(scontrol, job_id, total),
               parse_sacct(sacct, job_id, total, sacct_fields, own_ids))
    out = []
    for i in range(total):
        found = next((s[i] for s in sources if i in s), None)
        record = records.get(i) or {}
        if found is None:
            found = state_from_record(i, record)
        elif record.get("exit_code") is not None and found.state in ("COMPLETED", "FAILED"):
            # The wrapper's exit code is the command's (Slurm's is the same unless the wrapper itself failed).
            found = TaskState(i, found.state, found.source, found.reason, found.node or record.get("node"),
                              record["exit_code"], record.get("signal"), found.job_id or record.get("job_id"))
        out.append(found)
    return tuple(out)


def run_status(tasks: Sequence[TaskState]) -> str:
    """The run's status as the bare executor names it: running, completed, failed or stopped."""
    statuses = [t.status for t in tasks]
    if any(s in ACTIVE for s in statuses):
        return "running"
    if all(s == "ok" for s in statuses):
        return "completed"
    if any(s in FAILED_STATUSES or s == "unknown" for s in statuses):
        return "failed"
    return "stopped"


def run_message(job_id: str, tasks: Sequence[TaskState]) -> str:
    """`job 42: 2 pending (Resources), 1 running on node7, 1 completed`."""
    counts: dict[str, int] = {}
    for t in tasks:
        key = f"PENDING ({t.reason})" if t.state == "PENDING" and t.reason and t.reason != "None" else t.state
        counts[key] = counts.get(key, 0) + 1
    return f"job {job_id}: " + ", ".join(f"{n} {k.lower()}" for k, n in counts.items())


def build_state(run_id: str, job_id: str, labels: Sequence[str], tasks: Sequence[TaskState],
                records: Mapping[int, Mapping[str, Any]], *, plan: str | None = None, created: str | None = None,
                host: str | None = None) -> dict[str, Any]:
    """A state.json-shaped document (what `HostRun.from_state` reads) for a Slurm run, each run with its task's
    Slurm details (`slurm`: state, reason, job ids, array index, node, GPU ids)."""
    runs = []
    for t, label in zip(tasks, labels):
        rec = records.get(t.index) or {}
        runs.append({
            "index": t.index, "label": label, "status": t.status, "exit_code": t.exit_code, "signal": t.signal,
            "started": rec.get("started"), "ended": rec.get("ended"), "seconds": rec.get("seconds"),
            "slurm": {"state": t.state, "detail": t.detail, "reason": t.reason, "source": t.source,
                      "array_job_id": job_id, "array_index": t.index, "job_id": t.job_id or rec.get("job_id"),
                      "node": t.node or rec.get("node"), "cuda_visible_devices": rec.get("cuda_visible_devices"),
                      "slurm_job_gpus": rec.get("slurm_job_gpus")},
            **({"servers": rec["servers"]} if rec.get("servers") else {}),
        })
    starts = [r["started"] for r in runs if r["started"]]
    ends = [r["ended"] for r in runs if r["ended"]]
    status = run_status(tasks)
    running = [t.index for t in tasks if t.status == "running"]
    return {"run_id": run_id, "plan": plan, "host": host, "status": status, "created": created,
            "started": min(starts) if starts else None,
            "ended": max(ends) if ends and status not in ("running",) else None,
            "message": run_message(job_id, tasks), "total": len(tasks),
            "done": sum(1 for t in tasks if t.status not in ACTIVE), "current": running[0] if running else None,
            "executor": "slurm", "job_id": job_id, "runs": runs}


def failure_indexes(tasks: Iterable[TaskState]) -> list[int]:
    return [t.index for t in tasks if t.status in FAILED_STATUSES or t.status == "cancelled"]


@dataclass(frozen=True, slots=True)
class SlurmQuery:
    """What the agent's slurm_* verbs return about a run's job, as text (parsed by `task_states`)."""

    job_id: str
    total: int
    labels: tuple[str, ...]
    squeue: str = ""
    scontrol: str = ""
    sacct: str = ""
    records: dict[int, dict[str, Any]] = field(default_factory=dict, hash=False)
    squeue_format: str = ""  # what the agent asked squeue and sacct for (remote/ddops_agent/slurm.py)
    sacct_fields: str = ""

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> SlurmQuery:
        slurm = result.get("slurm") or {}
        queries = slurm.get("queries") or {}

        def out(name: str) -> str:
            q = queries.get(name) or {}
            return str(q.get("stdout") or "") if q.get("rc") == 0 else ""

        def fmt(name: str) -> str:
            return str((queries.get(name) or {}).get("format") or "")

        records = {int(k): v for k, v in (slurm.get("records") or {}).items() if str(k).isdigit()
                   and isinstance(v, dict)}
        sacct_from = "sacct" if out("sacct") else "sacct_completions"
        return cls(job_id=str(slurm.get("job_id") or ""), total=int(slurm.get("total") or 0),
                   labels=tuple(slurm.get("labels") or ()), squeue=out("squeue"), scontrol=out("scontrol"),
                   sacct=out(sacct_from), records=records, squeue_format=fmt("squeue"), sacct_fields=fmt(sacct_from))

    def tasks(self) -> tuple[TaskState, ...]:
        return task_states(self.total, self.job_id, squeue=self.squeue, squeue_format=self.squeue_format,
                           scontrol=self.scontrol, sacct=self.sacct, sacct_fields=self.sacct_fields,
                           records=self.records)
