"""A bench plan's `server:` run by the real agent on this machine (LocalSession): started once per group on a free
port, probed until ready, its output kept, and always stopped: after its runs, when it misses its readiness deadline
or dies first, on `bench stop`, when the runner is SIGKILLed (its guard), and when the agent finds the run lost.
"Stopped" is checked the hard way: no process carrying the server's tag, nothing listening on its port."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from ddops.bench.plan import BenchPlan, load_bench_plan
from ddops.bench.runs import RunStatus
from ddops.fleet import CHANGED, FAILED
from ddops.tasks.bench import collect_task, launch_task, status_task, stop_task
from tests.conftest import exited, wait_until

# A server that is ready when its port answers HTTP (the standard library's file server, in the repo folder).
HTTP_SERVER = f"exec {sys.executable} -m http.server {{server_port}} --bind 127.0.0.1"


def write_plan(tmp_path: Path, text: str) -> BenchPlan:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return load_bench_plan(path)


def state(host, run_id: str) -> dict:
    return json.loads((Path(host.repo) / ".ddops" / "runs" / run_id / "state.json").read_text())


def run_dir(host, run_id: str) -> Path:
    return Path(host.repo) / ".ddops" / "runs" / run_id


def ended(host, session, run_id: str) -> bool:
    return status_task(run_id)(host, session).report.run.status not in ("starting", "running")


def server_processes(run_id: str) -> list[int]:
    """Live processes of any server of the run: those carrying DDOPS_SERVER=<run-id>/..., and all below them (a
    process that blanked its environment, as vLLM's renamed engine processes do, shows no tag)."""
    prefix = f"DDOPS_SERVER={run_id}/".encode()
    parents, found = {}, []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or exited(int(entry.name)):
                continue
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if any(e.startswith(prefix) for e in (entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    grown = True
    while grown:
        below = [pid for pid, parent in parents.items() if parent in found and pid not in found]
        found += below
        grown = bool(below)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def listening(port: int) -> bool:
    """Whether any socket of this network namespace listens on TCP `port` (IPv4 or IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                return True
    return False


def nothing_left(run_id: str, ports, before=()) -> bool:
    """No server process of the run (`before`: the ones seen earlier, none of which may outlive its tree), nothing
    listening on `ports`."""
    return not server_processes(run_id) and all(exited(pid) for pid in before) and not any(listening(p) for p in ports)


# What a run's command does with its server: GET a path and save the answer under a name of its choosing.
CLIENT = ("import os, sys, urllib.request\n"
          "url = 'http://127.0.0.1:%s%s' % (os.environ['DDOPS_SERVER_PORT'], sys.argv[1])\n"
          "open(sys.argv[2], 'wb').write(urllib.request.urlopen(url).read())\n")


@pytest.fixture
def repo(host) -> Path:
    """The host's repo, with a client the runs call and two folders for the file servers to serve."""
    root = Path(host.repo)
    (root / "client.py").write_text(CLIENT)
    for method in ("a", "b"):
        (root / method).mkdir()
        (root / method / "version").write_text(json.dumps({"version": f"1.{method}"}))
    return root


def test_runs_share_their_groups_server_on_a_free_port_and_it_is_stopped_after_them(host, session, repo, tmp_path):
    plan = write_plan(tmp_path, f"""
summarizer: vllm
results: "*.txt"
server:
  command: {HTTP_SERVER} --directory {{method}}
  ready: /
  version: /version
matrix:
  method: [a, b]
  temperature: [0, 1]
command: {sys.executable} client.py /version {{result_dir}}/{{method}}-{{temperature}}-port{{server_port}}.txt
""")
    assert launch_task(plan, "r-serve")(host, session).status == CHANGED
    wait_until(lambda: ended(host, session, "r-serve"), timeout=120, interval=0.2)
    final = state(host, "r-serve")
    assert final["status"] == "completed", (run_dir(host, "r-serve") / "log").read_text()
    # One server per method, each shared by its two temperatures, on a port of its own, then stopped.
    servers = final["servers"]
    assert [(s["number"], s["group"], s["version"]) for s in servers] == [(1, 0, "1.a"), (2, 2, "1.b")]
    assert [r["server"] for r in final["runs"]] == [1, 1, 2, 2] and final["server"] is None
    ports = [s["port"] for s in servers]
    results = run_dir(host, "r-serve") / "results"
    assert sorted(p.name for p in results.iterdir()) == sorted(
        f"{m}-{t}-port{ports[i]}.txt" for i, m in enumerate("ab") for t in (0, 1))
    assert json.loads((results / f"b-1-port{ports[1]}.txt").read_text()) == {"version": "1.b"}
    assert all(s["ended"] and s["ready_seconds"] is not None and s["exit_code"] is not None for s in servers)
    assert nothing_left("r-serve", ports)
    log = (run_dir(host, "r-serve") / "log").read_text()
    assert f"=== ddops server 1 ready on port {ports[0]}" in log and "=== ddops server 2 stopped" in log
    assert "GET /version" in (run_dir(host, "r-serve") / "server-2.log").read_text()  # its output, kept
    # The manifest says, per command, which server answered it: as the plan rendered it, and its version.
    collected = collect_task("r-serve", tmp_path / "results")(host, session)
    commands = collected.report.manifest["commands"]
    assert [(c["server"]["version"], c["server"]["port"]) for c in commands] == [("1.a", ports[0])] * 2 + [
        ("1.b", ports[1])] * 2
    assert commands[2]["server"]["command"].endswith("--directory b") and commands[2]["server"]["ready"] == "/"
    assert collected.report.manifest["vllm"] == "1.a, 1.b"  # a vLLM plan's servers: the version the report reads


# A server in the repo: `never` never answers, `crash` exits 3 at once, `tree` starts a helper first, in a session of
# its own and with no environment to see (as vLLM's engine processes, renamed by setproctitle, show none), then serves
# HTTP like `ok`.
SERVE = """\
import http.server, subprocess, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
print("serve.py starting:", mode, flush=True)
if mode == "never":
    time.sleep(600)
if mode == "crash":
    sys.exit(3)
if mode == "tree":
    subprocess.Popen(["/bin/sleep", "600"], start_new_session=True, env={})
open("server.pid", "w").write(str(__import__("os").getpid()))
http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def serve_plan(tmp_path: Path, modes: str, command: str = "echo {mode} {temperature}",
               deadline: float = 10) -> BenchPlan:
    (tmp_path / "repo" / "serve.py").write_text(SERVE)
    return write_plan(tmp_path, f"""
summarizer: vllm
results: "*.json"
server:
  command: {sys.executable} serve.py {{mode}} {{server_port}}
  ready: /
  ready_timeout_minutes: {deadline}
matrix:
  mode: [{modes}]
  temperature: [0, 1]
command: {command}
""")


def test_a_server_not_ready_by_its_deadline_is_stopped_and_only_its_runs_fail(host, session, tmp_path):
    plan = serve_plan(tmp_path, "never, ok", deadline=0.02)
    assert launch_task(plan, "r-late")(host, session).status == CHANGED
    wait_until(lambda: ended(host, session, "r-late"), timeout=120, interval=0.2)
    final = state(host, "r-late")
    assert [(r["status"], r["exit_code"]) for r in final["runs"]] == [("failed", 126), ("failed", 126),
                                                                       ("ok", 0), ("ok", 0)]
    assert final["status"] == "failed" and final["servers"][0]["problem"].startswith("1 not ready within 1.2s")
    assert len(final["servers"]) == 2  # the late one is not started again for its group's second run
    log = (run_dir(host, "r-late") / "log").read_text()
    # Why, in the run's own part of the log: the server's end of output, as `bench status` shows failures.
    assert "=== ddops server 1 not ready within 1.2s" in log and "serve.py starting: never" in log
    assert "(not run: its server 1 not ready within 1.2s" in log
    assert nothing_left("r-late", [s["port"] for s in final["servers"]])


def test_a_server_that_exits_before_it_is_ready_fails_its_runs_at_once(host, session, tmp_path):
    plan = serve_plan(tmp_path, "crash", deadline=30)  # not waited for: the server is gone
    assert launch_task(plan, "r-crash")(host, session).status == CHANGED
    wait_until(lambda: ended(host, session, "r-crash"), timeout=25, interval=0.2)
    final = state(host, "r-crash")
    assert final["servers"][0]["problem"] == "1 exited with code 3 before it was ready"
    assert [r["exit_code"] for r in final["runs"]] == [126, 126]
    status = status_task("r-crash")(host, session)
    assert status.status == FAILED and "serve.py starting: crash" in status.report.run.runs[0].log_tail


def ready_and_running(host, run_id: str) -> bool:
    try:
        now = state(host, run_id)
    except (OSError, ValueError):
        return False
    return bool(now.get("servers")) and now["servers"][0]["ready_seconds"] is not None and now.get("child") \
        is not None


def test_bench_stop_ends_the_server_with_every_process_it_started(host, session, tmp_path):
    plan = serve_plan(tmp_path, "tree", command="sleep 600 && echo {mode} {temperature}")
    assert launch_task(plan, "r-stop")(host, session).status == CHANGED
    wait_until(lambda: ready_and_running(host, "r-stop"), timeout=60, interval=0.1)
    port = state(host, "r-stop")["servers"][0]["port"]
    # The server and the helper it set apart in a session of its own, which a process group would not reach.
    tree = server_processes("r-stop")
    assert listening(port) and "/bin/sleep 600" in [cmdline(pid) for pid in tree]
    stopped = stop_task("r-stop", "tester@here", grace=2)(host, session)
    assert stopped.status == CHANGED, stopped.message
    assert nothing_left("r-stop", [port], tree)  # at once: stop answers once every process of the run is gone
    assert status_task("r-stop")(host, session).report.run.status == RunStatus.STOPPED


def test_a_runner_killed_by_sigkill_takes_its_server_with_it(host, session, tmp_path):
    plan = serve_plan(tmp_path, "tree", command="sleep 600 && echo {mode} {temperature}")
    assert launch_task(plan, "r-kill")(host, session).status == CHANGED
    wait_until(lambda: ready_and_running(host, "r-kill"), timeout=60, interval=0.1)
    port, tree = state(host, "r-kill")["servers"][0]["port"], server_processes("r-kill")
    os.kill(state(host, "r-kill")["runner_pid"], signal.SIGKILL)
    # The server's guard sees its runner gone and ends the server, with no one asking.
    wait_until(lambda: nothing_left("r-kill", [port], tree), timeout=30, interval=0.1)
    assert status_task("r-kill")(host, session).report.run.status == RunStatus.LOST
    stop_task("r-kill", "tester@here", grace=0)(host, session)  # the lost run's command, left as before


def test_a_lost_run_whose_guard_died_too_has_its_server_ended_when_the_agent_reads_it(host, session, tmp_path):
    plan = serve_plan(tmp_path, "tree", command="sleep 600 && echo {mode} {temperature}")
    assert launch_task(plan, "r-reap")(host, session).status == CHANGED
    wait_until(lambda: ready_and_running(host, "r-reap"), timeout=60, interval=0.1)
    before = state(host, "r-reap")
    port = before["servers"][0]["port"]
    os.kill(before["servers"][0]["guard_pid"], signal.SIGKILL)
    wait_until(lambda: exited(before["servers"][0]["guard_pid"]), timeout=10)
    os.kill(before["runner_pid"], signal.SIGKILL)
    wait_until(lambda: exited(before["runner_pid"]), timeout=10)
    tree = server_processes("r-reap")
    assert listening(port) and len(tree) >= 2  # no guard left: the server (and its helper) outlived the runner
    assert status_task("r-reap")(host, session).report.run.status == RunStatus.LOST
    assert nothing_left("r-reap", [port], tree) and state(host, "r-reap")["server"] is None
    stop_task("r-reap", "tester@here", grace=0)(host, session)


def test_a_server_that_dies_between_its_groups_runs_is_started_again_for_the_next(host, session, tmp_path):
    # The first run ends the server it was given, and waits for it to be gone (a zombie the runner reaps once the run
    # ends): the second, of the same group, gets a new one.
    plan = serve_plan(tmp_path, "ok", command="p=$(cat server.pid) && kill $p && until ! test -e /proc/$p || grep -q "
                                              "'^State:.Z' /proc/$p/status; do sleep 0.05; done && echo {mode} "
                                              "{temperature}")
    assert launch_task(plan, "r-again")(host, session).status == CHANGED
    wait_until(lambda: ended(host, session, "r-again"), timeout=60, interval=0.2)
    final = state(host, "r-again")
    assert final["status"] == "completed" and [s["group"] for s in final["servers"]] == [0, 0]
    log = (run_dir(host, "r-again") / "log").read_text()
    # The server's shell, after the kill: 143 (dash waits for its command) or -15 (a shell that exec'd it).
    assert re.search(r"=== ddops server 1 exited \(code (143|-15)\); starting it again ===", log), log
    assert nothing_left("r-again", [s["port"] for s in final["servers"]])


def test_a_server_that_hangs_between_its_groups_runs_is_not_reused(host, session, tmp_path):
    # The first run freezes its server (SIGSTOP): alive, holding its port, answering nothing. The second run of the
    # group must not be handed it: the runner probes before reuse, ends it and starts another.
    plan = serve_plan(tmp_path, "ok", command="kill -STOP $(cat server.pid) && echo {mode} {temperature}")
    assert launch_task(plan, "r-hung")(host, session).status == CHANGED
    wait_until(lambda: ended(host, session, "r-hung"), timeout=120, interval=0.2)
    final = state(host, "r-hung")
    assert final["status"] == "completed" and [s["group"] for s in final["servers"]] == [0, 0]
    log = (run_dir(host, "r-hung") / "log").read_text()
    assert "=== ddops server 1 stopped answering its readiness probe; starting it again ===" in log, log
    assert nothing_left("r-hung", [s["port"] for s in final["servers"]])
