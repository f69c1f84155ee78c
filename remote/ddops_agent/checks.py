"""Child processes: quiet helper commands and the commit's post checks."""

import os
import subprocess
import time
from contextlib import suppress

from ddops_agent.protocol import (optional_number, optional_str, require_list, require_object, require_str,
                                  within_deadline)

CHECK_OUTPUT_BYTES = 4096
DEFAULT_CHECK_TIMEOUT = 60.0
# How long the agent waits for a check's process group to be gone once KILLed (orphans are reaped by init).
GROUP_GONE_SECONDS = 5.0


# -- processes ------------------------------------------------------------------------------------------------


def run_quiet(argv, cwd=None, timeout=15):
    """stdout of `argv` stripped, or None when it cannot run or fails (no shell involved)."""
    try:
        done = subprocess.run(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace").strip()


def kill_group(process):
    """Kill the check's whole process group, so its children do not outlive the timeout."""
    with suppress(OSError):
        os.killpg(process.pid, 9)


def end_group(process):
    """KILL what the check left in its process group and wait (up to GROUP_GONE_SECONDS) until it is gone: a
    background writer must neither race the revert nor outlive the commit. (A process that left the group, by
    setsid or a daemon's double fork, is beyond this.)"""
    kill_group(process)
    deadline = time.monotonic() + GROUP_GONE_SECONDS
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except OSError:  # ESRCH: no process is left in the group
            return
        time.sleep(0.01)


def output_tail(data):
    """The last CHECK_OUTPUT_BYTES of `data`, decoded leniently."""
    return data[-CHECK_OUTPUT_BYTES:].decode("utf-8", "replace")


def run_check(repo, check):
    """Run one post check with /bin/sh in the repo: {name, ok, exit_code, output, timed_out, seconds}."""
    started = time.monotonic()
    # No longer than the request's deadline: past it the controller has stopped waiting for the answer.
    timeout = within_deadline(check["timeout"])
    process = subprocess.Popen(
        ["/bin/sh", "-c", check["command"]], cwd=repo, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    timed_out = False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(process)
        output = collect_after_kill(process)
    end_group(process)
    exit_code = None if timed_out else process.returncode
    text = output_tail(output)
    if timed_out:
        text += "\n[ddops: timed out after %gs%s]" % (timeout, "" if timeout == check["timeout"]
                                                         else ", the end of the commit's deadline")
    return {
        "name": check["name"], "ok": exit_code == 0, "exit_code": exit_code, "output": text,
        "timed_out": timed_out, "seconds": round(time.monotonic() - started, 3),
    }


def collect_after_kill(process):
    """Whatever output a killed check left, without waiting on a grandchild that escaped its group."""
    try:
        output, _ = process.communicate(timeout=5)
        return output or b""
    except subprocess.TimeoutExpired:
        process.stdout.close()
        process.wait()
        return b""


def parse_post_checks(payload):
    """payload["post_checks"] as [{name, command, timeout}]."""
    checks = []
    for index, raw in enumerate(require_list(payload, "post_checks")):
        where = "post_checks[%d]" % index
        require_object(raw, where)
        checks.append({
            "name": optional_str(raw, "name") or "check %d" % (index + 1),
            "command": require_str(raw, "command", where),
            "timeout": optional_number(raw, "timeout", DEFAULT_CHECK_TIMEOUT, where),
        })
    return checks
