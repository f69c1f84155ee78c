"""Fault injection, for tests: kill the connection or the agent at an exact point of a write (remote/README.md).

Agent code (stdlib only, Python >= 3.8) that only the reliability tests' bundles ship, as `ddops_agent.faults`
(tests/reliability/conftest.py); the production agent reaches it only through protocol.fault_hook, which does
nothing without it.
"""

import json
import os
import signal
import time

# Test-only fault points (see remote/README.md, "Fault injection"): stage -> action, loaded by arm_faults from
# the repo's own .ddops/faults.json; WRITE_TARGETS maps the files being written to their repo-relative paths.
FAULTS = {}
WRITE_TARGETS = {}
# How long a "stall" holds the write up: a disk or filesystem that stops answering for a while (an NFS server away).
STALL_SECONDS = 4.0
# The sshd process that connected a resident's session (set by serve_connection; None for an exec'd agent).
SSH_SESSION_PID = None


# -- fault injection, for tests ---------------------------------------------------------------------------------


def arm_faults(state, verb_name):
    """Load this verb's fault points from <repo>/.ddops/faults.json and delete it (one shot); absent normally."""
    path = os.path.join(state, "faults.json")
    FAULTS.clear()
    try:
        with open(path, "rb") as handle:
            table = json.loads(handle.read().decode("utf-8"))
        os.unlink(path)
    except (OSError, ValueError):
        return
    if isinstance(table, dict) and isinstance(table.get(verb_name), dict):
        FAULTS.update(table[verb_name])


def disarm_faults():
    """Forget the faults a request armed and did not reach (the agent stays loaded for the next request)."""
    FAULTS.clear()


def note_write_target(target, rel):
    """`target` is the repo's file `rel` (a `stage:rel` fault names it so)."""
    WRITE_TARGETS[target] = rel


def note_ssh_session(pid):
    """The sshd process at the other end of a resident's session, for the faults that cut the connection."""
    global SSH_SESSION_PID
    SSH_SESSION_PID = pid


def fault_point(stage, target=None):
    """Do what an armed fault asks at this stage ("kill": cut the SSH connection and die; "drop": cut it only;
    "oom": die alone, as the OOM killer does, the connection kept; "stall": carry on after STALL_SECONDS)."""
    if not FAULTS or (target is not None and target not in WRITE_TARGETS):
        return
    action = FAULTS.pop("%s:%s" % (stage, WRITE_TARGETS.get(target)), None) or FAULTS.pop(stage, None)
    if action in ("kill", "drop"):
        session = ssh_session_pid()
        if session is not None:
            os.kill(session, signal.SIGKILL)
    if action in ("kill", "oom"):
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stall":
        time.sleep(STALL_SECONDS)


def ssh_session_pid():
    """The sshd (or sshd-session) process serving our connection (Linux), or None.

    A resident's session knows it from its socket's peer; an exec'd agent finds it among its ancestors.
    """
    if SSH_SESSION_PID is not None:
        return SSH_SESSION_PID
    pid = os.getppid()
    while pid > 1:
        try:
            with open("/proc/%d/stat" % pid, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return None
        if text[text.index("(") + 1:text.rindex(")")].startswith("sshd"):
            return pid
        pid = int(text[text.rindex(")") + 2:].split()[1])
    return None
