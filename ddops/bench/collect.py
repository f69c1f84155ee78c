"""Collecting a run: result files to results/<run-id>/<host>/ (sha256-checked, resumable) and a provenance manifest;
then reading them back, through the safe loader and the summarizers, as rows for the report."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from ddops.bench.runs import MANIFEST
from ddops.errors import DdopsError, UsageError
from ddops.inventory import Host


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


DEFAULT_MAX_FILE_BYTES = 2 * 1024**3  # what `bench report` reads at most (ddops.bench.results.MAX_RESULT_BYTES)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in `500M`, `2G`, `1.5GiB`, `4096` (powers of 1024); UsageError otherwise."""
    m = _SIZE.fullmatch(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--max-file-size {text!r}: not a size (e.g. 4096, 500M, 2G)")
    return int(float(m.group(1)) * 1024 ** "_KMGT".index(m.group(2).upper() or "_"))


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def oversized(files: Sequence[Mapping[str, Any]], max_bytes: int) -> tuple[list[Mapping[str, Any]], list[dict]]:
    """(files to download, refusals): a file the host lists as bigger than max_bytes is not downloaded at all."""
    keep, refused = [], []
    for f in files:
        size = f.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            refused.append({"path": str(f.get("path")), "reason": "the host listed no size for it"})
        elif size > max_bytes:
            refused.append({"path": str(f.get("path")), "reason": f"{format_size(size)}, over the "
                                                                  f"{format_size(max_bytes)} limit (--max-file-size)"})
        else:
            keep.append(f)
    return keep, refused


def safe_relpath(rel: str) -> PurePosixPath:
    """A host-supplied path below the host's results folder; refused if it could land anywhere else."""
    p = PurePosixPath(rel)
    # Each written component checked, not the normalised path: `.` normalises to no parts at all, which names the
    # host's folder itself (the download turned it into a file).
    # An absolute path starts with an empty component.
    if not rel or "\0" in rel or "\\" in rel or any(part in ("", ".", "..") for part in rel.split("/")):
        raise DdopsError(f"refusing result path {rel!r} from the host")
    return p


def host_manifest(host: Host, listing: Mapping[str, Any], files: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One host's provenance: hardware, software, commit, patches, the exact commands and env, times, exit codes."""
    spec = listing.get("spec") or {}
    state = listing.get("state") or {}
    prov = spec.get("provenance") or {}
    records = {r.get("index"): r for r in state.get("runs") or []}
    servers = {s.get("number"): s for s in state.get("servers") or [] if isinstance(s, dict)}
    commands = []
    for run in spec.get("runs") or []:
        rec = records.get(run.get("index"), {})
        commands.append({"index": run.get("index"), "label": run.get("label"), "command": run.get("command"),
                         "env": run.get("env") or {}, "params": run.get("params") or {},
                         "status": rec.get("status"), "exit_code": rec.get("exit_code"), "signal": rec.get("signal"),
                         "started": rec.get("started"), "ended": rec.get("ended"), "seconds": rec.get("seconds"),
                         **({"slurm": rec["slurm"]} if rec.get("slurm") else {}), **served_by(run, rec, servers)})
    return {
        "host": host.name, "address": host.address, "hostname": prov.get("hostname"),
        "run_id": listing.get("run_id"), "plan": spec.get("plan"), "summarizer": spec.get("summarizer"),
        **({"metrics": spec["metrics"]} if spec.get("metrics") else {}),
        "results": spec.get("results"), "status": state.get("status"),
        "gpu": {"model": prov.get("gpu_model"), "count": prov.get("gpu_count"), "driver": prov.get("gpu_driver"),
                "state": prov.get("gpu_state")},  # clocks, temperature, power limit, CUDA at launch: gpus.gpu_state
        "os": prov.get("os"), "kernel": prov.get("kernel"), "python": prov.get("python"),
        "python_executable": spec.get("python_executable") or prov.get("python_executable"),
        "torch": prov.get("torch"), "transformers": prov.get("transformers"),
        "repo": spec.get("repo") or prov.get("repo"), "repo_commit": prov.get("repo_commit"),
        "patches": [{"id": p.get("patch"), "file": p.get("file"), "sha256": p.get("after"),
                     "original_sha256": p.get("before"), "in_place": p.get("state") == "applied"}
                    for p in prov.get("patches") or []],
        "workdir": spec.get("workdir"), "env": spec.get("runner_env") or {}, "commands": commands,
        "started": state.get("started"), "ended": state.get("ended"),
        "exit_codes": {str(c["index"]): c["exit_code"] for c in commands},
        "failures": listing.get("failures") or {},
        "files": [{"path": f["path"], "sha256": f["sha256"], "size": f["size"]} for f in files],
        "refused": listing.get("refused") or [], "launched_by": spec.get("actor"),
        "ddops_version": spec.get("ddops_version"),
        **({"executor": "slurm", "job_id": state.get("job_id")} if state.get("executor") == "slurm" else {}),
        **server_versions(spec.get("summarizer"), commands),
    }


def server_versions(summarizer: Any, commands: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """{"vllm": "0.32.0"} for a vLLM plan whose servers said their version (several: joined), what the report's code
    identity reads beside torch's and transformers'; {} otherwise."""
    found = sorted({str(c["server"]["version"]) for c in commands if (c.get("server") or {}).get("version")})
    return {"vllm": ", ".join(found)} if found and summarizer == "vllm" else {}


def served_by(run: Mapping[str, Any], rec: Mapping[str, Any], servers: Mapping[Any, Mapping[str, Any]]
              ) -> dict[str, Any]:
    """{"server": ...} for a run that had one: its command and env as the plan rendered them, and what the host
    recorded of the server that answered it (version, port, seconds to ready, why it failed); {} for a run without."""
    if not run.get("server"):
        return {}
    ran = servers.get(rec.get("server")) or (rec.get("servers") or [{}])[-1]  # a Slurm task records its own
    kept = ("version", "port", "ready_seconds", "problem", "log")
    return {"server": {**run["server"], **{k: ran.get(k) for k in kept}}}


def write_manifest(root: Path, run_id: str, entries: Mapping[str, Mapping[str, Any]]) -> Path:
    """results/<run-id>/manifest.json: per-host provenance (host -> entry), merged with what earlier collects wrote."""
    path = root / run_id / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"run_id": run_id, "hosts": {}}
    if path.is_file():
        with suppress(ValueError):
            old = json.loads(path.read_text())
            if isinstance(old, dict) and isinstance(old.get("hosts"), dict):
                doc = old
    for host, entry in entries.items():
        doc["hosts"][host] = dict(entry)
    hosts = list(doc["hosts"].values())
    doc["plan"] = next((h.get("plan") for h in hosts if h.get("plan")), None)
    doc["summarizer"] = next((h.get("summarizer") for h in hosts if h.get("summarizer")), None)
    doc["collected"] = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


# --- reading collected results for the report ---------------------------------------------------------------------


def read_manifest(root: Path, run_id: str) -> dict[str, Any]:
    path = root / run_id / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DdopsError(f"run {run_id} is not collected ({path} is missing): run `ddops bench collect {run_id}`") \
            from None
    except ValueError as exc:
        raise DdopsError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), dict):
        raise DdopsError(f"{path}: not a ddops manifest")
    return doc


def _label_for(file_path: str, commands: Sequence[Mapping[str, Any]]) -> str:
    """The matrix label of the command that wrote this file (its save path names it), else the file's stem."""
    name = PurePosixPath(file_path).name
    owners = [c for c in commands if name in str(c.get("command") or "")]
    if len(owners) == 1 and owners[0].get("label"):
        return str(owners[0]["label"])
    return PurePosixPath(file_path).stem


@dataclass(frozen=True, slots=True)
class Gap:
    """Something a run was meant to produce and did not: a host with no result at all, one of its runs, or the
    whole run stopped; with why, from the manifest (exit code, the log's last error line, Slurm's state)."""

    run_id: str
    host: str
    reason: str
    label: str | None = None  # the run (matrix label) that produced nothing; None: the host as a whole
    nothing: bool = False  # the host produced no result row at all in this run

    @property
    def line(self) -> str:
        if self.nothing:
            return f"{self.host}: produced nothing ({self.reason})"
        return f"{self.host}: " + (f"run {self.label}: " if self.label else "") + self.reason

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "host": self.host, "run": self.label, "reason": self.reason,
                "nothing": self.nothing}


@dataclass(frozen=True, slots=True)
class Collected:
    """What `bench report` reads: the summaries, the files it could not read, and what produced nothing."""

    items: tuple[Any, ...]  # Labeled
    problems: tuple[str, ...]  # files refused or unreadable
    gaps: tuple[Gap, ...]
    hosts: Mapping[str, tuple[str, ...]]  # run id -> the hosts it ran on

    @property
    def caption(self) -> str:
        """`2 of 3 hosts produced nothing: host2 (exit 1, ModuleNotFoundError: ...); ...`, per run; empty if none."""
        parts = []
        for run_id, hosts in self.hosts.items():
            gaps = [g for g in self.gaps if g.run_id == run_id]
            empty = [g for g in gaps if g.nothing]
            lines = ([f"{len(empty)} of {len(hosts)} host{'s' if len(hosts) != 1 else ''} produced nothing: "
                      + "; ".join(f"{g.host} ({g.reason})" for g in empty)] if empty else [])
            lines += [g.line for g in gaps if not g.nothing]
            if lines:
                parts.append((f"run {run_id}: " if len(self.hosts) > 1 else "") + "; ".join(lines))
        return "\n".join(parts)


def load_collected(root: Path, run_ids: Sequence[str]) -> Collected:
    """Every collected result file of these runs through its summarizer, and every host and run that gave none."""
    from ddops.bench.report import CodeId, Labeled
    from ddops.bench.results import summarize_file
    from ddops.bench.runs import RUNNING_STATUSES, RunStatus, read_launch_record
    from ddops.bench.summary import ResultFileError

    items: list[Any] = []
    problems: list[str] = []
    gaps: list[Gap] = []
    hosts: dict[str, tuple[str, ...]] = {}
    docs = {run_id: read_manifest(root, run_id) for run_id in run_ids}
    playbooks = playbook_names(p.get("id") for doc in docs.values() for entry in doc["hosts"].values()
                               if isinstance(entry, dict) for p in entry.get("patches") or () if isinstance(p, dict))
    for run_id, doc in docs.items():
        launched = (read_launch_record(root, run_id) or {}).get("hosts") or []
        hosts[run_id] = tuple(dict.fromkeys([*doc["hosts"], *(h for h in launched if isinstance(h, str))]))
        for host, entry in doc["hosts"].items():
            summarizer = entry.get("summarizer") or doc.get("summarizer") or "ddtree"
            code = CodeId.from_manifest(entry, playbooks)
            # Collected while still going: the rows so far, marked, since more results (and repeats) may come.
            incomplete = RunStatus.of(entry.get("status")) in RUNNING_STATUSES
            produced: set[str] = set()
            unreadable = 0
            for f in entry.get("files") or []:
                try:
                    local = (root / run_id / host).joinpath(*safe_relpath(f["path"]).parts)
                except DdopsError as exc:
                    problems.append(f"{host}: {exc}")
                    unreadable += 1
                    continue
                label = _label_for(f["path"], entry.get("commands") or [])
                run_label = label if len(run_ids) == 1 else f"{run_id}:{label}"
                try:
                    summaries = summarize_file(local, summarizer, metrics=entry.get("metrics"))
                except ResultFileError as exc:
                    problems.append(f"{host}: {exc}")
                    unreadable += 1
                    continue
                produced.add(label)
                items.extend(Labeled(host, run_label, s, code=code, incomplete=incomplete, run_id=run_id)
                             for s in summaries)
            gaps += host_gaps(run_id, host, entry, produced, unreadable)
        gaps += [Gap(run_id, host, f"launched, but not collected: run `ddops bench collect {run_id}`", nothing=True)
                 for host in hosts[run_id][len(doc["hosts"]):]]
    return Collected(tuple(items), tuple(problems), tuple(gaps), hosts)


def playbook_names(patch_ids: Iterable[Any]) -> dict[str, str]:
    """patch id -> the name of the playbook that defines it, among the playbooks this controller finds (its
    $DDOPS_PLAYBOOK_PATH and the built-ins); a playbook that does not load is passed over."""
    from ddops.patching.playbook import playbooks_defining

    wanted = {p for p in patch_ids if isinstance(p, str)}
    try:
        books = playbooks_defining(wanted)
    except DdopsError:
        return {}
    return {p.id: book.name for book in books for p in book.patches if p.id in wanted}


def host_gaps(run_id: str, host: str, entry: Mapping[str, Any], produced: set[str], unreadable: int) -> list[Gap]:
    """What one host's run did not produce, and why: the host as a whole when it gave no result row, else each
    run that failed; and the run being stopped, whatever it gave."""
    from ddops.bench.runs import RUNNING_STATUSES, RunStatus, StepStatus

    status = RunStatus.of(entry.get("status"))
    commands = [c for c in entry.get("commands") or () if isinstance(c, dict)]
    tails = entry.get("failures")
    tails = tails if isinstance(tails, dict) else {}
    going = status in RUNNING_STATUSES
    failed = [(c, reason) for c in commands if c.get("label") not in produced
              for reason in [command_reason(c, status, tails.get(str(c.get("index"))), entry)] if reason]
    if going:  # still running: only what has already failed is a gap; the rest may come
        failed = [(c, r) for c, r in failed if StepStatus.of(c.get("status")) not in (StepStatus.PENDING,
                                                                                        StepStatus.RUNNING)]
    gaps = []
    if not produced and not going:
        reasons = list(dict.fromkeys(r for _, r in failed))
        if reasons:
            share = f"{len(failed)} of {len(commands)} runs: " if 1 < len(commands) != len(failed) else ""
            why = share + "; ".join(reasons[:2]) + (f"; and {len(reasons) - 2} more" if len(reasons) > 2 else "")
        elif unreadable:
            why = f"{unreadable} result file{'s' if unreadable != 1 else ''} could not be read"
        elif entry.get("refused"):
            why = "its result files were refused: " + ", ".join(
                f"{r.get('path')} ({r.get('reason')})" for r in entry["refused"] if isinstance(r, dict))
        else:
            why = f"its runs ended without a result file matching `{entry.get('results')}`"
        gaps.append(Gap(run_id, host, why, nothing=True))
    else:
        gaps += [Gap(run_id, host, reason, label=str(c.get("label"))) for c, reason in failed]
    if status == RunStatus.STOPPED:
        ok = sum(1 for c in commands if c.get("status") == StepStatus.OK)
        gaps.append(Gap(run_id, host, f"the run was stopped (`bench stop`) after {ok} of {len(commands)} runs"))
    return gaps


def command_reason(c: Mapping[str, Any], run_status: Any, tail: Any, entry: Mapping[str, Any]) -> str | None:
    """Why one command of a run gave no result (`exit 1, ModuleNotFoundError: No module named 'torch'`), or None
    when it ended well."""
    from ddops.bench.runs import StepStatus

    status = StepStatus.of(c.get("status"))
    if status == StepStatus.OK:
        return None
    slurm = c.get("slurm") if isinstance(c.get("slurm"), dict) else None
    if entry.get("executor") == "slurm" and slurm is not None:
        why = f"Slurm task {slurm.get('array_job_id')}_{c.get('index')} {slurm.get('detail') or status}"
    elif c.get("signal"):
        why = f"killed by signal {c.get('signal')}"
    elif status == StepStatus.FAILED:
        why = f"exit {c.get('exit_code')}"
    elif status == StepStatus.TIMEOUT:
        why = "timed out" + (f" after {c['seconds']:.0f} s" if isinstance(c.get("seconds"), (int, float)) else "")
    elif status == StepStatus.STOPPED:
        why = "stopped by `bench stop`"
    elif status == StepStatus.PENDING:
        why = f"never started (the run {run_status})"
    else:
        why = str(status)
    line = error_line(tail) if isinstance(tail, str) else None
    return f"{why}, {line}" if line else why


# The last line a Python traceback (or a shell) ends with names the error; launchers' own wrappers come after it.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)|[\w./-]+: .*(?:not found|No such file))"
                         r"\b.*")
_WRAPPERS = ("ChildFailedError", "CalledProcessError")


def error_line(tail: str, width: int = 160) -> str | None:
    """The line of a log's tail that says what went wrong: the last error line not from a launcher's wrapper."""
    lines = [line.strip() for line in tail.splitlines()]
    found = [line for line in lines if _ERROR_LINE.match(line) and not any(w in line for w in _WRAPPERS)]
    if not found:
        return None
    line = found[-1]
    return line if len(line) <= width else line[:width - 1] + "…"


def collected_run_ids(root: Path) -> list[str]:
    """Every run with a manifest under root, newest first."""
    try:
        return sorted((p.name for p in root.iterdir() if (p / MANIFEST).is_file()), reverse=True)
    except OSError:
        return []
