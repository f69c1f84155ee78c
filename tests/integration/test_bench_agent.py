"""The agent's bench verbs on real sshd hosts: detached runs that outlive the connection, in order, with exit codes,
log offsets, stop that leaves nothing behind, and result listings that never follow a symlink out of the run."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ddops.errors import AgentError
from ddops.inventory import load_inventory
from ddops.testbed import start_host, stop_host
from ddops.transport import Connector
from tests.conftest import MINI_DDTREE, both_engines, git_seed, requires_sshd, wait_until

if TYPE_CHECKING:
    from ddops.bench.plan import BenchPlan

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture
def bed(make_testbed, tmp_path):
    return make_testbed(1, seed=git_seed(MINI_DDTREE, tmp_path / "seed"))


@pytest.fixture
def host(bed):
    return load_inventory(bed.inventory_path).hosts[0]


@pytest.fixture
def connect(bed):
    inv = load_inventory(bed.inventory_path)
    connector = Connector(inv.known_hosts)
    opened = []

    def open_session():
        session = connector.connect(inv.hosts[0])
        opened.append(session)
        return session

    yield open_session
    for session in opened:
        try:
            session.close()
        except Exception:  # noqa: BLE001 - a test may have closed it already
            pass


def spec(*commands: str, timeout_s: float | None = None, env: dict | None = None) -> dict:
    """A bench spec as the controller sends it."""
    return {"plan": "test", "host": "host1", "workdir": ".", "env": {}, "timeout_s": timeout_s, "results": "*.pt",
            "runs": [{"index": i, "label": f"run{i}", "command": c, "env": dict(env or {}), "params": {"i": i}}
                     for i, c in enumerate(commands)]}


def launch(session, host, run_id: str, *commands: str, **kwargs) -> dict:
    return session.call_agent("bench_launch", {"repo": host.repo, "run_id": run_id, "spec": spec(*commands, **kwargs)})


def state_of(session, host, run_id: str) -> dict:
    return session.call_agent("bench_status", {"repo": host.repo, "run_id": run_id})


def wait_for_status(connect, host, run_id: str, statuses=("completed", "failed", "stopped", "error", "lost"),
                    timeout: float = 30) -> dict:
    session = connect()
    found = {}

    def done():
        found.update(state_of(session, host, run_id))
        return found["state"]["status"] in statuses

    wait_until(done, timeout=timeout, interval=0.2)
    return found


def run_dir(bed, run_id: str) -> Path:
    """The run's directory as seen from outside the host's namespace."""
    return bed.hosts[0].repo_dir / ".ddops" / "runs" / run_id


def tagged(run_id: str) -> list[int]:
    """Live processes carrying this run's tag (the hosts share our pid namespace)."""
    wanted = f"DDOPS_RUN_ID={run_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@both_engines
def test_launched_run_outlives_its_ssh_connection_and_runs_every_command_in_order(bed, host, connect):
    session = connect()
    # The first command waits for a file only the test makes, after launch has answered: launch cannot have waited.
    go = f"/tmp/ddops-go-{uuid.uuid4().hex}"
    result = launch(session, host, "r-order", f"while [ ! -e {go} ]; do sleep 0.05; done; echo first",
                    "echo second; echo to-stderr >&2")
    session.close()  # the controller goes away right after launching
    assert result["total"] == 2 and result["pid"] > 0
    assert wait_for_status(connect, host, "r-order", statuses=("running",))["state"]["status"] == "running"
    release = connect()
    release.run(f"touch {go}")

    final = wait_for_status(connect, host, "r-order")
    release.run(f"rm -f {go}")
    release.close()
    assert final["state"]["status"] == "completed"
    assert [(r["status"], r["exit_code"]) for r in final["state"]["runs"]] == [("ok", 0), ("ok", 0)]
    log = (run_dir(bed, "r-order") / "log").read_text()
    assert log.index("first") < log.index("=== ddops run 2/2") < log.index("second") < log.index("to-stderr")
    assert [(run_dir(bed, "r-order") / f"exit-{i}").read_text() for i in range(2)] == ["0\n", "0\n"]
    state = json.loads((run_dir(bed, "r-order") / "state.json").read_text())
    assert state["started"] and state["ended"] and state["done"] == 2
    # The runner records the end, then exits: nothing of the run is left moments later.
    wait_until(lambda: not tagged("r-order"), timeout=10)


def test_runner_environment_has_plan_env_python_dir_first_on_path_and_hf_offline(bed, host, connect):
    session = connect()
    launch(session, host, "r-env", 'echo "FOO=$FOO"; echo "PATH=$PATH"; echo "HF=$HF_HUB_OFFLINE"; '
                                   'echo "CWD=$(pwd)"; echo "IDX=$DDOPS_RUN_INDEX"', env={"FOO": "bar baz"})
    wait_for_status(connect, host, "r-env")
    lines = dict(line.split("=", 1) for line in (run_dir(bed, "r-env") / "log").read_text().splitlines()
                 if line.split("=", 1)[0] in ("FOO", "PATH", "HF", "CWD", "IDX"))
    assert lines["FOO"] == "bar baz"
    assert lines["PATH"].split(":")[0] == os.path.dirname(host.python)
    assert lines["HF"] == "1"
    assert lines["CWD"] == host.repo and lines["IDX"] == "0"
    recorded = json.loads((run_dir(bed, "r-env") / "spec.json").read_text())["runner_env"]
    assert recorded["HF_HUB_OFFLINE"] == "1" and recorded["PATH"].startswith(os.path.dirname(host.python))


def test_crashing_run_reports_its_exit_code_and_log_tail_and_later_runs_still_go(bed, host, connect):
    session = connect()
    launch(session, host, "r-crash", "echo ok-before", "echo 'Traceback: boom' >&2; exit 3", "echo after-crash")
    final = wait_for_status(connect, host, "r-crash")
    assert final["state"]["status"] == "failed"
    runs = final["state"]["runs"]
    assert [(r["status"], r["exit_code"]) for r in runs] == [("ok", 0), ("failed", 3), ("ok", 0)]
    assert "Traceback: boom" in final["failures"]["1"]
    assert "ok-before" not in final["failures"]["1"]  # the tail is that run's own output
    assert (run_dir(bed, "r-crash") / "exit-1").read_text() == "3\n"


def test_run_past_its_timeout_is_killed_with_its_children_and_reported_as_timeout(bed, host, connect):
    session = connect()
    launch(session, host, "r-timeout", "sleep 60 & sleep 61", "echo next", timeout_s=1)
    final = wait_for_status(connect, host, "r-timeout", timeout=30)
    first, second = final["state"]["runs"]
    assert first["status"] == "timeout" and first["exit_code"] == 124
    assert second["status"] == "ok"
    # The runner itself exits just after recording the end: give it that moment, then nothing tagged may remain.
    wait_until(lambda: not tagged("r-timeout"), timeout=10)


def test_poll_streams_the_log_by_byte_offset(bed, host, connect):
    session = connect()
    launch(session, host, "r-poll", "for i in 1 2 3; do echo line-$i; sleep 0.3; done")
    offset, text = 0, b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        polled = session.call_agent("bench_poll", {"repo": host.repo, "run_id": "r-poll", "offset": offset,
                                                   "max_bytes": 7})
        chunk = base64.b64decode(polled["log_b64"])
        assert len(chunk) <= 7
        text += chunk
        offset = polled["offset"]
        if polled["state"]["status"] == "completed" and offset == polled["log_size"]:
            break
    assert text == (run_dir(bed, "r-poll") / "log").read_bytes()
    assert b"line-1\nline-2\nline-3\n" in text


def test_stop_ends_the_process_group_setsid_children_and_records_stopped(bed, host, connect):
    session = connect()
    # Like torchrun: a worker in its own session, one in the background, one in the foreground.
    launch(session, host, "r-stop",
           "sleep 300 & setsid sleep 301 & python3 -c 'import time; time.sleep(302)'", "echo must-not-run")
    wait_until(lambda: len(tagged("r-stop")) >= 5, timeout=10)  # runner, sh, 2 sleeps, python
    before = tagged("r-stop")

    result = session.call_agent("bench_stop", {"repo": host.repo, "run_id": "r-stop", "grace": 2})
    assert result["status"] == "stopped" and result["remaining"] == []
    assert set(before) <= set(result["killed"])
    assert tagged("r-stop") == []
    for pid in before:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

    final = state_of(session, host, "r-stop")["state"]
    assert final["status"] == "stopped" and final["ended"]
    assert [r["status"] for r in final["runs"]] == ["stopped", "pending"]
    time.sleep(0.5)
    assert "must-not-run" not in (run_dir(bed, "r-stop") / "log").read_text()
    again = session.call_agent("bench_stop", {"repo": host.repo, "run_id": "r-stop"})
    assert again["already_ended"] is True


def test_a_runner_that_was_killed_is_reported_lost(bed, host, connect):
    session = connect()
    launch(session, host, "r-lost", "sleep 30")
    pid = wait_until(lambda: json.loads((run_dir(bed, "r-lost") / "pid").read_text())["pid"]
                     if (run_dir(bed, "r-lost") / "pid").exists() else None)
    os.kill(pid, signal.SIGKILL)
    final = wait_for_status(connect, host, "r-lost", statuses=("lost",), timeout=10)
    assert "no longer running" in final["state"]["message"]
    session.call_agent("bench_stop", {"repo": host.repo, "run_id": "r-lost", "grace": 0})
    assert tagged("r-lost") == []


def test_result_listing_hashes_files_and_refuses_symlinks_out_of_the_run(bed, host, connect, tmp_path):
    session = connect()
    launch(session, host, "r-files", "mkdir -p $DDOPS_RUN_DIR/results/sub && printf abc > $DDOPS_RUN_DIR/results/a.pt"
                                     " && printf def > $DDOPS_RUN_DIR/results/sub/b.pt")
    wait_for_status(connect, host, "r-files")
    results = run_dir(bed, "r-files") / "results"
    secret = tmp_path / "secret.pt"
    secret.write_text("not yours")
    os.symlink("/etc/passwd", results / "passwd.pt")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "c.pt").write_text("outside")
    os.symlink(tmp_path / "outside", results / "linkdir")

    listing = session.call_agent("bench_files", {"repo": host.repo, "run_id": "r-files", "pattern": "**/*.pt"})
    files = {f["path"]: f for f in listing["files"]}
    assert set(files) == {"a.pt", "sub/b.pt"}
    assert files["a.pt"]["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert files["a.pt"]["size"] == 3
    refused = {r["path"] for r in listing["refused"]}
    assert refused == {"passwd.pt"}  # a link the pattern matches: refused, never followed
    assert [r["path"] for r in listing["skipped"]] == ["linkdir"]  # a link it only passes by: not followed either
    assert listing["spec"]["results"] == "*.pt" and listing["state"]["status"] == "completed"


def test_list_shows_every_run_and_bad_or_taken_run_ids_are_refused(bed, host, connect):
    session = connect()
    launch(session, host, "20260101-0000-aaaa", "true")
    launch(session, host, "20260102-0000-bbbb", "true")
    with pytest.raises(AgentError) as exists:
        launch(session, host, "20260101-0000-aaaa", "true")
    assert exists.value.kind == "run_exists"
    for bad in ("../escape", "a/b", ".hidden", ""):
        with pytest.raises(AgentError) as refused:
            launch(session, host, bad, "true")
        assert refused.value.kind == "bad_request"
    with pytest.raises(AgentError) as missing:
        state_of(session, host, "20990101-0000-none")
    assert missing.value.kind == "no_run"
    wait_for_status(connect, host, "20260102-0000-bbbb")
    runs = session.call_agent("bench_list", {"repo": host.repo})["runs"]
    assert [r["run_id"] for r in runs] == ["20260102-0000-bbbb", "20260101-0000-aaaa"]
    assert runs[0]["plan"] == "test" and runs[0]["total"] == 1


def test_bench_facts_resolves_the_pinned_commit_and_returns_the_journal(bed, host, connect):
    session = connect()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=bed.hosts[0].repo_dir, capture_output=True,
                          text=True, check=True).stdout.strip()
    facts = session.call_agent("bench_facts", {"repo": host.repo, "commit": head[:10]})
    assert facts["repo_real"] == host.repo and facts["git_commit"] == head
    assert facts["commit_resolved"] == head
    assert facts["journal"] == [] and facts["versions"]["torch"]
    assert session.call_agent("bench_facts", {"repo": host.repo, "commit": "0" * 40})["commit_resolved"] is None
    assert session.call_agent("bench_facts", {"repo": "/nope"})["repo_exists"] is False


# --- the controller side over the same verbs -------------------------------------------------------------------------


def write_plan(tmp_path: Path, text: str) -> BenchPlan:
    from ddops.bench.plan import load_bench_plan

    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return load_bench_plan(path)


def test_launch_refuses_a_host_at_the_wrong_commit_without_gpus_or_busy_saying_why(bed, host, tmp_path):
    from dataclasses import replace

    from ddops.fleet import run_fleet
    from ddops.tasks.bench import launch_task

    inv = load_inventory(bed.inventory_path)
    connect = Connector(inv.known_hosts).connect
    gpu_plan = write_plan(tmp_path, "summarizer: ddtree\nresults: '*.pt'\ngpus: 2\nmin_free_disk_gb: 1000000\n"
                                    "command: echo {gpus}\n")
    (refused,) = run_fleet([replace(host, commit="0" * 40)], launch_task(gpu_plan, "r-refused"), connect)
    assert refused.status == "failed"
    assert f"pinned commit {'0' * 7} is not in the repo" in refused.message
    assert "needs 2 GPU(s), host has 0" in refused.message and "GB free disk" in refused.message
    assert not run_dir(bed, "r-refused").exists()

    sleepy = write_plan(tmp_path, "summarizer: ddtree\nresults: '*.pt'\ncommand: sleep 30\n")
    (first,) = run_fleet([host], launch_task(sleepy, "r-busy-1"), connect)
    assert first.status == "changed" and first.report.total == 1
    (second,) = run_fleet([host], launch_task(sleepy, "r-busy-2"), connect)
    assert second.status == "failed" and "bench run r-busy-1 is still" in second.message
    with connect(host) as session:
        session.call_agent("bench_stop", {"repo": host.repo, "run_id": "r-busy-1", "grace": 0})
    assert tagged("r-busy-1") == []


def test_collect_copies_results_checks_hashes_and_never_takes_a_symlink(bed, host, connect, tmp_path):
    from ddops.bench.collect import write_manifest
    from ddops.fleet import run_fleet
    from ddops.tasks.bench import collect_task, manifest_entries

    session = connect()
    launch(session, host, "r-collect", "printf abc > $DDOPS_RUN_DIR/results/a.pt")
    wait_for_status(connect, host, "r-collect")
    (tmp_path / "outside.pt").write_text("secret")
    os.symlink(tmp_path / "outside.pt", run_dir(bed, "r-collect") / "results" / "link.pt")
    root = tmp_path / "results"
    inv = load_inventory(bed.inventory_path)
    (result,) = run_fleet([host], collect_task("r-collect", root), Connector(inv.known_hosts).connect)
    assert result.status == "failed" and "refused: link.pt" in result.message
    assert sorted(p.name for p in (root / "r-collect" / "host1").iterdir()) == ["a.pt"]
    assert (root / "r-collect" / "host1" / "a.pt").read_text() == "abc"
    manifest = json.loads(write_manifest(root, "r-collect", manifest_entries([result])).read_text())
    entry = manifest["hosts"]["host1"]
    assert entry["files"] == [{"path": "a.pt",
                               "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                               "size": 3}]
    assert entry["refused"][0]["path"] == "link.pt" and entry["exit_codes"] == {"0": 0}


def test_follow_rides_out_the_host_going_away_and_the_run_keeps_going(bed, host, connect):
    from ddops.tasks.bench import Follower, HostUpdate, LogText

    session = connect()
    launch(session, host, "r-away", "echo before; sleep 3; echo after")
    session.close()
    inv = load_inventory(bed.inventory_path)
    follower = Follower([host], "r-away", Connector(inv.known_hosts).connect, interval=0.2, give_up_after=60)
    events = follower.events()
    text, errors = "", []
    for event in events:
        if isinstance(event, LogText):
            text += event.text
            if "before" in text:
                break
    stop_host(bed, "host1")  # sshd and its sessions go; the detached runner does not
    assert tagged("r-away"), "the runner must survive its host's sshd going away"
    for event in events:
        if isinstance(event, HostUpdate) and event.error:
            errors.append(event.error)
            break
    start_host(bed, "host1")
    for event in events:
        if isinstance(event, LogText):
            text += event.text
        elif event.final:
            assert event.run is not None and event.run.status == "completed", event
    assert errors and "before" in text and "after" in text and "completed" in text
    assert follower.final["host1"].run.done == 1


def test_stop_of_a_lost_run_never_signals_a_process_that_now_holds_one_of_its_recorded_pids(bed, host, connect):
    session = connect()
    launch(session, host, "r-reused", "sleep 300")
    recorded = wait_until(lambda: state_of(session, host, "r-reused")["state"].get("child_pid"), timeout=10)
    assert recorded
    for pid in tagged("r-reused"):  # the runner and its command die, as in an OOM kill or a reboot
        os.kill(pid, signal.SIGKILL)
    wait_for_status(connect, host, "r-reused", statuses=("lost",), timeout=10)
    # Pid reuse: an unrelated process (root's) now has the recorded pids. The runner's record keeps its own start
    # time; the command's record is given the newcomer's real start time and group, so only the run's tag tells.
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        victim_start = int(Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        pid_file = run_dir(bed, "r-reused") / "pid"
        runner = json.loads(pid_file.read_text())
        pid_file.write_text(json.dumps(dict(runner, pid=victim.pid, pgid=victim.pid)))
        state_file = run_dir(bed, "r-reused") / "state.json"
        state = json.loads(state_file.read_text())
        state.update(child_pid=victim.pid, child={"pid": victim.pid, "start_time": victim_start, "pgid": victim.pid})
        state_file.write_text(json.dumps(state))

        result = session.call_agent("bench_stop", {"repo": host.repo, "run_id": "r-reused", "grace": 0.5})

        assert victim.poll() is None, "bench stop signalled a process that is not the run's"
        assert result["status"] == "stopped" and result["killed"] == [] and result["remaining"] == []
        assert state_of(session, host, "r-reused")["state"]["status"] == "stopped"
    finally:
        victim.kill()
        victim.wait()


def test_a_teams_own_benchmark_runs_as_a_smoke_run_and_is_collected_and_reported(bed, tmp_path):
    """--only cuts the matrix, --var sets a placeholder, and summarizer: metrics reads the JSON it wrote."""
    from tests.conftest import run_ddops

    plan = tmp_path / "team-bench.yaml"
    plan.write_text("""\
name: team-bench
summarizer: metrics
results: "*.json"
metrics: {method: method, tokens_per_s: speed.tok_s, output: text, dataset: dataset}
command: >-
  printf '{{"method": "%s", "dataset": "%s", "speed": {{"tok_s": %s}}, "text": "%s"}}\\n'
  {method} {dataset} {speed} {text} > {result_dir}/{method}-{dataset}.json
vars: {text: default}
matrix:
  method:
    - {method: baseline, speed: 40}
    - {method: fast, speed: 80}
  dataset: [mine, big-one]
""")
    results = tmp_path / "results"
    env = {"DDOPS_RESULTS_DIR": str(results)}
    inventory = bed.inventory_path
    proc = run_ddops("bench", "run", str(plan), "--all", "--only", "dataset=mine", "--var", "text=same answer",
                     "--run-id", "20261201-0000-team", "--no-follow", inventory=inventory, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def finished() -> bool:
        doc = json.loads(run_ddops("--json", "bench", "status", "20261201-0000-team", inventory=inventory,
                                   env=env).stdout)
        return doc["hosts"][0]["data"]["run"]["status"] == "completed"

    wait_until(finished, timeout=60)
    proc = run_ddops("bench", "collect", "20261201-0000-team", inventory=inventory, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in (results / "20261201-0000-team" / "host1").rglob("*.json")) == [
        "baseline-mine.json", "fast-mine.json"]
    proc = run_ddops("bench", "report", "20261201-0000-team", "--format", "json", inventory=inventory, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["method"]: r for r in json.loads(proc.stdout)["rows"]}
    assert set(rows) == {"metrics:baseline", "metrics:fast"}
    assert rows["metrics:fast"]["speedup"] == pytest.approx(2.0) and rows["metrics:fast"]["fidelity"] == 1.0
    assert rows["metrics:fast"]["dataset"] == "mine"
