"""Before a bench plan runs on a host: finding the plan, what the host's facts and patch states say against it,
and the spec.json its runner works from. Pure: ddops/tasks/bench.py asks the hosts and launches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ddops
from ddops.bench.environment import transformers_verdict, unmet
from ddops.bench.gpus import gpu_issues, gpu_state
from ddops.bench.plan import BenchPlan, RunSpec, check_host, load_bench_plan
from ddops.errors import DdopsError, PlaybookError
from ddops.inventory import Host, Inventory
from ddops.patching.journal import JournalState, active_applications, patch_state
from ddops.patching.kinds import PatchState
from ddops.patching.playbook import find_named, search_path
from ddops.pins import Pin
from ddops.yamlsrc import suggest

# --- plans ---------------------------------------------------------------------------------------------------------


def plan_dirs(inventory: Inventory | None = None) -> tuple[Path, ...]:
    """Where bare plan names are looked up: as playbooks (the inventory's playbook_dirs, $DDOPS_PLAYBOOK_PATH, the
    built-ins)."""
    return search_path(inventory.playbook_dirs if inventory is not None else ())


def resolve_plan_path(name_or_path: str, search_dirs: Iterable[Path] | None = None) -> Path:
    """A bare name -> `<builtin dir>/<name>.yaml`; anything path-like -> that path."""
    if "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")) or name_or_path.startswith("."):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise PlaybookError(f"{name_or_path}: no such bench plan file")
        return path
    dirs = list(search_dirs if search_dirs is not None else plan_dirs())
    found = find_named(name_or_path, dirs)
    if found is not None:
        return found
    known = [p.stem for d in dirs for p in sorted(d.glob("*.yaml")) if p.stem.endswith("bench")]
    raise PlaybookError(f"no bench plan named '{name_or_path}' (looked in {', '.join(map(str, dirs))})"
                        f"{suggest(name_or_path, known)}")


def load_plan(name_or_path: str, inventory: Inventory | None = None) -> BenchPlan:
    return load_bench_plan(resolve_plan_path(name_or_path, plan_dirs(inventory)))


def list_plans(inventory: Inventory | None = None) -> list[tuple[str, str]]:
    """(name, description) of every bench plan where bare names are looked up, first of each name only."""
    found: dict[str, str] = {}
    for d in plan_dirs(inventory):
        for path in sorted(Path(d).glob("*.y*ml")):
            if path.stem in found or path.suffix not in (".yaml", ".yml"):
                continue
            try:
                plan = load_bench_plan(path)
            except DdopsError:
                continue  # a patch playbook, or a plan `playbook lint` would name the fault of
            found[path.stem] = " ".join((plan.description or "").split())
    return list(found.items())


# --- patch states --------------------------------------------------------------------------------------------------


def journal_applications(facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Patches the journal says are in place: [{patch, file, before, after, current, time, state}]."""
    journal = facts.get("journal") or []
    shas = facts.get("journal_files") or {}
    try:
        active = active_applications(journal)
    except DdopsError:
        return []
    out = []
    for a in active:
        current = shas.get(a.file)
        out.append({"patch": a.patch, "file": a.file, "before": a.before, "after": a.after, "current": current,
                    "time": a.time, "state": patch_state(journal, a.patch, a.file, current)})
    return out


def patch_states_from_journal(patch_ids: Sequence[str], facts: Mapping[str, Any]) -> dict[str, JournalState]:
    """patch id -> applied | modified | not-applied, from the journal alone (no re-planning)."""
    apps = journal_applications(facts)
    out: dict[str, JournalState] = {}
    for pid in patch_ids:
        mine = [a for a in apps if a["patch"] == pid]
        if not mine:
            out[pid] = JournalState.NOT_APPLIED
        elif all(a["state"] == JournalState.APPLIED for a in mine):
            out[pid] = JournalState.APPLIED
        else:
            out[pid] = next(a["state"] for a in mine if a["state"] != JournalState.APPLIED)
    return out


# --- preconditions -------------------------------------------------------------------------------------------------


def host_values(host: Host, facts: Mapping[str, Any]) -> dict[str, Any]:
    """What the plan's templates see: gpus from the facts (an inventory `vars: {gpus: N}` wins), the host's vars,
    and its name, repo and python."""
    return {"gpus": len(facts.get("gpus") or []), **dict(host.vars), "host": host.name, "repo": host.repo,
            "python": host.python}


def preflight_problems(plan: BenchPlan, host: Host, facts: Mapping[str, Any],
                       patch_states: Mapping[str, str], pin: Pin | None = None) -> list[str]:
    """Why this host cannot run the plan now (empty when it can).

    `pin` is the host's pin as the controller resolved it (ddops/pins.py): a branch means the commit the clone or
    the remote names, never what the host's own, possibly stale, branch says."""
    if not facts.get("repo_exists"):
        return [f"repo {host.repo} is not there (run `ddops sync` first)"]
    problems: list[str] = []
    if host.commit:
        head = facts.get("git_commit")
        pinned = pin.commit if pin is not None else facts.get("commit_resolved")
        shown = pin.described if pin is not None else host.commit
        if pin is not None and pin.error:
            problems.append(f"pin {host.commit!r}: {pin.error}")
        elif head is None:
            problems.append(f"repo {host.repo} is not a git checkout, but the inventory pins commit {shown}")
        elif head != pinned and facts.get("commit_resolved") is None:
            problems.append(f"pinned commit {shown} is not in the repo (HEAD is {head[:12]}); run `ddops sync`")
        elif head != pinned:
            problems.append(f"repo is at {head[:12]}, not at the pinned commit {shown}; run `ddops sync`")
    for other in facts.get("active_runs") or []:
        problems.append(f"bench run {other.get('run_id')} is still {other.get('status')} here "
                        f"({other.get('done')}/{other.get('total')} done): wait for it, or "
                        f"`ddops bench stop {other.get('run_id')}`")
    not_applied = {p: s for p, s in patch_states.items() if s != PatchState.APPLIED}
    disk = facts.get("disk_free_bytes")
    gpus = facts.get("gpus") or []
    problems += [p for p in check_host(plan, gpus=len(gpus), free_disk_gb=None if disk is None else disk / 1e9,
                                       applied_patches=None)]
    if plan.gpus and len(gpus) < plan.gpus and facts.get("gpu_error"):
        problems.append(f"nvidia-smi: {facts['gpu_error']}")
    if not_applied:
        listed = ", ".join(f"{p} ({s})" for p, s in not_applied.items())
        problems.append(f"required patches not applied: {listed}; run `ddops patch {' '.join(not_applied)}`")
    return problems


# --- the host's environment and GPUs ----------------------------------------------------------------------------


def facts_request(plan: BenchPlan, host: Host) -> dict[str, Any]:
    """What the preflight asks the agent beyond the plain facts: the versions of the plan's packages (read with the
    host's python, the one `{python}` runs) and the GPUs' health where the plan uses GPUs on this host."""
    return {"packages": [name for name, _ in plan.requires_packages],
            "gpu_health": plan.gpus > 0 and host.executor != "slurm"}


@dataclass(frozen=True, slots=True)
class EnvironmentCheck:
    """What the host's Python packages and GPUs say against a launch: refusals, warnings, and what was seen."""

    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seen: tuple[str, ...] = ()


def environment_check(plan: BenchPlan, host: Host, facts: Mapping[str, Any], playbooks: Iterable[str] = (), *,
                      allow_busy_gpus: bool = False) -> EnvironmentCheck:
    """The plan's packages against the host's versions (refused when unmet), the transformers the hybrid playbooks
    were tested with (`playbooks`: the names of those the plan's patches come from; untested is a warning), and
    each GPU's health where the plan uses GPUs (busy or unhealthy: refused, unless --allow-busy-gpus or the plan's
    `allow_busy_gpus`; a Slurm login node's GPUs are not the ones a job gets)."""
    versions = facts.get("versions") or {}
    refusals = unmet(plan.requires_packages, versions, facts.get("python_executable") or host.python)
    warnings: list[str] = []
    seen: list[str] = []
    verdict = transformers_verdict(playbooks, versions)
    if verdict is not None:
        (seen if verdict[0] else warnings).append(verdict[1])
    if plan.gpus > 0 and host.executor != "slurm":
        issues = [str(i) for i in gpu_issues(facts)]
        if allow_busy_gpus or plan.allow_busy_gpus:
            warnings += issues
        elif issues:
            refusals.append("; ".join(issues) + " (--allow-busy-gpus runs anyway)")
    return EnvironmentCheck(tuple(refusals), tuple(warnings), tuple(seen))


# --- the run spec -----------------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def run_spec(plan: BenchPlan, host: Host, runs: Sequence[RunSpec], provenance: Mapping[str, Any], *,
             actor: str) -> dict[str, Any]:
    """The spec.json a host's runner works from: commands, env and matrix params per run, and provenance."""
    return {
        "plan": plan.name, "plan_path": str(plan.path), "host": host.name, "workdir": plan.workdir,
        "results": plan.results, "summarizer": plan.summarizer, "timeout_s": plan.timeout_minutes * 60,
        **({"metrics": dict(plan.metrics)} if plan.metrics else {}),
        "env": {}, "python": host.python, "ddops_version": ddops.__version__, "actor": actor,
        "runs": [{"index": r.index, "label": r.label, "command": r.command, "env": dict(r.env),
                  "params": {k: _jsonable(v) for k, v in r.params.items()},
                  **({"server": r.server.to_json()} if r.server else {})} for r in runs],
        "provenance": dict(provenance),
    }


def provenance_of(facts: Mapping[str, Any], patch_states: Mapping[str, str], pin: Pin | None = None) -> dict[str, Any]:
    """What to keep about the host as it was at launch: hardware, software, commit, patches in place."""
    gpus = facts.get("gpus") or []
    versions = facts.get("versions") or {}
    return {
        "hostname": facts.get("hostname"), "os": facts.get("os"), "kernel": facts.get("kernel"),
        "arch": facts.get("arch"), "python": facts.get("python"), "python_executable": facts.get("python_executable"),
        "torch": versions.get("torch"), "transformers": versions.get("transformers"),
        "gpu_model": gpus[0].get("name") if gpus else None, "gpu_count": len(gpus),
        "gpu_driver": gpus[0].get("driver_version") if gpus else None, "gpus": gpus,
        "repo": facts.get("repo_real"), "repo_commit": facts.get("git_commit"),
        "pin": pin.described if pin is not None and pin.commit else None,
        "patches": journal_applications(facts), "required_patches": dict(patch_states),
        "gpu_state": gpu_state(facts),
    }


