"""The bench tasks against the real agent run as a local subprocess (LocalSession): launch, status, follow, collect,
list and stop a run in a temporary repo, with no sshd and no root. Over SSH: tests/integration/test_bench_agent.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ddops.bench.collect import write_manifest
from ddops.bench.plan import BenchPlan, load_bench_plan
from ddops.bench.runs import RunStatus
from ddops.fleet import CHANGED, FAILED, OK, SKIPPED
from ddops.inventory import Host
from ddops.tasks.bench import (Follower, HostUpdate, LogText, check_task, collect_task, launch_task, list_task,
                               manifest_entries, status_task, stop_task)
from ddops.transport.local import LocalSession
from tests.conftest import wait_until


def write_plan(tmp_path: Path, text: str) -> BenchPlan:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return load_bench_plan(path)


def finished(host: Host, session: LocalSession, run_id: str) -> bool:
    return status_task(run_id)(host, session).report.run.status not in ("starting", "running")


def test_launch_then_status_follow_and_collect_a_run_on_this_machine(host, session, tmp_path):
    plan = write_plan(tmp_path, "summarizer: ddtree\nresults: '*.pt'\n"
                                "command: echo hello; printf abc > {result_dir}/a.pt\n")
    ready = check_task(plan)(host, session)
    assert ready.status == OK and ready.message == "ready: 1 run"
    launched = launch_task(plan, "r-local")(host, session)
    assert launched.status == CHANGED and launched.report.total == 1
    wait_until(lambda: finished(host, session, "r-local"), timeout=60)
    status = status_task("r-local")(host, session)
    assert status.status == OK and status.report.run.status == RunStatus.COMPLETED

    follower = Follower([host], "r-local", LocalSession, interval=0.05)
    events = list(follower.events())
    assert "hello" in "".join(e.text for e in events if isinstance(e, LogText))
    assert isinstance(events[-1], HostUpdate) and events[-1].final and events[-1].run.status == RunStatus.COMPLETED

    root = tmp_path / "results"
    collected = collect_task("r-local", root)(host, session)
    assert collected.status == CHANGED, collected.message
    assert (root / "r-local" / "here" / "a.pt").read_bytes() == b"abc"
    again = collect_task("r-local", root)(host, session)
    assert again.status == OK and "1 already here" in again.message

    from ddops.fleet import HostResult

    result = HostResult("here", "localhost", collected.status, collected.message, collected.report)
    manifest = json.loads(write_manifest(root, "r-local", manifest_entries([result])).read_text())
    assert manifest["hosts"]["here"]["files"] == [{"path": "a.pt", "sha256": hashlib.sha256(b"abc").hexdigest(),
                                                   "size": 3}]
    listed = list_task(host, session)
    assert [r.run_id for r in listed.report.runs] == ["r-local"]


def test_launch_refuses_a_host_busy_with_another_run_and_stop_ends_it(host, session, tmp_path):
    sleepy = write_plan(tmp_path, "summarizer: ddtree\nresults: '*.pt'\ncommand: sleep 60\n")
    assert launch_task(sleepy, "r-busy-1")(host, session).status == CHANGED
    second = launch_task(sleepy, "r-busy-2")(host, session)
    assert second.status == FAILED and "bench run r-busy-1 is still" in second.message
    stopped = stop_task("r-busy-1", "tester@here", grace=0)(host, session)
    assert stopped.status == CHANGED, stopped.message
    assert status_task("r-busy-1")(host, session).report.run.status == RunStatus.STOPPED


def test_launch_refuses_a_repo_that_is_not_there(tmp_path):
    plan = write_plan(tmp_path, "summarizer: ddtree\nresults: '*.pt'\ncommand: echo hi\n")
    host = Host(name="here", address="localhost", repo=str(tmp_path / "missing"))
    with LocalSession(host) as session:
        refused = launch_task(plan, "r-none")(host, session)
    assert refused.status == FAILED and "is not there (run `ddops sync` first)" in refused.message


def test_status_of_a_run_the_host_never_had_is_skipped(host, session):
    assert status_task("r-unknown")(host, session).status == SKIPPED


@pytest.mark.parametrize("repo_there", [True, False], ids=["no-such-run", "no-repo"])
def test_status_stop_and_collect_skip_a_host_without_the_run(repo_there, tmp_path):
    repo = tmp_path / "repo"
    if repo_there:
        repo.mkdir()
    host = Host(name="here", address="localhost", repo=str(repo), command_timeout=60)
    tasks = [status_task("r-unknown"), stop_task("r-unknown", "tester@here", grace=0),
             collect_task("r-unknown", tmp_path / "results")]
    with LocalSession(host) as session:
        outcomes = [task(host, session) for task in tasks]
    assert [(o.status, o.message) for o in outcomes] == [(SKIPPED, "no run r-unknown here")] * 3
    assert not (tmp_path / "results").exists()


def test_max_file_size_reads_bytes_and_binary_units_and_refuses_the_rest():
    from ddops.bench.collect import parse_size
    from ddops.errors import UsageError

    assert parse_size("4096") == 4096 and parse_size("500M") == 500 * 1024**2 and parse_size("2G") == 2 * 1024**3
    assert parse_size("1.5GiB") == int(1.5 * 1024**3) and parse_size("1k") == 1024
    for bad in ("", "-1", "0", "2 X", "G"):
        with pytest.raises(UsageError, match="--max-file-size"):
            parse_size(bad)


def test_collect_into_a_host_named_dot_dot_is_refused(session, tmp_path):
    dotdot = Host(name="..", address="localhost", repo=str(tmp_path / "repo"))
    outcome = collect_task("r-x", tmp_path / "results")(dotdot, session)
    assert outcome.status == FAILED and "refusing to collect into" in outcome.message
