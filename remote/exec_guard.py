"""`ddops exec`'s guard on the host: the command in a process group of its own, and at its timeout that whole group
ended (TERM, then KILL after a grace), from inside sudo when there is one, so nothing of it is left running.

Run by the login shell as `PYTHON -S -c <this file> TIMEOUT GRACE COMMAND...` (ddops/tasks/adhoc.py); standard
library only, Python >= 3.8, like the agent. Exits with the command's status (128+N when a signal ended it), 124
when the timeout ended it with TERM, 137 when KILL was needed, 128+N when signal N for the guard (ddops' Ctrl-C)
ended it the same way, and 127 or 126 when it could not be started. It never signals itself: coreutils `timeout` KILLed its own group, so a command that ignored TERM ended the session with a
signal instead of a status, and as a user it could not KILL what ran under sudo.
"""

import errno
import os
import signal
import subprocess
import sys
import time

TIMED_OUT, KILLED = 124, 137
# How long the group may take to go once KILLed (reaping by init included) before we stop waiting for it.
KILL_WAIT_SECONDS = 5.0


def group_alive(pgid):
    """Whether a process other than a zombie is left in group `pgid` (/proc; killpg where there is none)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        names = None
    if names is None:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z" and fields[2] == str(pgid).encode():
            return True
    return False


def wait_for_group(child, seconds):
    """Wait up to `seconds` for the command and everything in its group to end; whether they did."""
    deadline = time.monotonic() + seconds
    while True:
        leader_gone = child.poll() is not None  # reaps the leader: a zombie would keep the group looking alive
        if leader_gone and not group_alive(child.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def signal_group(pgid, number):
    try:
        os.killpg(pgid, number)
    except OSError:
        pass


def end_group(child, grace):
    """TERM the command's group, KILL what is left after `grace` seconds; whether KILL was needed."""
    signal_group(child.pid, signal.SIGTERM)
    if wait_for_group(child, grace):
        return False
    signal_group(child.pid, signal.SIGKILL)
    wait_for_group(child, KILL_WAIT_SECONDS)
    return True


def main(argv):
    timeout, grace, command = float(argv[0]), float(argv[1]), argv[2:]
    received = []  # a TERM, INT or HUP for us (ddops' Ctrl-C watchdog, or sudo passing one on)

    def note(number, _frame):
        received.append(number)

    # Before the command starts: a signal from now on ends it as a timeout does, never just this guard.
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, note)
    try:
        # A session of its own: its group id is its pid, and nothing of ours (this guard, the login shell) is in it.
        child = subprocess.Popen(command, start_new_session=True)
    except OSError as error:
        sys.stderr.write("ddops: failed to run command '%s': %s\n" % (command[0], error.strerror))
        return 127 if error.errno in (errno.ENOENT, errno.ENOTDIR) else 126
    deadline = time.monotonic() + timeout
    while not received:
        left = deadline - time.monotonic()
        if left <= 0:
            return KILLED if end_group(child, grace) else TIMED_OUT
        try:
            code = child.wait(timeout=min(left, 0.1))
        except subprocess.TimeoutExpired:
            continue
        return code if code >= 0 else 128 - code
    end_group(child, grace)
    return 128 + received[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
