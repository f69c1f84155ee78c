"""ddops agent extension: the server a bench run's commands talk to (a vLLM server, say), as the plan's `server:`
declares it (ddops/bench/plan.py). The runner starts it on a free port, probes it until it is ready or its
deadline passes, shares it among the runs of its group, and always stops it:

- after its runs, and when it was not ready by its deadline or died before (Server.stop);
- on `bench stop`: its processes carry the run's tags, like every process of the run;
- when the runner itself dies, even by SIGKILL: a guard (this agent again, detached: `server_guard`) watches the
  runner and ends the server then;
- when a run is read as lost and its state still names a server (reap_server): a guard killed with the runner;
- in a Slurm job, with the task (remote/ddops_agent/slurm.py) and, at the job's end, by Slurm itself.

A server's processes carry the run's tags and DDOPS_SERVER=<run-id>/server-<n>; its output goes to server-<n>.log
in the run directory (task-<i>-server-<n>.log for a Slurm task's). Runs and server find the port in
$DDOPS_SERVER_PORT (the plan's {server_port})."""

import http.client
import json
import os
import socket
import subprocess
import time

from ddops_agent.journal import now_iso
from ddops_agent.procs import (descendants, end_processes, pids_carrying, process_record, records_of, same_process,
                               spawn_agent)
from ddops_agent.protocol import require_str, verb

SERVER_TAG = "DDOPS_SERVER"
PORT_ENV = "DDOPS_SERVER_PORT"
STOP_GRACE = 10.0
PROBE_INTERVAL = 0.5
PROBE_TIMEOUT = 2.0
GUARD_INTERVAL = 0.5
LOG_TAIL_BYTES = 2048
MAX_VERSION_CHARS = 200


def free_port():
    """A TCP port no socket on this host holds now (the kernel's pick), for the server to listen on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", 0))
        return sock.getsockname()[1]
    finally:
        sock.close()


def http_get(port, path):
    """(status, body) of GET http://127.0.0.1:<port><path>, or None when nothing answers. http.client, not urllib:
    a proxy named in the environment must never see the probe."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read(64 * 1024)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def is_ready(port, ready):
    """Whether the server is ready: `tcp`, the port takes a connection; a path, GET on it answers 2xx."""
    if ready == "tcp":
        try:
            socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT).close()
            return True
        except OSError:
            return False
    answer = http_get(port, ready)
    return answer is not None and 200 <= answer[0] < 300


def version_of(port, path):
    """What the server says at its version path: a JSON answer's `version`, else its text (shortened)."""
    answer = http_get(port, path)
    if answer is None or not 200 <= answer[0] < 300:
        return None
    text = answer[1].decode("utf-8", "replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("version"), str):
        text = value["version"]
    return text[:MAX_VERSION_CHARS] or None


def server_tags(run_id, name):
    """The environment entry only the processes of server `name` (server-<n>) of the run carry."""
    return [("%s=%s/%s" % (SERVER_TAG, run_id, name)).encode()]


def server_processes(run_id, name):
    """{pid: record} of a server's processes: those carrying its tag, and every process below them (vLLM renames
    its engine processes with setproctitle, which blanks what /proc shows of their environment: no tag to see)."""
    tagged = pids_carrying(server_tags(run_id, name))
    return records_of(tagged + descendants(tagged))


def end_server(run_id, name, grace=STOP_GRACE):
    """End every process of a server; returns the pids still alive (none, normally)."""
    return end_processes(lambda: server_processes(run_id, name), grace)[1]


def log_tail(path):
    """The last LOG_TAIL_BYTES of a file, as text."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Server:
    """One server of a run, started by `start`: its shell's process, port, log, guard and record (for state.json)."""

    def __init__(self, run_id, run_dir, name, number, spec, workdir, env, owner):
        self.run_id, self.run_dir, self.name, self.number, self.spec = run_id, run_dir, name, number, spec
        self.group = spec.get("group")
        self.port = free_port()
        self.log_path = os.path.join(run_dir, name + ".log")
        self.started = time.monotonic()
        env = dict(env)
        env.update(spec.get("env") or {})
        env[PORT_ENV] = str(self.port)
        env[SERVER_TAG] = "%s/%s" % (run_id, name)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(["/bin/sh", "-c", spec["command"]], cwd=workdir, env=env,
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            close_fds=True, start_new_session=True)
        self.leader = process_record(self.process.pid)
        guard_env = dict(env)
        del guard_env[SERVER_TAG]  # the guard is the run's, not the server's: it never looks for itself
        self.guard = spawn_agent(run_dir, name + "-guard", {"verb": "server_guard", "payload": {
            "run_id": run_id, "name": name, "owner": owner, "leader": self.leader}}, guard_env)
        self.record = {"number": number, "name": name, "group": self.group, "command": spec["command"],
                       "port": self.port, "pid": self.process.pid, "guard_pid": self.guard.pid,
                       "log": os.path.basename(self.log_path), "started": now_iso(), "ready_seconds": None,
                       "version": None, "ended": None, "exit_code": None, "problem": None}

    def wait_ready(self, stop_requested):
        """None once the server answers its readiness probe; else why it never will (it exited, it was not ready
        by its deadline, a stop was asked)."""
        deadline = self.started + float(self.spec.get("ready_timeout_s") or 600)
        ready = self.spec.get("ready") or "tcp"
        while True:
            code = self.process.poll()
            if code is not None:
                return "exited with code %d before it was ready" % code if code >= 0 else \
                    "was killed by signal %d before it was ready" % -code
            if is_ready(self.port, ready):
                self.record["ready_seconds"] = round(time.monotonic() - self.started, 3)
                if self.spec.get("version"):
                    self.record["version"] = version_of(self.port, self.spec["version"])
                return None
            if stop_requested():
                return "stopped before it was ready"
            if time.monotonic() > deadline:
                return "not ready within %gs (probe: %s on port %d)" % (deadline - self.started, ready, self.port)
            time.sleep(PROBE_INTERVAL)

    def why_not_reusable(self):
        """None while the server runs and still answers its readiness probe; else why not. The probe matters: a
        server on its way out (ended by a run, or hung) may not have exited yet."""
        code = self.process.poll()
        if code is not None:
            return "exited (code %s)" % code
        if not is_ready(self.port, self.spec.get("ready") or "tcp"):
            return "stopped answering its readiness probe"
        return None

    def stop(self, grace=STOP_GRACE):
        """End the server's processes (its whole tree, found by its tag) and its guard; record how it ended."""
        left = end_server(self.run_id, self.name, grace)
        code = self.process.wait()  # reaped: gone, and no zombie left to this runner
        try:
            self.guard.wait(timeout=GUARD_INTERVAL * 4 + 5)
        except subprocess.TimeoutExpired:
            self.guard.kill()
            self.guard.wait()
        self.record.update({"ended": now_iso(), "exit_code": code, "left": left})
        return self.record


class Servers:
    """The servers of one runner (or Slurm task), one at a time: started when a run needs one, kept for the next
    run of its group, stopped when a run needs another or none, and at the end (`stop`). `state` is the dict the
    runner saves (`save()`): its `server` names the one running (for reap_server), `servers` records them all."""

    def __init__(self, run_id, run_dir, workdir, state, save, log, prefix=""):
        self.run_id, self.run_dir, self.workdir, self.prefix = run_id, run_dir, workdir, prefix
        self.state, self.save, self.log = state, save, log
        self.owner = process_record(os.getpid())
        self.current = None
        self.not_ready = {}  # group -> why its server was not ready: its other runs fail at once
        state.setdefault("servers", [])
        state["server"] = None

    def ensure(self, spec, env, stop_requested):
        """(port, None) with the server `spec` asks for running and ready (started with `env`, the environment of
        the run that needs it, if it was not running); (None, why not) when it is not; (None, None) when the run
        needs none."""
        if self.current is not None and spec is not None and spec.get("group") == self.current.group:
            why_not = self.current.why_not_reusable()
            if why_not is None:
                return self.current.port, None
            self.log("=== ddops server %d %s; starting it again ===\n" % (self.current.number, why_not))
        self.stop()
        if spec is None:
            return None, None
        if spec.get("group") in self.not_ready:
            return None, "its server " + self.not_ready[spec.get("group")]
        number = len(self.state["servers"]) + 1
        self.log("=== ddops server %d: $ %s ===\n" % (number, spec["command"]))
        server = Server(self.run_id, self.run_dir, "%sserver-%d" % (self.prefix, number), number, spec,
                        self.workdir, env, self.owner)
        self.current = server
        self.state["servers"].append(server.record)
        self.state["server"] = server.record
        self.save()
        problem = server.wait_ready(stop_requested)
        if problem is None:
            version = " (version %s)" % server.record["version"] if server.record["version"] else ""
            self.log("=== ddops server %d ready on port %d after %.1fs%s ===\n"
                     % (number, server.port, server.record["ready_seconds"], version))
            self.save()
            return server.port, None
        problem = "%d %s" % (number, problem)
        server.record["problem"] = problem
        self.not_ready[spec.get("group")] = problem
        self.stop()
        tail = log_tail(server.log_path).rstrip("\n")
        self.log("=== ddops server %s; the end of %s: ===\n%s\n" % (problem, os.path.basename(server.log_path), tail))
        return None, "its server " + problem

    def keep_for(self, spec):
        """After a run: stop the server unless the next run (`spec`: its server, or None) is of its group."""
        if self.current is not None and (spec is None or spec.get("group") != self.current.group):
            self.stop()

    def stop(self):
        """Stop the running server, if any, and record how it ended."""
        server, self.current = self.current, None
        if server is None:
            return
        record = server.stop()
        self.state["server"] = None
        self.save()
        self.log("=== ddops server %d stopped (exit %s)%s ===\n" % (
            server.number, record["exit_code"], "; still alive: %s" % record["left"] if record["left"] else ""))


def reap_server(run_id, state):
    """A lost run's server, if its state names one still open: ended. True when there was one to end."""
    record = (state or {}).get("server")
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        return False
    end_server(run_id, record["name"])
    return True


@verb("server_guard", bounded=False)
def server_guard(payload):
    """Watch the process that started a server (the runner, a Slurm task): once it is gone while the server is not,
    end the server. Returns when the server is gone."""
    run_id, name = require_str(payload, "run_id"), require_str(payload, "name")
    owner, leader = payload.get("owner") or {}, payload.get("leader") or {}
    while True:
        if not same_process(owner):
            return {"ended_by_guard": True, "left": end_server(run_id, name)}
        # The server's own shell gone and none of its processes left: nothing more to guard.
        if not same_process(leader) and not server_processes(run_id, name):
            return {"ended_by_guard": False}
        time.sleep(GUARD_INTERVAL)
