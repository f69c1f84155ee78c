"""Collect against what a run (or its host) may leave in results/: a FIFO, a results/ that is a symlink, a listed
path `.`, a symlinked directory the walk only passes by. The real agent as a local subprocess (LocalSession)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ddops.bench.plan import load_bench_plan
from ddops.fleet import CHANGED, FAILED
from ddops.inventory import Host
from ddops.tasks.bench import collect_task, launch_task, status_task
from tests.conftest import wait_until


@pytest.fixture
def host(host: Host) -> Host:
    # A listing that hangs shows as this timeout, not as the test's own.
    return replace(host, command_timeout=20)


def run_to_end(host: Host, session: Any, tmp_path: Path, run_id: str, command: str, results: str = "**/*.pt") -> Path:
    """Launch a one-command plan and wait for it to finish; the run's results/ as seen here."""
    path = tmp_path / f"{run_id}.yaml"
    path.write_text(f"summarizer: ddtree\nresults: '{results}'\ncommand: {command}\n")
    assert launch_task(load_bench_plan(path), run_id)(host, session).status == CHANGED
    wait_until(lambda: status_task(run_id)(host, session).report.run.status not in ("starting", "running"),
               timeout=60)
    return Path(host.repo) / ".ddops" / "runs" / run_id / "results"


def test_a_fifo_in_results_is_refused_by_name_and_the_other_files_are_collected(host, session, tmp_path):
    run_to_end(host, session, tmp_path, "r-fifo", "mkfifo {result_dir}/pipe.pt && printf abc > {result_dir}/a.pt")
    outcome = collect_task("r-fifo", tmp_path / "results")(host, session)
    assert outcome.status == FAILED, outcome.message
    assert "pipe.pt (pipe.pt is a FIFO, not a regular file)" in outcome.message
    assert (tmp_path / "results" / "r-fifo" / "here" / "a.pt").read_bytes() == b"abc"


def test_a_results_dir_that_is_a_symlink_is_not_followed(host, session, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.pt").write_text("not the run's")
    run_to_end(host, session, tmp_path, "r-link", f"rmdir {{result_dir}} && ln -s {elsewhere} {{result_dir}}")
    outcome = collect_task("r-link", tmp_path / "results")(host, session)
    assert outcome.status == FAILED and "results/ is a symlink" in outcome.message, outcome.message
    assert not (tmp_path / "results" / "r-link" / "here" / "secret.pt").exists()


class ListsDot:
    """A host whose listing also names `.` (a hostile or broken agent), with the hash and size of a real file."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def call_agent(self, verb: str, payload: dict[str, Any], **kwargs: Any) -> Any:
        reply = self.session.call_agent(verb, payload, **kwargs)
        if verb == "bench_files":
            reply["files"] = reply["files"] + [dict(reply["files"][0], path=".")]
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def test_a_listed_path_dot_is_refused_and_the_hosts_folder_stays_a_folder(host, session, tmp_path):
    run_to_end(host, session, tmp_path, "r-dot", "printf abc > {result_dir}/a.pt")
    outcome = collect_task("r-dot", tmp_path / "results")(host, ListsDot(session))
    folder = tmp_path / "results" / "r-dot" / "here"
    assert folder.is_dir() and (folder / "a.pt").read_bytes() == b"abc"
    assert outcome.status == FAILED and "refusing result path '.' from the host" in outcome.message


def test_a_symlinked_directory_the_pattern_cannot_match_does_not_fail_the_host(host, session, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "model.pt").write_text("not a result")
    run_to_end(host, session, tmp_path, "r-cache",
               f"ln -s {tmp_path / 'cache'} {{result_dir}}/hf_cache && printf abc > {{result_dir}}/a.pt")
    outcome = collect_task("r-cache", tmp_path / "results")(host, session)
    assert outcome.status == CHANGED, outcome.message
    assert "not followed: hf_cache (symlink, not followed)" in outcome.message
    assert not (tmp_path / "results" / "r-cache" / "here" / "hf_cache").exists()
