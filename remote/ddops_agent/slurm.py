"""ddops agent extension: bench runs submitted to Slurm as one job array, from the cluster's login node.

The run directory is the bare executor's (<repo>/.ddops/runs/<run-id>/, on the filesystem the compute nodes share);
Slurm runs it. The agent only calls Slurm's own commands (sbatch, squeue, scontrol, sacct, scancel; no shell) and
returns their output as text: the controller parses it (ddops/bench/slurm.py).

Verbs (payloads carry `repo`, `run_id`, and `slurm_conf` when the cluster's slurm.conf is not the default one):
  slurm_submit {repo, run_id, spec, sbatch_args, script}  run dir + `sbatch --parsable` -> {job_id, run_dir, total}
  slurm_task   {repo, run_id}   one array task (run by the batch script on a compute node, never over ssh): records
                                task-<i>.json (node, GPU ids, times, exit), runs the command -> {exit_code}
  slurm_poll   {repo, run_id, offset, max_bytes}  the tasks' output merged into `log` + the job's state as text
  slurm_stop   {repo, run_id, tasks?}  scancel the job, or only the given array tasks
  slurm_files  {repo, run_id}   bench_files' listing plus the job's state as text
A Slurm run directory holds, besides spec.json and results/: job.sh (the batch script), slurm.json (job id, sbatch
options), task-request.json, bootstrap.py + agent.bundle (the shipped agent, for the tasks), task-<i>.out (each
task's output, written by Slurm), task-<i>.json (each task's own record), log (the task outputs merged, a `[i] `
prefix per line) and log-merge.json (how far each is)."""

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time

from ddops_agent.bench import (DEFAULT_POLL_BYTES, MAX_POLL_BYTES, SERVER_FAILED_EXIT_CODE, bench_files, initial_state,
                               log_size, open_new_run, open_run, parse_spec, read_json_file, read_log_range,
                               require_run_id, write_json_file)
from ddops_agent.files import atomic_write, open_repo, write_all
from ddops_agent.journal import now_iso
from ddops_agent.procs import RUN_TAG_DIR, RUN_TAG_ID, signal_quietly
from ddops_agent.protocol import (AgentFault, b64_text, bad_request, optional_number, optional_str, require_list,
                                  require_str, shipped_bundle, verb)
from ddops_agent.servers import PORT_ENV, Servers

SLURM_COMMAND_TIMEOUT = 30
SLURM_SQUEUE_FORMAT = "%i|%F|%K|%T|%r|%N"
SLURM_SACCT_FIELDS = "JobID,State,ExitCode,NodeList"
SLURM_TAIL_BYTES = 4096


def slurm_env(payload):
    """Our environment, with SLURM_CONF when the payload names the cluster's slurm.conf."""
    env = dict(os.environ)
    conf = optional_str(payload, "slurm_conf")
    if conf:
        env["SLURM_CONF"] = os.path.expanduser(conf)
    return env


def slurm_run(argv, env, cwd=None):
    """{rc, stdout, stderr} of one Slurm command (rc 127 when it is not installed, 124 when it hung)."""
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=SLURM_COMMAND_TIMEOUT)
    except FileNotFoundError:
        return {"rc": 127, "stdout": "", "stderr": "%s: not found on this host (is it a Slurm login node?)" % argv[0]}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": "%s: no answer within %ds" % (argv[0], SLURM_COMMAND_TIMEOUT)}
    return {"rc": done.returncode, "stdout": done.stdout.decode("utf-8", "replace"),
            "stderr": done.stderr.decode("utf-8", "replace")[-2000:]}


def slurm_job(run_dir):
    """slurm.json of a run, or fault `not_slurm` when the run was not submitted to Slurm."""
    job = read_json_file(os.path.join(run_dir, "slurm.json"))
    if job is None or not job.get("job_id"):
        raise AgentFault("not_slurm", "bench run %s was not submitted to Slurm (no job id in %s)"
                         % (os.path.basename(run_dir), run_dir))
    return job


@verb("slurm_submit", interrupt=False)
def slurm_submit(payload):
    """Create the run directory, write the batch script and submit it as one job array."""
    repo = open_repo(payload)
    run_id = require_run_id(payload)
    spec = parse_spec(payload)
    args = require_list(payload, "sbatch_args")
    if not all(isinstance(a, str) and a.startswith("-") for a in args):
        raise bad_request("sbatch_args must be options (strings starting with '-')")
    script = require_str(payload, "script")
    # 0755: Slurm writes the tasks' output here as the submitting user, possibly from another host.
    run_dir, spec, env = open_new_run(repo, run_id, spec, 0o755, executor="slurm")
    state = initial_state(run_id, spec)
    state.update({"status": "submitted", "executor": "slurm"})
    write_json_file(os.path.join(run_dir, "state.json"), state)
    shipped = shipped_bundle()
    if shipped is None:
        raise bad_request("slurm_submit needs the shipped agent bundle (run it through the bootstrap)")
    bundle, bootstrap = shipped
    # Each array task runs this agent again from these files (ddops/bench/slurm.py TASK_BOOT), on a compute node.
    atomic_write(os.path.join(run_dir, "bootstrap.py"), bootstrap.encode("utf-8"), 0o644)
    atomic_write(os.path.join(run_dir, "agent.bundle"), bundle, 0o644)
    request = {"verb": "slurm_task", "payload": {"repo": repo, "run_id": run_id}}
    atomic_write(os.path.join(run_dir, "task-request.json"), json.dumps(request).encode("utf-8"), 0o644)
    script_path = os.path.join(run_dir, "job.sh")
    atomic_write(script_path, script.encode("utf-8"), 0o755)
    env.update(slurm_env(payload))
    done = slurm_run(["sbatch"] + list(args) + [script_path], env, cwd=run_dir)
    job_id = done["stdout"].strip().split(";")[0]
    if done["rc"] != 0 or not job_id.isdigit():
        state.update({"status": "error", "ended": now_iso(),
                      "message": "sbatch refused the job: %s" % (done["stderr"].strip() or done["stdout"].strip())})
        write_json_file(os.path.join(run_dir, "state.json"), state)
        raise AgentFault("slurm", "sbatch refused the job (exit %d): %s"
                         % (done["rc"], (done["stderr"].strip() or done["stdout"].strip())[-1000:]))
    write_json_file(os.path.join(run_dir, "slurm.json"),
                    {"job_id": job_id, "submitted": now_iso(), "sbatch_args": list(args),
                     "slurm_conf": env.get("SLURM_CONF"), "total": len(spec["runs"])})
    return {"run_id": run_id, "run_dir": run_dir, "job_id": job_id, "total": len(spec["runs"]),
            "result_dir": os.path.join(run_dir, "results")}


# -- one array task (on the compute node) -------------------------------------------------------------------------


@verb("slurm_task", bounded=False)
def slurm_task(payload):
    """Run this array task's command, recording node, GPU ids, start, end and exit in task-<index>.json."""
    repo, run_id, run_dir = open_run(payload)
    spec = read_json_file(os.path.join(run_dir, "spec.json"))
    if spec is None:
        raise AgentFault("no_run", "bench run %s has no readable spec.json" % run_id)
    text = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    if not text.isdigit() or int(text) >= len(spec["runs"]):
        raise bad_request("SLURM_ARRAY_TASK_ID %r is not a task of this run" % text)
    index = int(text)
    run = spec["runs"][index]
    record_path = os.path.join(run_dir, "task-%d.json" % index)
    record = {"index": index, "label": run.get("label"), "job_id": os.environ.get("SLURM_JOB_ID"),
              "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"), "array_index": index,
              "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "slurm_job_gpus": os.environ.get("SLURM_JOB_GPUS"), "pid": os.getpid(), "started": now_iso(),
              "ended": None, "exit_code": None, "signal": None, "seconds": None}
    write_json_file(record_path, record)
    out = sys.__stdout__
    out.write("=== ddops task %d/%d: %s | job %s_%d on %s | CUDA_VISIBLE_DEVICES=%s | %s ===\n$ %s\n" % (
        index + 1, len(spec["runs"]), record["label"], record["array_job_id"], index, record["node"],
        record["cuda_visible_devices"], record["started"], run["command"]))
    out.flush()
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    env.update(run.get("env") or {})
    env.update({"HF_HUB_OFFLINE": "1", RUN_TAG_ID: run_id, RUN_TAG_DIR: run_dir, "DDOPS_RUN_INDEX": str(index)})
    workdir = os.path.realpath(os.path.join(repo, spec.get("workdir") or "."))
    started = time.monotonic()
    children = []

    def forward(number, frame):
        # scancel and the time limit signal the whole step; pass it on in case the command (or the server, in a
        # session of its own) shields itself.
        for pid in children:
            signal_quietly(pid, number)
        if servers.current is not None:
            signal_quietly(servers.current.process.pid, number, group=True)

    def write(text):
        out.write(text)
        out.flush()

    # Each task its own server (tasks may run at once, on other nodes): task-<i>-server-1.
    servers = Servers(run_id, run_dir, workdir, record, lambda: write_json_file(record_path, record), write,
                      prefix="task-%d-" % index)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, forward)
    try:
        port, problem = servers.ensure(run.get("server"), env, lambda: os.path.exists(os.path.join(run_dir, "stop")))
        if problem is None:
            if port is not None:
                env[PORT_ENV] = str(port)
            child = subprocess.Popen(["/bin/sh", "-c", run["command"]], cwd=workdir, env=env,
                                     stdin=subprocess.DEVNULL, stdout=out.fileno(), stderr=subprocess.STDOUT,
                                     close_fds=True)
            children.append(child.pid)
            code = child.wait()
        else:
            write("=== ddops task %d not run: %s ===\n" % (index, problem))
            code = SERVER_FAILED_EXIT_CODE
    finally:
        servers.stop()
    signal_number = -code if code < 0 else None
    exit_code = 128 + signal_number if signal_number else code
    record.update({"ended": now_iso(), "exit_code": exit_code, "signal": signal_number,
                   "seconds": round(time.monotonic() - started, 3)})
    write_json_file(record_path, record)
    out.write("\n=== ddops task %d/%d %s: exit %d after %.1fs ===\n" % (
        index + 1, len(spec["runs"]), "ok" if exit_code == 0 else "failed", exit_code, record["seconds"]))
    out.flush()
    return {"exit_code": exit_code}


# -- reading a run ------------------------------------------------------------------------------------------------


def task_records(run_dir, total):
    """{index: task-<index>.json} for the tasks that have started."""
    records = {}
    for index in range(total):
        record = read_json_file(os.path.join(run_dir, "task-%d.json" % index))
        if record is not None:
            records[str(index)] = record
    return records


def slurm_query(payload, run_dir):
    """The job as Slurm's commands print it (squeue, scontrol, sacct or its completion log) and the task records."""
    job = slurm_job(run_dir)
    spec = read_json_file(os.path.join(run_dir, "spec.json")) or {}
    job_id = str(job["job_id"])
    env = slurm_env(payload)
    if not optional_str(payload, "slurm_conf") and job.get("slurm_conf"):
        env["SLURM_CONF"] = job["slurm_conf"]
    total = len(spec.get("runs") or [])
    # Each query says which fields it asked for: the controller reads the columns by them (one home: here).
    queries = {
        "squeue": dict(slurm_run(["squeue", "--noheader", "--array", "--jobs=" + job_id,
                                  "--format=" + SLURM_SQUEUE_FORMAT], env), format=SLURM_SQUEUE_FORMAT),
        "scontrol": slurm_run(["scontrol", "show", "job", job_id, "--oneliner"], env),
        "sacct": dict(slurm_run(["sacct", "--noheader", "--parsable2", "--jobs=" + job_id,
                                 "--format=" + SLURM_SACCT_FIELDS], env), format=SLURM_SACCT_FIELDS),
    }
    if queries["sacct"]["rc"] != 0:
        # Without an accounting database: the job completion log still has every ended task (by its own job id).
        queries["sacct_completions"] = dict(slurm_run(["sacct", "--completion", "--noheader", "--parsable2",
                                                       "--format=" + SLURM_SACCT_FIELDS], env),
                                            format=SLURM_SACCT_FIELDS)
    return {"job_id": job_id, "total": total, "labels": [r.get("label") or "run %d" % i
                                                        for i, r in enumerate(spec.get("runs") or [])],
            "queries": queries, "records": task_records(run_dir, total), "submitted": job.get("submitted")}


def task_tails(run_dir, total):
    """{index: the last SLURM_TAIL_BYTES of task-<index>.out} for every task that wrote output."""
    tails = {}
    for index in range(total):
        path = os.path.join(run_dir, "task-%d.out" % index)
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        tails[str(index)] = read_log_range(path, max(0, size - SLURM_TAIL_BYTES), None).decode("utf-8", "replace")
    return tails


def merge_task_logs(run_dir, total, final_lines):
    """Append the tasks' new whole lines to `log`, each prefixed `[i] `; with final_lines also a last partial one.

    Under a lock, so two followers never copy the same bytes twice; how far each task file was copied is kept in
    log-merge.json, written after the log grew (a crash in between copies some lines again, never loses any)."""
    lock = os.open(os.path.join(run_dir, "log-merge.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marks_path = os.path.join(run_dir, "log-merge.json")
        marks = read_json_file(marks_path, {}) or {}
        chunks = []
        for index in range(total):
            path = os.path.join(run_dir, "task-%d.out" % index)
            start = int(marks.get(str(index), 0))
            data = read_log_range(path, start, None)
            if not data:
                continue
            cut = len(data) if final_lines else data.rfind(b"\n") + 1
            if cut <= 0:
                continue
            prefix = ("[%d] " % index).encode("ascii")
            lines = data[:cut].split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            chunks.append(b"".join(prefix + line + b"\n" for line in lines))
            marks[str(index)] = start + cut
        if chunks:
            fd = os.open(os.path.join(run_dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                write_all(fd, b"".join(chunks))
            finally:
                os.close(fd)
            write_json_file(marks_path, marks)
    finally:
        os.close(lock)


@verb("slurm_poll")
def slurm_poll(payload):
    """The job's state (as text) and the merged task output from byte `offset` on (at most max_bytes)."""
    repo, run_id, run_dir = open_run(payload)
    slurm = slurm_query(payload, run_dir)
    live = slurm["queries"]["squeue"]["stdout"].strip()
    merge_task_logs(run_dir, slurm["total"], final_lines=not live)
    offset = int(optional_number(payload, "offset", 0))
    limit = int(min(optional_number(payload, "max_bytes", DEFAULT_POLL_BYTES), MAX_POLL_BYTES))
    size = log_size(run_dir)
    offset = min(offset, size)
    data = read_log_range(os.path.join(run_dir, "log"), offset, min(size, offset + limit))
    spec = read_json_file(os.path.join(run_dir, "spec.json")) or {}
    return {"run_id": run_id, "slurm": slurm, "log_b64": b64_text(data), "offset": offset + len(data),
            "log_size": size, "tails": task_tails(run_dir, slurm["total"]), "plan": spec.get("plan"),
            "created": spec.get("launched"), "run_dir": run_dir}


@verb("slurm_stop", interrupt=False)
def slurm_stop(payload):
    """scancel the run's job (every task), or only the array tasks listed in `tasks`."""
    repo, run_id, run_dir = open_run(payload)
    job = slurm_job(run_dir)
    tasks = payload.get("tasks") or []
    if not isinstance(tasks, list) or not all(isinstance(t, int) and t >= 0 for t in tasks):
        raise bad_request("tasks must be a list of array indexes")
    env = slurm_env(payload)
    if not optional_str(payload, "slurm_conf") and job.get("slurm_conf"):
        env["SLURM_CONF"] = job["slurm_conf"]
    # scancel of a task that has ended succeeds silently: ask squeue what is still queued or running first.
    live = slurm_run(["squeue", "--noheader", "--array", "--jobs=" + str(job["job_id"]), "--format=%K"], env)
    if live["rc"] == 0:
        indexes = set(int(word) for word in live["stdout"].split() if word.isdigit())
        if not indexes or (tasks and not indexes & set(tasks)):
            return {"run_id": run_id, "job_id": job["job_id"], "cancelled": [], "already_ended": True}
        tasks = [t for t in tasks if t in indexes]
    targets = ["%s_%d" % (job["job_id"], t) for t in tasks] or [str(job["job_id"])]
    done = slurm_run(["scancel"] + targets, env)
    if done["rc"] != 0:
        raise AgentFault("slurm", "scancel %s failed (exit %d): %s" % (" ".join(targets), done["rc"],
                                                                     done["stderr"].strip()))
    if not tasks:
        atomic_write(os.path.join(run_dir, "stop"), now_iso().encode("utf-8"), 0o600)
    return {"run_id": run_id, "job_id": job["job_id"], "cancelled": targets}


@verb("slurm_files")
def slurm_files(payload):
    """bench_files' listing of the run's results, with the job's state (as text) and every task's output tail."""
    repo, run_id, run_dir = open_run(payload)
    listing = bench_files(payload)
    listing["slurm"] = slurm_query(payload, run_dir)
    listing["tails"] = task_tails(run_dir, listing["slurm"]["total"])
    return listing
