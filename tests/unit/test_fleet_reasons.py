"""A host that failed on an error says which kind of error in `reason` (--json), so that a machine can tell a
host-key refusal from a timeout or a lock without reading the English; the message keeps saying it to people."""

from __future__ import annotations

import pytest

from ddops.errors import AgentError, CommandTimeout, ConnectionLost, HostKeyError, UsageError
from ddops.fleet import TaskOutcome, run_fleet
from ddops.inventory import Host

HOST = Host(name="h1", address="127.0.0.1")


class FakeSession:
    def close(self) -> None:
        pass


def run_one_task(task, connect=lambda h: FakeSession()):
    (result,) = run_fleet([HOST], task, connect)
    return result


def raising(exc):
    def task(host, session):
        raise exc

    return task


@pytest.mark.parametrize("exc,status,reason", [
    (AgentError("another ddops holds the lock", kind="locked", host="h1"), "failed", "locked"),
    (CommandTimeout("no answer within 5s", host="h1"), "failed", "timeout"),
    (ConnectionLost("connection lost: EOF", host="h1"), "unreachable", "connection_lost"),
    (UsageError("bad pattern"), "failed", "usage"),
    (ValueError("a bug"), "failed", "internal"),
])
def test_a_task_that_raised_fails_with_the_error_s_kind_as_reason(exc, status, reason):
    result = run_one_task(raising(exc))
    assert (result.status, result.reason) == (status, reason)
    assert result.to_json()["reason"] == reason
    assert not result.message.startswith("h1:")  # the host is beside the message, never inside it


def test_a_host_whose_key_was_refused_is_unreachable_with_reason_host_key():
    def connect(host):
        raise HostKeyError("unknown host key (ssh-ed25519 SHA256:abc)", host=host.name)

    result = run_one_task(lambda h, s: TaskOutcome("ok"), connect)
    assert (result.status, result.reason, result.message) == ("unreachable", "host_key",
                                                              "unknown host key (ssh-ed25519 SHA256:abc)")


def test_a_host_that_did_what_was_asked_has_no_reason_and_a_task_may_give_its_own():
    assert run_one_task(lambda h, s: TaskOutcome("ok")).to_json()["reason"] is None
    late = run_one_task(lambda h, s: TaskOutcome("failed", "no answer", reason="timeout"))
    assert (late.status, late.reason) == ("failed", "timeout")
