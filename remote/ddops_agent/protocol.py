"""The agent's protocol: verbs and their registry, payload fields, faults, and one JSON answer per request."""

import base64
import binascii
import json
import os
import sys


VERBS = {}


def b64_text(data):
    """`data` in standard base64, as text."""
    return base64.b64encode(data).decode("ascii")


def is_hex(value, *lengths):
    """Whether `value` is a string of lowercase hex digits, of one of `lengths` when any are given."""
    return (isinstance(value, str) and bool(value) and not value.strip("0123456789abcdef")
            and (not lengths or len(value) in lengths))


class AgentFault(Exception):
    """A failure the agent answers as {"kind", "message"} instead of a traceback."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


def verb(name):
    """Register the decorated `function(payload) -> dict` as the handler of verb `name`."""

    def register(function):
        if name in VERBS:
            raise ValueError("agent verb %r is registered twice" % name)
        VERBS[name] = function
        return function

    return register


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
    """(verb name, payload) from the request bytes."""
    try:
        request = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request("request is not JSON: %s" % error) from None
    if not isinstance(request, dict) or not isinstance(request.get("verb"), str):
        raise bad_request('request must be {"verb": str, "payload": {...}}')
    payload = request.get("payload")
    payload = {} if payload is None else payload
    return request["verb"], require_object(payload, "payload")


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
    try:
        name, payload = parse_request(raw)
        if name not in VERBS:
            raise AgentFault("unknown_verb", "unknown verb %r (this agent knows %s)" % (name, ", ".join(sorted(VERBS))))
        return {"ok": True, "result": call_with_stdout_on_stderr(VERBS[name], payload)}
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
    loader = globals().get("__loader__")
    bundle = getattr(loader, "bundle", None)
    if not bundle:
        return None
    return bundle, json.loads(bundle.decode("utf-8"))["bootstrap"]


def main():
    """Read one request from stdin, print one JSON answer on stdout, exit 0."""
    response = answer(sys.stdin.buffer.read())
    sys.stdout.write(encode_response(response))
    sys.stdout.flush()
