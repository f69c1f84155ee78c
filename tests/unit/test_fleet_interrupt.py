"""The fleet's side of Ctrl-C, as pure logic: once interrupted no host starts, hosts in flight finish, a
cancelled command is said to be cancelled, and the summary line counts each."""

from __future__ import annotations

from ddops.errors import Cancelled
from ddops.fleet import CANCELLED, FINISHED, NOT_STARTED, Interrupt, TaskOutcome, interrupted_summary, run_fleet
from ddops.inventory import Host

HOSTS = [Host(name=f"h{i}", address=f"127.0.0.{i}") for i in range(1, 5)]


class FakeSession:
    def close(self) -> None:
        pass


def test_once_interrupted_no_host_starts_and_the_one_in_flight_finishes():
    interrupt = Interrupt()
    ran = []

    def task(host, session):
        ran.append(host.name)
        interrupt.request()  # Ctrl-C while this host is in flight
        return TaskOutcome("changed", "committed")

    results = run_fleet(HOSTS, task, lambda h: FakeSession(), forks=1, interrupt=interrupt)
    assert ran == ["h1"]
    assert [(r.status, r.interrupted) for r in results] == [("changed", FINISHED)] + [("skipped", NOT_STARTED)] * 3
    assert interrupted_summary(results) == "interrupted: 0 done, 1 finished their commit, 3 not started"


def test_a_host_connected_after_the_interrupt_never_runs_its_task():
    interrupt = Interrupt()

    def connect(host):
        interrupt.request()
        return FakeSession()

    results = run_fleet(HOSTS[:1], lambda h, s: TaskOutcome("ok"), connect, interrupt=interrupt)
    assert results[0].interrupted == NOT_STARTED and results[0].status == "skipped"


def test_a_cancelled_command_is_failed_and_counted_as_cancelled():
    interrupt = Interrupt()

    def task(host, session):
        if host.name == "h1":
            return TaskOutcome("ok")
        interrupt.request()
        raise Cancelled(f"{host.name}: interrupted: the command was ended on the host")

    results = run_fleet(HOSTS[:3], task, lambda h: FakeSession(), forks=1, interrupt=interrupt)
    assert [r.interrupted for r in results] == [None, CANCELLED, NOT_STARTED]
    assert results[1].status == "failed" and "ended on the host" in results[1].message
    assert interrupted_summary(results) == "interrupted: 1 done, 0 finished their commit, 1 cancelled, 1 not started"
    assert "interrupted" not in results[0].to_json() and results[2].to_json()["interrupted"] == "not_started"


def test_a_run_nobody_interrupted_marks_no_host():
    results = run_fleet(HOSTS, lambda h, s: TaskOutcome("ok"), lambda h: FakeSession(), forks=2)
    assert all(r.interrupted is None for r in results)
