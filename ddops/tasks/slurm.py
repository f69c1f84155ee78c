"""Slurm as a bench executor, per host: submit a plan's runs as one job array from the login node, and answer the
bare executor's bench_* questions (poll, status, stop, files) for a Slurm run through the agent's slurm_* verbs,
so that following, status, stop and collect work on either executor alike. The parsing is in ddops/bench/slurm.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddops.bench.plan import BenchPlan, expand_runs
from ddops.bench.runs import LaunchReport
from ddops.bench.slurm import SlurmOptions, SlurmQuery, batch_script, build_state, failure_indexes, sbatch_args
from ddops.errors import UsageError
from ddops.fleet import CHANGED, TaskOutcome
from ddops.inventory import Host

SLURM = "slurm"


def is_slurm(host: Host) -> bool:
    return getattr(host, "executor", "bare") == SLURM


def options_of(host: Host) -> SlurmOptions:
    return getattr(host, "slurm", None) or SlurmOptions()


def _conf(host: Host) -> dict[str, str]:
    conf = options_of(host).conf
    return {"slurm_conf": conf} if conf else {}


def gres_gpus(gres: str | None) -> int | None:
    """GPUs per task from a gres like `gpu:2`, `gpu:h200:2` or `gpu` (1); None when it asks for no GPU."""
    for item in (gres or "").split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return None


def submit(plan: BenchPlan, run_id: str, host: Host, session: Any, facts: Mapping[str, Any],
           states: Mapping[str, str], values: dict[str, Any], spec_of: Any) -> TaskOutcome:
    """Submit the plan's runs (preconditions already checked) as one job array; `spec_of(runs)` builds spec.json."""
    options = options_of(host)
    if "gpus" not in host.vars:
        # The login node has no GPUs to count: a task gets what its gres asks for.
        values = {**values, "gpus": gres_gpus(options.gres) or 0}
    run_dir = f"{facts['repo_real']}/.ddops/runs/{run_id}"
    runs = expand_runs(plan, values, result_dir=f"{run_dir}/results")
    spec = spec_of(runs)
    args = sbatch_args(options, run_id=run_id, total=len(runs), run_dir=run_dir, plan_minutes=plan.timeout_minutes)
    result = session.call_agent("slurm_submit", {"repo": host.repo, "run_id": run_id, "spec": spec,
                                                 "sbatch_args": args, "script": batch_script(host.python, run_dir,
                                                                                             run_id), **_conf(host)})
    n = len(runs)
    return TaskOutcome(CHANGED, f"submitted {n} run{'s' if n != 1 else ''} as Slurm job array {result['job_id']}",
                       LaunchReport(run_id, n, result.get("run_dir"), dict(states), job_id=result["job_id"],
                                    executor=SLURM))


# --- the bench_* answers of a Slurm run -------------------------------------------------------------------------------


def _state(host: Host, result: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(state.json-shaped state, {index: output tail} of the tasks that failed or were cancelled)."""
    query = SlurmQuery.from_result(result)
    tasks = query.tasks()
    labels = list(query.labels) + [f"run {i}" for i in range(len(query.labels), query.total)]
    state = build_state(str(result.get("run_id") or ""), query.job_id, labels, tasks, query.records,
                        plan=result.get("plan") or (result.get("spec") or {}).get("plan"),
                        created=result.get("created") or (result.get("spec") or {}).get("launched"), host=host.name)
    tails = result.get("tails") or {}
    failures = {str(i): tails[str(i)] for i in failure_indexes(tasks) if str(i) in tails}
    return state, failures


def bench_call(host: Host, session: Any, verb: str, payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """`session.call_agent(verb, payload)` for a bench_* verb, on either executor: a Slurm host's answer is built
    from its slurm_* verb and has the same shape (state, failures, log offsets ...)."""
    if not is_slurm(host):
        return session.call_agent(verb, payload, **kwargs)
    payload = {**payload, **_conf(host)}
    if verb in ("bench_poll", "bench_status"):
        if verb == "bench_status":
            payload = {**payload, "offset": 0, "max_bytes": 0}
        result = dict(session.call_agent("slurm_poll", payload, **kwargs))
        result["state"], result["failures"] = _state(host, result)
        return result
    if verb == "bench_stop":
        tasks = payload.pop("tasks", None) or []
        result = session.call_agent("slurm_stop", {k: v for k, v in payload.items() if k != "grace"}
                                    | {"tasks": list(tasks)}, **kwargs)
        ended = bool(result.get("already_ended"))
        return {**result, "status": "ended" if ended else "stopped", "killed": [], "remaining": [],
                "already_ended": ended}
    if verb == "bench_files":
        result = dict(session.call_agent("slurm_files", payload, **kwargs))
        result["state"], result["failures"] = _state(host, result)
        return result
    return session.call_agent(verb, payload, **kwargs)


def check_tasks_option(hosts: Sequence[Host], tasks: Sequence[int]) -> None:
    """`bench stop --task N` cancels single array tasks: only a Slurm run has them."""
    if tasks and not all(is_slurm(h) for h in hosts):
        bare = ", ".join(h.name for h in hosts if not is_slurm(h))
        raise UsageError(f"--task cancels single Slurm array tasks; {bare} run{'s' if ',' not in bare else ''} "
                         "bare (stop the whole run there)")


def describe_task(slurm: Mapping[str, Any] | None) -> str:
    """`job 42_3 on node7, GPUs 0` for a run's Slurm details."""
    if not slurm:
        return ""
    text = f"job {slurm.get('array_job_id')}_{slurm.get('array_index')}"
    if slurm.get("node"):
        text += f" on {slurm['node']}"
    gpus = slurm.get("slurm_job_gpus") or slurm.get("cuda_visible_devices")
    if gpus:
        text += f", GPUs {gpus}"
    return text

