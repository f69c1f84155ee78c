"""ddops agent: the processes of a bench run: records that survive a recycled pid, the run's environment tags,
signals, ending a set of processes for good, and starting this agent again detached (the runner, a server's guard)."""

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress

from ddops_agent.files import atomic_write
from ddops_agent.protocol import bad_request, shipped_bundle

RUN_TAG_ID = "DDOPS_RUN_ID"
RUN_TAG_DIR = "DDOPS_RUN_DIR"


# -- processes --------------------------------------------------------------------------------------------------


def proc_stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (the 3rd field on), or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return None


# Indices into proc_stat_fields: fields 3 (state), 4 (parent), 5 (process group) and 22 (start time, in clock ticks
# since boot: what tells a process from a later one given a recycled pid) of proc(5)'s /proc/PID/stat.
STAT_STATE, STAT_PPID, STAT_PGID, STAT_START_TIME = 0, 1, 2, 19


def stat_number(fields, index):
    """fields[index] of proc_stat_fields as a whole number, or None (the process gone, or no such field)."""
    try:
        return int(fields[index])
    except (TypeError, IndexError, ValueError):
        return None


def process_record(pid):
    """What stop checks later to know `pid` is still this process: pid, start time and process group."""
    fields = proc_stat_fields(pid)
    return {"pid": pid, "start_time": stat_number(fields, STAT_START_TIME), "pgid": stat_number(fields, STAT_PGID)}


def run_tags(run_id, run_dir):
    """The environment entries every process of a run carries (b"NAME=value")."""
    return [("%s=%s" % (RUN_TAG_ID, run_id)).encode(), ("%s=%s" % (RUN_TAG_DIR, run_dir)).encode()]


def carries(pid, tags):
    """Whether the process's environment (as it was exec'd) holds every one of `tags`."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            entries = handle.read().split(b"\0")
    except (OSError, TypeError):
        return False
    return all(tag in entries for tag in tags)


def carries_run_tags(pid, run_id, run_dir):
    """Whether the process's environment names this run: an unrelated process never does."""
    return carries(pid, run_tags(run_id, run_dir))


def is_run_process(record, run_id, run_dir):
    """Whether a recorded process still runs and is still the run's: same start time and group, the run's tags.

    A pid recorded before a reboot or an OOM kill may belong to anyone now (root's, on a GPU host): nothing is
    signalled on the strength of a pid alone."""
    if not isinstance(record, dict):
        return False
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    fields = proc_stat_fields(pid)
    if not fields or fields[STAT_STATE] == b"Z":
        return False
    start_time, pgid = stat_number(fields, STAT_START_TIME), stat_number(fields, STAT_PGID)
    if start_time is None or pgid is None:
        return False
    if record.get("start_time") is None or start_time != record.get("start_time"):
        return False
    if record.get("pgid") is not None and pgid != record.get("pgid"):
        return False
    return carries_run_tags(pid, run_id, run_dir)


def proc_state(pid):
    """The one-letter state of a process (R, S, Z ...), or None when it is gone or unknown."""
    fields = proc_stat_fields(pid)
    return fields[STAT_STATE].decode("ascii", "replace") if fields else None


def same_process(record):
    """Whether the process recorded (by process_record) still runs, not a zombie, with the start time recorded."""
    fields = proc_stat_fields(record.get("pid"))
    if not fields or fields[STAT_STATE] == b"Z" or record.get("start_time") is None:
        return False
    return stat_number(fields, STAT_START_TIME) == record["start_time"]


def signal_process(record, sig):
    """Send `sig` to a recorded process if it is still that process (checked right before, not at the last scan)."""
    if same_process(record):
        signal_quietly(record["pid"], sig)


def pids_carrying(tags):
    """Every live process but this one whose environment holds all of `tags` (survives setsid, e.g. torchrun
    workers or a server's engine processes)."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        if carries(int(name), tags) and proc_state(int(name)) not in (None, "Z"):
            found.append(int(name))
    return found


def tagged_pids(run_id, run_dir):
    """Every live process whose environment carries this run's tags."""
    return pids_carrying(run_tags(run_id, run_dir))


def group_members(pgid):
    """Every live process in process group `pgid`."""
    members = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if name.isdigit():
            fields = proc_stat_fields(int(name))
            if fields and fields[STAT_STATE] != b"Z" and stat_number(fields, STAT_PGID) == pgid:
                members.append(int(name))
    return members


def group_is_the_runs(pgid, run_id, run_dir):
    """Whether process group `pgid` has members and every one of them carries the run's tags (safe to killpg)."""
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
        return False
    members = [pid for pid in group_members(pgid) if pid != os.getpid()]
    return bool(members) and all(carries_run_tags(pid, run_id, run_dir) for pid in members)


def children_map():
    """{ppid: [pid]} for every process (Linux /proc)."""
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if not name.isdigit():
            continue
        ppid = stat_number(proc_stat_fields(int(name)), STAT_PPID)
        if ppid is not None:
            children.setdefault(ppid, []).append(int(name))
    return children


def descendants(pids):
    """Every live process below any of `pids`."""
    children = children_map()
    found, stack = [], list(pids)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.append(child)
                stack.append(child)
    return found


def signal_quietly(pid, sig, group=False):
    """Send `sig` to a process (or its group), ignoring ones already gone."""
    with suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def group_alive(pgid):
    """Whether any process is left in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def spawn_agent(run_dir, name, request, env):
    """Start this agent again detached, answering `request`: own session, stdin from <name>.in, output to
    <name>.out, both in run_dir; returns its Popen (the bench runner, a server's guard).

    It runs from the shipped bundle, written to the run directory: bootstrap.py reads <name>.in (the bundle, then
    the request) as the bootstrap does over ssh."""
    shipped = shipped_bundle()
    if shipped is None:
        raise bad_request("%s needs the shipped agent bundle (run it through the bootstrap)" % request["verb"])
    bundle, bootstrap = shipped
    bootstrap_path = os.path.join(run_dir, "bootstrap.py")
    if not os.path.isfile(bootstrap_path):  # a Slurm run wrote it at submit, readable by its tasks: kept as is
        atomic_write(bootstrap_path, bootstrap.encode("utf-8"), 0o600)
    stdin_path = os.path.join(run_dir, name + ".in")
    atomic_write(stdin_path, bundle + json.dumps(request).encode("utf-8"), 0o600)
    with open(stdin_path, "rb") as stdin, open(os.path.join(run_dir, name + ".out"), "ab") as out:
        # start_new_session: setsid() in the child, so no hangup or signal to our ssh session reaches it; every
        # descriptor is a file of ours, so the ssh channel closes as soon as this agent exits.
        process = subprocess.Popen(
            [sys.executable, "-S", bootstrap_path, str(len(bundle))], cwd=run_dir, stdin=stdin, stdout=out,
            stderr=subprocess.STDOUT, close_fds=True, start_new_session=True,
            env=env,
        )
    return process


def end_processes(find, grace, also=None, found=None):
    """SIGTERM every process `find()` returns ({pid: process_record}; `found`: its first answer, when the caller
    has it already), SIGKILL what is left after `grace` seconds, in rounds (a process may fork between a scan and
    its signal); `also(sig)` signals more (a process group). Returns (pids signalled, pids still alive)."""
    found = dict(find() if found is None else found)
    for record in found.values():
        signal_process(record, signal.SIGTERM)
    if also:
        also(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(same_process(record) for record in found.values()):
        time.sleep(0.05)
    killed = sorted(found)
    for _ in range(5):
        left = find()
        for pid, record in found.items():
            if same_process(record):
                left.setdefault(pid, record)
        if also:
            also(signal.SIGKILL)
        if not left:
            break
        for pid, record in left.items():
            signal_process(record, signal.SIGKILL)
            found.setdefault(pid, record)
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.05)
    return killed, sorted(find())


def records_of(pids):
    """{pid: process_record} of the processes still there."""
    records = {}
    for pid in sorted(set(pids)):
        record = process_record(pid)
        if record["start_time"] is not None:
            records[pid] = record
    return records
