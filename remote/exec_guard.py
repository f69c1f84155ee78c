"""`ddops exec`'s guard on the host: the command in a process group of its own, and at its timeout that whole group
ended (TERM, then KILL after a grace), from inside sudo when there is one, so nothing of it is left running.

The command's output passes through the guard, which is done when the command has exited and its output has closed
(as an SSH session is): a process the command left in the background holding the output (`sleep 321 & echo hi`)
is ended with the group at the timeout, instead of holding the session open until the controller gives up. One
that let go of the output (`cmd >/dev/null 2>&1 &`) is left running, as ssh leaves it.

Run by the login shell as `PYTHON -S -c <this file> TIMEOUT GRACE COMMAND...` (ddops/tasks/adhoc.py); standard
library only, Python >= 3.8, like the agent. Exits with the command's status (128+N when a signal ended it), 124
when the timeout ended it with TERM, 137 when KILL was needed, 128+N when signal N for the guard (ddops' Ctrl-C)
ended it the same way, and 127 or 126 when it could not be started. It never signals itself: coreutils `timeout`
KILLed its own group, so a command that ignored TERM ended the session with a signal instead of a status, and as a
user it could not KILL what ran under sudo."""

import errno
import os
import select
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


def forward(pipes, seconds):
    """Copy what the command's pipes hold to our stdout and stderr, waiting up to `seconds` for some; a pipe at its
    end (every process holding it closed it or ended) is closed and dropped from `pipes`. False once our own
    output is gone (the session closed)."""
    ready, _, _ = select.select(list(pipes), [], [], seconds)
    for fd in ready:
        data = os.read(fd, 65536)
        if not data:
            os.close(fd)
            del pipes[fd]
            continue
        try:
            while data:
                data = data[os.write(pipes[fd], data):]
        except OSError:
            return False
    return True


def main(argv):
    timeout, grace, command = float(argv[0]), float(argv[1]), argv[2:]
    received = []  # a TERM, INT or HUP for us (ddops' Ctrl-C watchdog, or sudo passing one on)

    def note(number, _frame):
        received.append(number)

    # Before the command starts: a signal from now on ends it as a timeout does, never just this guard.
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, note)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        # A session of its own: its group id is its pid, and nothing of ours (this guard, the login shell) is in it.
        child = subprocess.Popen(command, start_new_session=True, stdout=out_write, stderr=err_write)
    except OSError as error:
        sys.stderr.write("ddops: failed to run command '%s': %s\n" % (command[0], error.strerror))
        return 127 if error.errno in (errno.ENOENT, errno.ENOTDIR) else 126
    finally:
        os.close(out_write)
        os.close(err_write)
    pipes = {out_read: 1, err_read: 2}
    deadline = time.monotonic() + timeout
    code = None
    while not received:
        left = deadline - time.monotonic()
        if left <= 0:
            code = KILLED if end_group(child, grace) else TIMED_OUT
            break
        if pipes and not forward(pipes, min(left, 0.1)):
            received.append(signal.SIGHUP)  # nobody reads the output any more: end the command as a hangup does
            continue
        code = child.poll()
        if code is not None and not pipes:
            code = code if code >= 0 else 128 - code
            break
        if not pipes:
            time.sleep(min(left, 0.05))
    else:
        end_group(child, grace)
        code = 128 + received[0]
    # What the ended group wrote before it went, for a moment: a process outside the group may still hold a pipe.
    until = time.monotonic() + 1.0
    while pipes and time.monotonic() < until and select.select(list(pipes), [], [], 0)[0] and forward(pipes, 0):
        pass
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
