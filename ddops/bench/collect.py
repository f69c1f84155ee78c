"""Collecting a run: result files to results/<run-id>/<host>/ (sha256-checked, resumable) and a provenance manifest;
then reading them back, through the safe loader and the summarizers, as rows for the report.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

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
    commands = []
    for run in spec.get("runs") or []:
        rec = records.get(run.get("index"), {})
        commands.append({"index": run.get("index"), "label": run.get("label"), "command": run.get("command"),
                         "env": run.get("env") or {}, "params": run.get("params") or {},
                         "status": rec.get("status"), "exit_code": rec.get("exit_code"), "signal": rec.get("signal"),
                         "started": rec.get("started"), "ended": rec.get("ended"), "seconds": rec.get("seconds"),
                         **({"slurm": rec["slurm"]} if rec.get("slurm") else {})})
    return {
        "host": host.name, "address": host.address, "hostname": prov.get("hostname"),
        "run_id": listing.get("run_id"), "plan": spec.get("plan"), "summarizer": spec.get("summarizer"),
        **({"metrics": spec["metrics"]} if spec.get("metrics") else {}),
        "results": spec.get("results"), "status": state.get("status"),
        "gpu": {"model": prov.get("gpu_model"), "count": prov.get("gpu_count"), "driver": prov.get("gpu_driver")},
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
    }


def write_manifest(root: Path, run_id: str, entries: Mapping[str, Mapping[str, Any]]) -> Path:
    """results/<run-id>/manifest.json: per-host provenance (host -> entry), merged with what earlier collects wrote."""
    path = root / run_id / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"run_id": run_id, "hosts": {}}
    if path.is_file():
        try:
            old = json.loads(path.read_text())
            if isinstance(old, dict) and isinstance(old.get("hosts"), dict):
                doc = old
        except ValueError:
            pass
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


def load_collected(root: Path, run_ids: Sequence[str]) -> tuple[list[Any], list[str]]:
    """(Labeled summaries, problems): every collected result file of these runs through its summarizer."""
    from ddops.bench.report import CodeId, Labeled
    from ddops.bench.results import summarize_file
    from ddops.bench.runs import RUNNING_STATUSES, RunStatus
    from ddops.bench.summary import ResultFileError

    items: list[Any] = []
    problems: list[str] = []
    for run_id in run_ids:
        doc = read_manifest(root, run_id)
        for host, entry in doc["hosts"].items():
            summarizer = entry.get("summarizer") or doc.get("summarizer") or "ddtree"
            code = CodeId.from_manifest(entry)
            # Collected while still going: the rows so far, marked, since more results (and repeats) may come.
            incomplete = RunStatus.of(entry.get("status")) in RUNNING_STATUSES
            for f in entry.get("files") or []:
                try:
                    local = (root / run_id / host).joinpath(*safe_relpath(f["path"]).parts)
                except DdopsError as exc:
                    problems.append(f"{host}: {exc}")
                    continue
                label = _label_for(f["path"], entry.get("commands") or [])
                run_label = label if len(run_ids) == 1 else f"{run_id}:{label}"
                try:
                    summaries = summarize_file(local, summarizer, metrics=entry.get("metrics"))
                except ResultFileError as exc:
                    problems.append(f"{host}: {exc}")
                    continue
                items.extend(Labeled(host, run_label, s, code=code, incomplete=incomplete, run_id=run_id)
                             for s in summaries)
            problems.extend(f"{host}: {line}" for line in slurm_task_problems(entry))
    return items, problems


def collected_run_ids(root: Path) -> list[str]:
    """Every run with a manifest under root, newest first."""
    try:
        return sorted((p.name for p in root.iterdir() if (p / MANIFEST).is_file()), reverse=True)
    except OSError:
        return []


def slurm_task_problems(entry: Mapping[str, Any]) -> list[str]:
    """What the report says about a Slurm run's tasks that did not finish their work (their rows are missing)."""
    if entry.get("executor") != "slurm":
        return []
    from ddops.bench.slurm import FAILED_STATUSES

    out = []
    for c in entry.get("commands") or []:
        slurm = c.get("slurm") or {}
        if c.get("status") in FAILED_STATUSES or c.get("status") in ("cancelled", "pending", "running", "unknown"):
            out.append(f"{c.get('label')}: Slurm task {slurm.get('array_job_id')}_{c.get('index')} "
                       f"{slurm.get('detail') or c.get('status')}: no result from it")
    return out
