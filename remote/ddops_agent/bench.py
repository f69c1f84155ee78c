"""ddops agent extension: bench runs launched detached under <repo>/.ddops/runs/<run-id>/, polled, stopped, listed.

Verbs (payloads always carry `repo`; `run_id` is a plain name: letters, digits, '.', '_', '-'):
  bench_facts  {repo, commit?, packages?, gpu_health?}  facts (as the facts verb answers them) + repo_real,
                                      commit_resolved (the pin as a full sha, or null), active_runs, journal,
                                      journal_files ({file: sha256 now})
  bench_launch {repo, run_id, spec}   create the run dir and start the runner detached -> {pid, run_dir, total}
  bench_runner {repo, run_id}         the runner itself (started by bench_launch, never over ssh)
  bench_poll   {repo, run_id, offset, max_bytes}  state + log bytes from offset -> {state, log_b64, offset, log_size}
  bench_status {repo, run_id}         state + the log tail of every failed run
  bench_stop   {repo, run_id, grace}  SIGTERM, then SIGKILL, every process of the run; state becomes stopped
  bench_list   {repo}                 every run, newest first
  bench_files  {repo, run_id, pattern?}  result files (path, real_path, sha256, size); symlinks refused, never
                                      followed (the walk does not enter a linked directory)
State statuses: starting, running, completed, failed, stopped, error, and lost (computed on read: the state says
running but the runner is gone). Run statuses: pending, running, ok, failed, timeout (exit 124), stopped.

A run directory holds: spec.json (what to run: commands, env, matrix params, provenance), state.json (status,
times, per-run exit codes and log offsets), pid (the runner's pid and start time), log (every run's output,
appended, with a header and a footer per run), exit-<index> (each run's exit code), results/ (what the commands
save), bootstrap.py + runner.in (the detached runner: the shipped bootstrap and bundle, written to disk, running
`bench_runner`),
runner.out (the runner's own output: a traceback if it ever crashes), stop (present once a stop was asked), and for a
plan with a `server:` (servers.py) server-<n>.log (each server's output) and server-<n>-guard.in/.out (its guard)."""

import datetime
import fnmatch
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from contextlib import suppress

from ddops_agent.checks import run_quiet
from ddops_agent.facts import requested_facts
from ddops_agent.files import (atomic_write, check_relpath, current_sha, file_kind, is_inside, make_private_dir,
                               open_repo, read_regular, resolve_target, write_all)
from ddops_agent.journal import ends_without_newline, ensure_state_dir, now_iso, read_journal, state_dir
from ddops_agent.procs import (RUN_TAG_DIR, RUN_TAG_ID, descendants, end_processes, group_alive, group_is_the_runs,
                               is_run_process, process_record, records_of, signal_quietly, spawn_agent, tagged_pids)
from ddops_agent.protocol import (AgentFault, b64_text, bad_request, check_deadline, describe_error, optional_number,
                                  optional_str, require_list, require_object, require_str, verb)
from ddops_agent.servers import PORT_ENV, Servers, reap_server

RUN_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
RUNS_DIR = "runs"
TERMINAL_STATUSES = ("completed", "failed", "stopped", "error", "lost")
DEFAULT_STOP_GRACE = 5.0
DEFAULT_POLL_BYTES = 256 * 1024
MAX_POLL_BYTES = 4 * 1024 * 1024
LOG_TAIL_BYTES = 4096
TIMEOUT_EXIT_CODE = 124
# A run that never started because the server it needs was not ready (servers.py): as the shell's "not executable".
SERVER_FAILED_EXIT_CODE = 126
ADDED_ENV = ("PATH", "HF_HUB_OFFLINE", RUN_TAG_ID, RUN_TAG_DIR)


# -- paths and small files --------------------------------------------------------------------------------------


def require_run_id(payload):
    """payload["run_id"], a plain name that cannot leave the runs directory."""
    run_id = require_str(payload, "run_id")
    if not re.fullmatch(RUN_ID_PATTERN, run_id) or run_id in (".", ".."):
        raise bad_request("run_id %r must be letters, digits, '.', '_' and '-'" % run_id)
    return run_id


def runs_root(repo):
    """<repo>/.ddops/runs (which may not exist)."""
    return os.path.join(state_dir(repo), RUNS_DIR)


def open_run(payload):
    """(repo, run_id, run_dir) of an existing run; fault `no_run` when it is not there."""
    repo = open_repo(payload)
    run_id = require_run_id(payload)
    run_dir = os.path.join(runs_root(repo), run_id)
    if os.path.islink(run_dir) or not os.path.isdir(run_dir):
        raise AgentFault("no_run", "no bench run %s in %s" % (run_id, repo))
    return repo, run_id, run_dir


def read_json_file(path, default=None):
    """The JSON object in `path`, or `default` when it is missing or unreadable."""
    try:
        with open(path, "rb") as handle:
            value = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return default
    return value if isinstance(value, dict) else default


def write_json_file(path, value):
    """Atomically replace `path` with `value` as JSON."""
    atomic_write(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8"), 0o600)


def utc_seconds(iso):
    """Seconds since the epoch for one of our ISO times, or None."""
    if not iso:
        return None
    try:
        parsed = datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return None
    return parsed.replace(tzinfo=datetime.timezone.utc).timestamp()


# -- launch -----------------------------------------------------------------------------------------------------


def parse_spec(payload):
    """payload["spec"] checked: {runs: [{index, label, command, env, params}], workdir, env, ...}."""
    spec = require_object(payload.get("spec"), "payload.spec")
    runs = require_list(spec, "runs", "spec")
    if not runs:
        raise bad_request("spec.runs must not be empty")
    for index, run in enumerate(runs):
        where = "spec.runs[%d]" % index
        require_object(run, where)
        require_str(run, "command", where)
        require_env(run, where)
    require_env(spec, "spec")
    workdir = optional_str(spec, "workdir", ".") or "."
    if workdir != ".":
        check_relpath(workdir)
    optional_number(spec, "timeout_s", None, "spec")
    return spec


def require_env(value, where):
    """value["env"], when there is one, maps names to strings."""
    env = value.get("env") or {}
    require_object(env, where + ".env")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise bad_request("%s.env must map names to strings" % where)


def initial_state(run_id, spec):
    """state.json as written at launch, before the runner starts."""
    return {
        "run_id": run_id, "plan": spec.get("plan"), "host": spec.get("host"), "status": "starting",
        "created": now_iso(), "started": None, "ended": None, "updated": now_iso(), "message": None,
        "total": len(spec["runs"]), "done": 0, "current": None, "runner_pid": None, "child_pid": None,
        "runs": [{"index": i, "label": run.get("label") or "run %d" % i, "status": "pending", "exit_code": None,
                  "signal": None, "started": None, "ended": None, "seconds": None, "log_start": None,
                  "log_end": None} for i, run in enumerate(spec["runs"])],
    }


def runner_environment(run_id, run_dir, spec):
    """The runner's environment: ours, the plan's, python's directory first on PATH, offline HF, run tags."""
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    python_dir = os.path.dirname(sys.executable)
    path = env.get("PATH") or os.defpath
    if python_dir and path.split(os.pathsep)[0] != python_dir:
        path = python_dir + os.pathsep + path
    env["PATH"] = path
    env["HF_HUB_OFFLINE"] = "1"
    env[RUN_TAG_ID] = run_id
    env[RUN_TAG_DIR] = run_dir
    return env


def spawn_runner(run_dir, repo, run_id, env):
    """Start `bench_runner` detached (procs.spawn_agent); returns its pid."""
    process = spawn_agent(run_dir, "runner", {"verb": "bench_runner", "payload": {"repo": repo, "run_id": run_id}}, env)
    # Keep Python from reaping (or warning about) a child we deliberately leave running.
    process.returncode = 0
    return process.pid


def create_run_dir(repo, run_id, spec, mode):
    """A new run directory (and its results/) for `spec`, whose workdir must be a directory inside the repo."""
    workdir = os.path.realpath(os.path.join(repo, spec.get("workdir") or "."))
    if not is_inside(workdir, repo) or not os.path.isdir(workdir):
        raise AgentFault("no_workdir", "workdir %s is not a directory inside %s" % (spec.get("workdir"), repo))
    make_private_dir(os.path.join(ensure_state_dir(repo), RUNS_DIR))
    run_dir = os.path.join(runs_root(repo), run_id)
    try:
        os.mkdir(run_dir, mode)
    except FileExistsError:
        raise AgentFault("run_exists", "bench run %s already exists in %s" % (run_id, repo)) from None
    os.mkdir(os.path.join(run_dir, "results"), 0o755)
    return run_dir


def open_new_run(repo, run_id, spec, mode, **recorded):
    """(run directory, spec as recorded in its spec.json, the runner's environment) of a new run: bench_launch's
    and slurm_submit's. `recorded`: more fields for spec.json."""
    run_dir = create_run_dir(repo, run_id, spec, mode)
    spec = dict(spec)
    spec.update({"run_id": run_id, "repo": repo, "launched": now_iso(), "python_executable": sys.executable})
    spec.update(recorded)
    env = runner_environment(run_id, run_dir, spec)
    # What ddops set on top of the login environment (the rest of it may hold secrets: not recorded).
    spec["runner_env"] = dict((key, env[key]) for key in sorted(set(spec.get("env") or {}) | set(ADDED_ENV)))
    write_json_file(os.path.join(run_dir, "spec.json"), spec)
    return run_dir, spec, env


@verb("bench_launch", interrupt=False)
def bench_launch(payload):
    """Create the run directory and start its runner detached; answers as soon as the runner is going."""
    repo = open_repo(payload)
    run_id = require_run_id(payload)
    spec = parse_spec(payload)
    run_dir, spec, env = open_new_run(repo, run_id, spec, 0o700)
    write_json_file(os.path.join(run_dir, "state.json"), initial_state(run_id, spec))
    with open(os.path.join(run_dir, "log"), "ab"):
        pass
    try:
        pid = spawn_runner(run_dir, repo, run_id, env)
    except BaseException as error:
        state = initial_state(run_id, spec)
        state.update({"status": "error", "ended": now_iso(), "message": "runner did not start: %s"
                      % describe_error(error)})
        write_json_file(os.path.join(run_dir, "state.json"), state)
        raise
    # Wait (briefly) for the runner to record itself, so a poll right after launch finds it.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and read_json_file(os.path.join(run_dir, "pid")) is None:
        time.sleep(0.02)
    return {"run_id": run_id, "run_dir": run_dir, "result_dir": os.path.join(run_dir, "results"), "pid": pid,
            "total": len(spec["runs"])}


# -- the runner (runs detached) ---------------------------------------------------------------------------------


class Runner:
    """Runs the spec's commands in order, recording each one's exit code and log offsets in state.json."""

    def __init__(self, repo, run_id, run_dir):
        self.repo, self.run_id, self.run_dir = repo, run_id, run_dir
        self.spec = read_json_file(os.path.join(run_dir, "spec.json"))
        if self.spec is None:
            raise AgentFault("no_run", "bench run %s has no readable spec.json" % run_id)
        self.state = read_json_file(os.path.join(run_dir, "state.json")) or initial_state(run_id, self.spec)
        self.log_path = os.path.join(run_dir, "log")
        self.workdir = os.path.realpath(os.path.join(repo, self.spec.get("workdir") or "."))
        self.timeout = self.spec.get("timeout_s")

    def save(self):
        self.state["updated"] = now_iso()
        write_json_file(os.path.join(self.run_dir, "state.json"), self.state)

    def stop_requested(self):
        return os.path.exists(os.path.join(self.run_dir, "stop"))

    def log(self, text):
        """Append one of our own lines to the log; returns the log size after it."""
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            write_all(fd, text.encode("utf-8"))
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def log_size(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def run(self):
        pid = os.getpid()
        record = process_record(pid)
        record["since"] = now_iso()
        write_json_file(os.path.join(self.run_dir, "pid"), record)
        self.state.update({"status": "running", "started": now_iso(), "runner_pid": pid})
        self.save()
        runs = self.spec["runs"]
        self.servers = Servers(self.run_id, self.run_dir, self.workdir, self.state, self.save, self.log)
        try:
            for index, run in enumerate(runs):
                if self.stop_requested():
                    break
                self.run_one(index, run)
                self.servers.keep_for(runs[index + 1].get("server") if index + 1 < len(runs) else None)
        finally:
            self.servers.stop()
        self.finish()
        return {"status": self.state["status"]}

    def run_one(self, index, run):
        record = self.state["runs"][index]
        label = record.get("label") or "run %d" % index
        header = "=== ddops run %d/%d: %s | %s ===\n$ %s\n" % (index + 1, len(self.spec["runs"]), label, now_iso(),
                                                           run["command"])
        start = self.log_size()
        record.update({"status": "running", "started": now_iso(), "log_start": start})
        self.log(("\n" if start else "") + header)
        env = dict(os.environ)
        env.update(run.get("env") or {})
        env["DDOPS_RUN_INDEX"] = str(index)
        waited = time.monotonic()
        port, problem = self.servers.ensure(run.get("server"), env, self.stop_requested)
        if problem is not None:
            self.end_run(index, record, "stopped" if self.stop_requested() else "failed", SERVER_FAILED_EXIT_CODE,
                         None, waited, "not run: %s" % problem)
            return
        if port is not None:
            env[PORT_ENV] = str(port)
            record["server"] = self.servers.current.number
        with open(self.log_path, "ab") as out:
            child = subprocess.Popen(["/bin/sh", "-c", run["command"]], cwd=self.workdir, env=env,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     close_fds=True, start_new_session=True)
        started = time.monotonic()  # the command's own time: its server's start is the server's
        # Its start time and group, so that a stop after a reboot never signals whoever has this pid by then.
        self.state.update({"current": index, "child_pid": child.pid, "child": process_record(child.pid)})
        self.save()
        timed_out = False
        try:
            code = child.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.end_group(child, grace=10)
            code = child.wait()
        # Whatever the command left running in its group (a backgrounded helper) ends with it.
        self.end_group(child, grace=0)
        signal_number = -code if code < 0 else None
        exit_code = TIMEOUT_EXIT_CODE if timed_out else (128 + signal_number if signal_number else code)
        if self.stop_requested():
            status = "stopped"
        elif timed_out:
            status = "timeout"
        else:
            status = "ok" if exit_code == 0 else "failed"
        self.end_run(index, record, status, exit_code, signal_number, started,
                     "timed out after %gs" % self.timeout if timed_out else None)

    def end_run(self, index, record, status, exit_code, signal_number, started, note):
        """Record how run `index` ended: the log's footer, exit-<index>, its record and the run's progress."""
        seconds = round(time.monotonic() - started, 3)
        footer = "=== ddops run %d/%d %s: exit %d after %.1fs%s ===\n" % (
            index + 1, len(self.spec["runs"]), status, exit_code, seconds, " (%s)" % note if note else "")
        size = self.log("\n" + footer if self.log_tail_needs_newline() else footer)
        atomic_write(os.path.join(self.run_dir, "exit-%d" % index), ("%d\n" % exit_code).encode(), 0o600)
        record.update({"status": status, "exit_code": exit_code, "signal": signal_number, "ended": now_iso(),
                       "seconds": seconds, "log_end": size})
        self.state.update({"done": self.state.get("done", 0) + 1, "child_pid": None, "child": None})
        self.save()

    def log_tail_needs_newline(self):
        try:
            return ends_without_newline(self.log_path)
        except OSError:  # an unreadable log: no earlier line to end first
            return False

    def end_group(self, child, grace):
        """SIGTERM the command's process group, then SIGKILL what is left after `grace` seconds."""
        if grace > 0:
            signal_quietly(child.pid, signal.SIGTERM, group=True)
            deadline = time.monotonic() + grace
            # poll() reaps the leader: a zombie would keep the group looking alive.
            while time.monotonic() < deadline and (child.poll() is None or group_alive(child.pid)):
                time.sleep(0.05)
        signal_quietly(child.pid, signal.SIGKILL, group=True)

    def finish(self):
        statuses = [r["status"] for r in self.state["runs"]]
        if self.stop_requested() or "stopped" in statuses:
            status = "stopped"
        elif all(s == "ok" for s in statuses):
            status = "completed"
        else:
            status = "failed"
        ended = now_iso()
        # The log's last line goes first: a follower stops reading once the state says the run has ended.
        self.log("=== ddops run %s %s at %s ===\n" % (self.run_id, status, ended))
        self.state.update({"status": status, "ended": ended, "current": None})
        self.save()


@verb("bench_runner", bounded=False)
def bench_runner(payload):
    """The detached runner itself (started by bench_launch; never called over ssh)."""
    repo, run_id, run_dir = open_run(payload)
    runner = Runner(repo, run_id, run_dir)
    try:
        return runner.run()
    except BaseException as error:
        runner.state.update({"status": "error", "ended": now_iso(), "message": describe_error(error)})
        with suppress(OSError):
            runner.save()
        raise


# -- reading a run ------------------------------------------------------------------------------------------------


def runner_alive(run_dir):
    """Whether the runner recorded in `pid` still runs (the same process: start time, group and tags)."""
    info = read_json_file(os.path.join(run_dir, "pid"))
    run_id = os.path.basename(run_dir)
    return is_run_process(info, run_id, run_dir)


def current_state(run_dir):
    """state.json, with status `lost` when it says running but its runner is gone (killed, host rebooted)."""
    state = read_json_file(os.path.join(run_dir, "state.json"))
    if state is None:
        return None
    alive = runner_alive(run_dir)
    state["runner_alive"] = alive
    if state.get("status") in ("starting", "running") and not alive:
        # A runner that has not written its pid yet is still starting; give it a moment before calling it lost.
        created = utc_seconds(state.get("created"))
        recorded = os.path.exists(os.path.join(run_dir, "pid"))
        if recorded or created is None or time.time() - created > 30:
            state["status"] = "lost"
            state["message"] = state.get("message") or "the runner is no longer running (killed, or host rebooted)"
    if state["status"] == "lost" and reap_server(os.path.basename(run_dir), state):
        # Its guard should have ended it with the runner; whatever is left of it ends now, and once.
        saved = read_json_file(os.path.join(run_dir, "state.json")) or {}
        saved["server"] = state["server"] = None
        write_json_file(os.path.join(run_dir, "state.json"), saved)
    return state


def read_log_range(path, start, end):
    """Bytes [start, end) of a file (end None: to its end)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, start))
            return handle.read() if end is None else handle.read(max(0, end - start))
    except OSError:
        return b""


def failure_tails(run_dir, state):
    """For every failed run: the last LOG_TAIL_BYTES of its own part of the log."""
    tails = {}
    log_path = os.path.join(run_dir, "log")
    for run in state.get("runs") or []:
        if run.get("status") in ("failed", "timeout") or (run.get("status") == "running"
                                                          and state.get("status") == "lost"):
            start = run.get("log_start") or 0
            end = run.get("log_end")
            data = read_log_range(log_path, start, end)
            tails[str(run.get("index"))] = data[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
    return tails


def log_size(run_dir):
    try:
        return os.path.getsize(os.path.join(run_dir, "log"))
    except OSError:
        return 0


@verb("bench_poll")
def bench_poll(payload):
    """The run's state and the log from byte `offset` on (at most max_bytes)."""
    repo, run_id, run_dir = open_run(payload)
    offset = int(optional_number(payload, "offset", 0))
    limit = int(min(optional_number(payload, "max_bytes", DEFAULT_POLL_BYTES), MAX_POLL_BYTES))
    state = current_state(run_dir)
    size = log_size(run_dir)
    offset = min(offset, size)
    data = read_log_range(os.path.join(run_dir, "log"), offset, min(size, offset + limit))
    result = {"run_id": run_id, "state": state, "log_b64": b64_text(data),
              "offset": offset + len(data), "log_size": size}
    if state is not None and state.get("status") in TERMINAL_STATUSES:
        result["failures"] = failure_tails(run_dir, state)
    return result


@verb("bench_status")
def bench_status(payload):
    """The state of one run, with the log tail of every failed run."""
    repo, run_id, run_dir = open_run(payload)
    state = current_state(run_dir)
    if state is None:
        raise AgentFault("no_run", "bench run %s has no readable state.json" % run_id)
    spec = read_json_file(os.path.join(run_dir, "spec.json")) or {}
    return {"run_id": run_id, "state": state, "failures": failure_tails(run_dir, state), "log_size": log_size(run_dir),
            "plan": spec.get("plan"), "run_dir": run_dir}


def active_runs(repo):
    """The runs of this repo still going (runner alive), as bench_list entries."""
    return [run for run in list_runs(repo) if run["status"] in ("starting", "running")]


@verb("bench_list")
def bench_list(payload):
    """Every run in the repo, newest first, each with its state summary."""
    return {"runs": list_runs(open_repo(payload))}


def list_runs(repo):
    """bench_list's entries for `repo`, newest first."""
    root = runs_root(repo)
    try:
        names = sorted(os.listdir(root), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        names = []
    runs = []
    for name in names:
        run_dir = os.path.join(root, name)
        if not re.fullmatch(RUN_ID_PATTERN, name) or os.path.islink(run_dir) or not os.path.isdir(run_dir):
            continue
        state = current_state(run_dir) or {"status": "unknown"}
        spec = read_json_file(os.path.join(run_dir, "spec.json")) or {}
        runs.append({"run_id": name, "plan": spec.get("plan"), "status": state.get("status"),
                     "done": state.get("done"), "total": state.get("total"), "created": state.get("created"),
                     "started": state.get("started"), "ended": state.get("ended")})
    return runs


# -- stop -------------------------------------------------------------------------------------------------------


def run_processes(run_id, run_dir, state):
    """{pid: record} of every process of the run: runner and command (while still the run's), every process
    carrying the run's tags, and their descendants. A recorded pid that now belongs to another process is left
    out."""
    roots = []
    for record in (read_json_file(os.path.join(run_dir, "pid")), (state or {}).get("child")):
        if is_run_process(record, run_id, run_dir):
            roots.append(record["pid"])
    tagged = tagged_pids(run_id, run_dir)
    # Below tagged processes too: one renamed by setproctitle (vLLM's engine) no longer shows its environment.
    pids = set(tagged) | set(roots) | set(descendants(roots + tagged))
    pids.discard(os.getpid())
    return records_of(pids)


def command_group(state):
    """The current command's process group, as recorded at its start (None for runs recorded without it)."""
    child = (state or {}).get("child")
    return child.get("pgid") if isinstance(child, dict) else None


def signal_command_group(pgid, run_id, run_dir, sig):
    """killpg the command's group, only while every process in it is the run's (a recycled group id is not)."""
    if group_is_the_runs(pgid, run_id, run_dir):
        signal_quietly(pgid, sig, group=True)


@verb("bench_stop", interrupt=False)
def bench_stop(payload):
    """End every process of the run (SIGTERM, then SIGKILL after `grace` s) and record it as stopped."""
    repo, run_id, run_dir = open_run(payload)
    grace = optional_number(payload, "grace", DEFAULT_STOP_GRACE)
    state = current_state(run_dir) or {}
    found = run_processes(run_id, run_dir, state)
    if state.get("status") in ("completed", "failed", "stopped", "error") and not found:
        return {"run_id": run_id, "status": state.get("status"), "killed": [], "remaining": [], "already_ended": True}
    # The runner looks for this file before every run and after each: it starts nothing more.
    atomic_write(os.path.join(run_dir, "stop"), now_iso().encode("utf-8"), 0o600)
    group = command_group(state)
    # The run's server (its processes carry the run's tags) ends with the rest.
    killed, remaining = end_processes(lambda: run_processes(run_id, run_dir, state), grace,
                                      lambda sig: signal_command_group(group, run_id, run_dir, sig), found)
    state = read_json_file(os.path.join(run_dir, "state.json")) or state
    state.pop("runner_alive", None)
    now = now_iso()
    for run in state.get("runs") or []:
        if run.get("status") == "running":
            run.update({"status": "stopped", "ended": now, "log_end": log_size(run_dir)})
            if run.get("exit_code") is None:
                run["exit_code"] = 128 + signal.SIGTERM
    state.update({"status": "stopped", "ended": now, "current": None, "child_pid": None, "child": None,
                  "server": None, "updated": now, "message": "stopped by %s" % optional_str(payload, "actor", "ddops")})
    write_json_file(os.path.join(run_dir, "state.json"), state)
    fd = os.open(os.path.join(run_dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        write_all(fd, ("\n=== ddops run %s stopped at %s ===\n" % (run_id, now)).encode("utf-8"))
    finally:
        os.close(fd)
    return {"run_id": run_id, "status": "stopped", "killed": killed, "remaining": remaining, "already_ended": False}


# -- files and provenance ---------------------------------------------------------------------------------------


def hash_file(path):
    """(sha256, size) of a regular file opened without following a symlink.

    O_NONBLOCK: opening a FIFO for reading waits for a writer, for ever (a FIFO swapped in after the listing's
    lstat); opened so, it is refused by the fstat below instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise AgentFault("not_file", "%s is %s, not a regular file" % (path, file_kind(mode)))
        while True:
            block = handle.read(1 << 20)
            if not block:
                break
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


# Entries a results pattern may visit: a listing past this is a mistake (or a trap), not a benchmark's output.
MAX_RESULT_ENTRIES = 100000


def name_matches(name, segment):
    """Whether one path component matches one pattern segment (as glob: `*` does not match a leading dot)."""
    if name.startswith(".") and not segment.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, segment)


def path_matches(parts, segments):
    """Whether path components `parts` match pattern `segments` (`**`: any number of visible directories)."""
    if not segments:
        return not parts
    if segments[0] == "**":
        return path_matches(parts, segments[1:]) or (
            bool(parts) and not parts[0].startswith(".") and path_matches(parts[1:], segments))
    return bool(parts) and name_matches(parts[0], segments[0]) and path_matches(parts[1:], segments[1:])


def may_lead_to_match(parts, segments):
    """Whether something below directory `parts` could match `segments` (else the walk does not enter it)."""
    if not parts:
        return True
    if not segments:
        return False
    if segments[0] == "**":
        return may_lead_to_match(parts, segments[1:]) or (
            not parts[0].startswith(".") and may_lead_to_match(parts[1:], segments))
    return name_matches(parts[0], segments[0]) and may_lead_to_match(parts[1:], segments[1:])


def walk_results(result_dir, segments):
    """(relative parts, is symlink) of every entry below result_dir that the pattern reaches, in sorted order.

    Never follows a symlink (a link to `.` twice over makes a `**` walk exponential: glob listed 85k paths in 10 s
    and went on), visits at most MAX_RESULT_ENTRIES entries, and stops at the request's deadline."""
    found = []
    visited = 0
    pending = [()]
    while pending:
        parts = pending.pop()
        try:
            entries = sorted(os.scandir(os.path.join(result_dir, *parts)), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            visited += 1
            check_deadline()
            if visited > MAX_RESULT_ENTRIES:
                raise AgentFault("too_large", "results pattern %r reaches over %d entries under %s: narrow it"
                                 % ("/".join(segments), MAX_RESULT_ENTRIES, result_dir))
            sub = parts + (entry.name,)
            if entry.is_symlink():
                if path_matches(sub, segments) or may_lead_to_match(sub, segments):
                    found.append((sub, True))
            elif entry.is_dir(follow_symlinks=False):
                if may_lead_to_match(sub, segments):
                    pending.append(sub)
            elif path_matches(sub, segments):
                found.append((sub, False))
    return sorted(found)


def result_files(result_dir, pattern):
    """(files, refused, skipped): regular files under result_dir matching `pattern`; a symlink the pattern matches,
    anything not a regular file and escapes refused; links the walk only passes by (it never follows one, so
    nothing below them could be collected) skipped, which fails nothing."""
    files, refused, skipped = [], [], []
    real_root = os.path.realpath(result_dir)
    segments = [segment for segment in pattern.split("/") if segment not in ("", ".")]
    for parts, is_link in walk_results(result_dir, segments):
        rel = os.sep.join(parts)
        path = os.path.join(result_dir, rel)
        if is_link:
            if path_matches(parts, segments):
                refused.append({"path": rel, "reason": "symlink (%s); ddops never follows links out of a run" % rel})
            else:
                skipped.append({"path": rel, "reason": "symlink, not followed"})
            continue
        if not is_inside(os.path.realpath(path), real_root):
            refused.append({"path": rel, "reason": "resolves outside the run's result dir"})
            continue
        try:
            mode = os.lstat(path).st_mode
            if not stat.S_ISREG(mode):
                refused.append({"path": rel, "reason": "%s is %s, not a regular file" % (rel, file_kind(mode))})
                continue
            sha, size = hash_file(path)
        except AgentFault as fault:
            refused.append({"path": rel, "reason": fault.message.replace(path, rel)})
            continue
        except OSError as error:
            refused.append({"path": rel, "reason": describe_error(error)})
            continue
        files.append({"path": rel, "real_path": os.path.realpath(path), "sha256": sha, "size": size})
    return files, refused, skipped


@verb("bench_files")
def bench_files(payload):
    """The run's spec and state, and every result file (path, sha256, size) matching the plan's glob."""
    repo, run_id, run_dir = open_run(payload)
    spec = read_json_file(os.path.join(run_dir, "spec.json")) or {}
    pattern = optional_str(payload, "pattern") or spec.get("results") or "*"
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise bad_request("results pattern %r must stay inside the run's result dir" % pattern)
    result_dir = os.path.join(run_dir, "results")
    files, refused, skipped = [], [], []
    if os.path.islink(result_dir):
        # Its target is not the run's: listing it would collect whatever it names (/etc, say).
        refused.append({"path": "results", "reason": "the run's results/ is a symlink (to %s); ddops never follows "
                                                     "links out of a run" % os.readlink(result_dir)})
    elif os.path.isdir(result_dir):
        files, refused, skipped = result_files(result_dir, pattern)
    state = current_state(run_dir) or {}
    return {"run_id": run_id, "spec": spec, "state": state, "files": files, "refused": refused, "skipped": skipped,
            "result_dir": result_dir, "failures": failure_tails(run_dir, state)}


def journal_file_shas(repo, entries):
    """{file: sha256 now (None when missing or unreadable)} for every file the journal names."""
    shas = {}
    for entry in entries:
        rel = entry.get("file")
        if not isinstance(rel, str) or rel in shas:
            continue
        try:
            shas[rel] = current_sha(read_regular(resolve_target(repo, rel), rel))
        except (AgentFault, OSError):
            shas[rel] = None
    return shas


@verb("bench_facts")
def bench_facts(payload):
    """Facts plus what a bench needs: the repo's real path, the pinned commit resolved, the journal and file hashes."""
    raw = optional_str(payload, "repo")
    facts = requested_facts(payload)
    repo = os.path.realpath(os.path.expanduser(raw)) if raw else None
    facts["repo_real"] = repo if facts["repo_exists"] else None
    facts["commit_resolved"] = None
    facts["active_runs"] = []
    facts["journal"] = []
    facts["journal_files"] = {}
    facts["journal_corrupt"] = 0
    if not facts["repo_exists"]:
        return facts
    commit = optional_str(payload, "commit")
    if commit and not commit.startswith("-") and facts.get("git_commit"):
        facts["commit_resolved"] = run_quiet(["git", "rev-parse", "--verify", "--quiet", commit + "^{commit}"],
                                             cwd=repo)
    facts["active_runs"] = active_runs(repo)
    entries, corrupt = read_journal(state_dir(repo))
    facts["journal"] = entries
    facts["journal_files"] = journal_file_shas(repo, entries)
    facts["journal_corrupt"] = len(corrupt)
    return facts
