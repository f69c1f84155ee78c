"""The agent's protocol: verbs and their registry, payload fields, faults, and one JSON answer per request."""

import base64
import binascii
import json
import os
import signal
import sys
import threading
import time

VERBS = {}
# name -> (interrupt, bounded): whether the verb is stopped where it stands at its request's deadline, and whether
# it has a deadline at all (see verb()).
VERB_LIMITS = {}
# Seconds a request may run when it names no deadline of its own (a controller always sends one).
DEFAULT_DEADLINE = 600.0
# The monotonic time the current request must be answered by; None while none runs (or it has no deadline).
DEADLINE = [None]


def b64_text(data):
    """`data` in standard base64, as text."""
    return base64.b64encode(data).decode("ascii")


def is_hex(value, *lengths):
    """Whether `value` is a string of lowercase hex digits, of one of `lengths` when any are given."""
    return (isinstance(value, str) and bool(value) and not value.strip("0123456789abcdef")
            and (not lengths or len(value) in lengths))


# Every kind of error an answer may carry (`{"ok": false, "error": {"kind", "message"}}`), and what it means. The
# controller matches some of these names (ddops/tasks/: conflict, journal_moved, no_run, ...): a kind is raised only
# if it is here, and tests/unit/test_architecture.py checks both ways.
ERROR_KINDS = {
    "bad_request": "the request or one of its payload fields is malformed",
    "unknown_verb": "this agent has no such verb",
    "timeout": "stopped at the request's deadline (or a git command ran past its own)",
    "internal": "a bug in the agent, or a result that is not JSON",
    "io": "the operating system refused a read or write",
    "bootstrap": "the bundle did not arrive whole or does not load (remote/bootstrap.py)",
    "unsafe_path": "a path that leaves the repo, or a directory that is not one",
    "symlink": "ddops never reads or writes through a symlink",
    "not_file": "not a regular file",
    "too_large": "a file or a listing over the agent's limits",
    "conflict": "the file changed since it was read (compare-and-swap)",
    "locked": "another ddops holds the repo's lock",
    "not_writable": "the file cannot be written in place with its owner and mode kept",
    "verify_failed": "a written file does not read back as written",
    "revert_failed": "a failed commit could not put the originals back",
    "bad_journal": "a journal line that does not parse",
    "journal_moved": "the journal changed since the rollback was planned",
    "no_backup": "the backup a restore needs is missing",
    "corrupt_backup": "a backup does not match its hash",
    "no_repo": "the repo is not there (or not a directory)",
    "no_git": "git is not installed on the host",
    "not_git": "the repo folder is not a git checkout and not empty",
    "git_failed": "a git command failed",
    "init_failed": "git init or remote add failed",
    "fetch_failed": "git fetch failed",
    "checkout_failed": "git checkout failed or left another HEAD",
    "save_failed": "stashing local edits failed",
    "dirty": "tracked files have local changes",
    "no_bundle": "the uploaded git bundle is missing",
    "checksum": "the uploaded git bundle does not have the sha256 the controller sent",
    "no_run": "no such bench run",
    "run_exists": "a bench run of that id already exists",
    "no_workdir": "the bench run's workdir is not a directory in the repo",
    "not_slurm": "the bench run was not submitted to Slurm",
    "slurm": "sbatch or scancel refused",
}


class AgentFault(Exception):
    """A failure the agent answers as {"kind", "message"} instead of a traceback; `kind` is one of ERROR_KINDS."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


def verb(name, interrupt=True, bounded=True):
    """Register the decorated `function(payload) -> dict` as the handler of verb `name`.

    Every request has a deadline (its `deadline` field, in seconds, else DEFAULT_DEADLINE). interrupt: stop the verb
    where it stands when the deadline passes (answer kind `timeout`); verbs that write are registered with
    interrupt=False and stop only at their own safe points instead (time_left: the lock wait, each post check),
    never half way through a write. bounded=False: no deadline at all (a detached runner that lasts as long as its
    plan says)."""

    def register(function):
        if name in VERBS:
            raise ValueError("agent verb %r is registered twice" % name)
        VERBS[name] = function
        VERB_LIMITS[name] = (interrupt, bounded)
        return function

    return register


class DeadlinePassed(BaseException):
    """The request's deadline passed (a BaseException, so that no verb's `except Exception` swallows it)."""


def time_left():
    """Seconds until the current request's deadline (0 once past), or None when it has none."""
    return None if DEADLINE[0] is None else max(0.0, DEADLINE[0] - time.monotonic())


def within_deadline(seconds):
    """`seconds` cut down to what is left of the request's deadline."""
    left = time_left()
    return seconds if left is None else min(seconds, left)


def check_deadline():
    """Raise DeadlinePassed once the request's deadline is past (for loops of unknown length)."""
    if DEADLINE[0] is not None and time.monotonic() >= DEADLINE[0]:
        raise DeadlinePassed()


def on_alarm(number, frame):
    raise DeadlinePassed()


def call_before_deadline(function, payload, seconds, interrupt):
    """function(payload) under a deadline of `seconds` (None: none); an interruptible verb is stopped at it by
    SIGALRM wherever it stands (where there is no alarm to set, at its next check_deadline)."""
    DEADLINE[0] = None if seconds is None else time.monotonic() + seconds
    alarm = (interrupt and seconds is not None and hasattr(signal, "setitimer")
             and threading.current_thread() is threading.main_thread())
    if alarm:
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        return call_with_stdout_on_stderr(function, payload)
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        DEADLINE[0] = None
        fault_hook("disarm_faults")  # the agent stays loaded for the next request: nothing armed carries over to it


# -- payload fields -------------------------------------------------------------------------------------------


def bad_request(message):
    """The fault for a payload the controller should never have sent."""
    return AgentFault("bad_request", message)


def require_str(payload, key, where="payload"):
    """payload[key] as a non-empty string."""
    value = payload.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request("%s.%s must be a non-empty string" % (where, key))
    return value


def optional_str(payload, key, default=None):
    """payload[key] as a string, or `default` when it is absent or null."""
    value = payload.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad_request("payload.%s must be a string" % key)
    return value


def optional_number(payload, key, default, where="payload"):
    """payload[key] as a non-negative float, or `default` when it is absent or null."""
    value = payload.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise bad_request("%s.%s must be a non-negative number" % (where, key))
    return float(value)


def require_sha(payload, key, where="payload"):
    """payload[key] as a lowercase hex sha256."""
    value = payload.get(key)
    if not is_hex(value, 64):
        raise bad_request("%s.%s must be a lowercase hex sha256" % (where, key))
    return value


def optional_sha(payload, key, where="payload"):
    """payload[key] as a lowercase hex sha256, or None (no file) when it is null or absent."""
    return None if payload.get(key) is None else require_sha(payload, key, where)


def require_list(payload, key, where="payload"):
    """payload[key] as a list (absent means empty)."""
    value = payload.get(key, [])
    if not isinstance(value, list):
        raise bad_request("%s.%s must be a list" % (where, key))
    return value


def require_patch_ids(payload, where):
    """payload["patch_ids"] as a list of strings."""
    ids = require_list(payload, "patch_ids", where)
    if not all(isinstance(item, str) and item for item in ids):
        raise bad_request("%s.patch_ids must hold non-empty strings" % where)
    return ids


def require_object(value, where):
    """`value` itself, checked to be a JSON object."""
    if not isinstance(value, dict):
        raise bad_request("%s must be an object" % where)
    return value


def decode_b64(payload, key, where):
    """The bytes of base64 field payload[key]."""
    value = payload.get(key)
    if not isinstance(value, str):
        raise bad_request("%s.%s must be a base64 string" % (where, key))
    try:
        data = binascii.a2b_base64(value)
    except (ValueError, UnicodeEncodeError):
        data = None
    # a2b_base64 skips characters outside the alphabet; only the canonical encoding of its result is accepted.
    if data is None or b64_text(data) != value:
        raise bad_request("%s.%s is not valid base64" % (where, key))
    return data


def identity(payload):
    """Who is acting, as recorded in journal entries and lock.info."""
    return {"actor": optional_str(payload, "actor", "unknown"), "ddops_version": optional_str(payload, "ddops_version")}


# -- protocol -------------------------------------------------------------------------------------------------


def describe_error(error):
    """One line for an exception, naming the file for OS errors."""
    if isinstance(error, AgentFault):
        return error.message
    if isinstance(error, OSError) and error.filename:
        return "%s: %s" % (error.strerror or error, error.filename)
    return "%s: %s" % (type(error).__name__, error)


def failure(kind, message):
    """An error response."""
    return {"ok": False, "error": {"kind": kind, "message": message}}


def parse_request(raw):
    """(verb name, payload, deadline in seconds) from the request bytes."""
    try:
        request = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request("request is not JSON: %s" % error) from None
    if not isinstance(request, dict) or not isinstance(request.get("verb"), str):
        raise bad_request('request must be {"verb": str, "payload": {...}}')
    payload = request.get("payload")
    payload = {} if payload is None else payload
    deadline = optional_number(request, "deadline", DEFAULT_DEADLINE, "request")
    return request["verb"], require_object(payload, "payload"), deadline


def call_with_stdout_on_stderr(function, payload):
    """Run a verb with fd 1 pointing at stderr, so stray output cannot corrupt the one JSON answer."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        return function(payload)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def answer(raw):
    """The response document for request bytes `raw`; never raises for a verb's failure."""
    seconds = None
    try:
        name, payload, seconds = parse_request(raw)
        if name not in VERBS:
            raise AgentFault("unknown_verb", "unknown verb %r (this agent knows %s)" % (name, ", ".join(sorted(VERBS))))
        interrupt, bounded = VERB_LIMITS[name]
        return {"ok": True, "result": call_before_deadline(VERBS[name], payload, seconds if bounded else None,
                                                           interrupt)}
    except DeadlinePassed:
        return failure("timeout", "stopped at the request's deadline (%gs); nothing of it is left running" % seconds)
    except AgentFault as fault:
        return failure(fault.kind, fault.message)
    except OSError as error:
        return failure("io", describe_error(error))
    except Exception as error:
        return failure("internal", describe_error(error))


def encode_response(response):
    """The response as one JSON line; a result that cannot be encoded becomes an `internal` error."""
    try:
        return json.dumps(response) + "\n"
    except (TypeError, ValueError) as error:
        return json.dumps(failure("internal", "result is not JSON: %s" % error)) + "\n"


def shipped_bundle():
    """(bundle bytes, bootstrap source) as the controller shipped them, for a verb that starts this agent again
    detached; None when the agent was not loaded from a bundle (`python -m ddops_agent`)."""
    import zlib

    loader = globals().get("__loader__")
    bundle = getattr(loader, "bundle", None)
    if not bundle:
        return None
    return bundle, json.loads(zlib.decompress(bundle).decode("utf-8"))["bootstrap"]


# -- fault injection: only the reliability tests' bundles add ddops_agent.faults (remote/README.md) -------------


def fault_hook(name, *args):
    """Call `name(*args)` of the fault injection module a test bundle ships; nothing in a production bundle."""
    faults = sys.modules.get("ddops_agent.faults")
    if faults is not None:
        getattr(faults, name)(*args)


def fault_point(stage, target=None):
    """Where an armed test fault strikes."""
    fault_hook("fault_point", stage, target)


def main():
    """Read one request from stdin, print one JSON answer on stdout, exit 0."""
    response = answer(sys.stdin.buffer.read())
    sys.stdout.write(encode_response(response))
    sys.stdout.flush()
