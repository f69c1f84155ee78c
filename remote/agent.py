"""ddops host agent: one JSON request on stdin, one JSON answer on stdout (stdlib only, Python >= 3.8)."""

import binascii
import datetime
import errno
import fcntl
import hashlib
import json
import os
import platform
import posixpath
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid

# The bootstrap puts the shipped source here before running us (so a verb can write itself to disk);
# run directly as a script it stays None. Reading globals() keeps the bootstrap's value.
AGENT_SOURCE = globals().get("AGENT_SOURCE")

MAX_FILE_BYTES = 16 * 1024 * 1024
CHECK_OUTPUT_BYTES = 4096
DEFAULT_LOCK_TIMEOUT = 10.0
DEFAULT_CHECK_TIMEOUT = 60.0
LOCK_POLL_SECONDS = 0.05
STATE_DIR = ".ddops"
EXCLUDE_LINE = "/.ddops/"
PROTECTED_TOP_DIRS = (STATE_DIR, ".git")
TEMP_SUFFIX = ".ddops-tmp"

VERBS = {}
# Test-only fault points (see remote/README.md, "Fault injection"): stage -> action, loaded by arm_faults from
# the repo's own .ddops/faults.json; WRITE_TARGETS maps the files being written to their repo-relative paths.
FAULTS = {}
WRITE_TARGETS = {}
# The sshd process that connected a resident's session (set by serve_connection; None for an exec'd agent).
SSH_SESSION_PID = None

# -- encodings without their packages ---------------------------------------------------------------------------
# Every request, answer and journal line is JSON, yet `import json` costs more than the rest of an agent start (it
# compiles regular expressions, and `re` pulls in enum); hashlib loads OpenSSL and base64 pulls in `re` too. Their
# C cores import nothing, so the agent calls those directly and leaves the packages to the bootstrap's lazy
# stand-ins, which a Python lacking a core still falls back on.
try:
    import _json
except ImportError:
    _json = None
try:
    from _sha2 import sha256 as BUILTIN_SHA256  # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256 as BUILTIN_SHA256
    except ImportError:
        BUILTIN_SHA256 = None


class _JsonScanContext(object):
    """The settings json.loads gives the C scanner."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__


_JSON_SCAN = None if _json is None else _json.make_scanner(_JsonScanContext())
_JSON_WHITESPACE = " \t\n\r"


def from_json(text):
    """The value of the JSON document `text`, as json.loads(text) gives it; ValueError when it is not one."""
    if _JSON_SCAN is None:
        return json.loads(text)
    document = text.strip(_JSON_WHITESPACE)
    try:
        value, end = _JSON_SCAN(document, 0)
    except Exception:
        end = None
    if end != len(document):
        # Not one JSON document. The scanner reports errors through the json package, which it expects to be
        # loaded already (else SystemError): let the package parse it and say what is wrong.
        return json.loads(text)
    return value


def to_json(value, sort_keys=False):
    """`value` as json.dumps(value, sort_keys=sort_keys) writes it, character for character."""
    if _json is None:
        return json.dumps(value, sort_keys=sort_keys)
    chunks = []
    _encode_json(value, chunks, sort_keys)
    return "".join(chunks)


def _json_float(value):
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _json_key(key):
    if isinstance(key, str):
        return key
    if key is True or key is False or key is None:
        return {True: "true", False: "false", None: "null"}[key]
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return _json_float(key)
    raise TypeError("keys must be str, int, float, bool or None, not %s" % type(key).__name__)


def _encode_json(value, chunks, sort_keys):
    if isinstance(value, str):
        chunks.append(_json.encode_basestring_ascii(value))
    elif value is None:
        chunks.append("null")
    elif value is True:
        chunks.append("true")
    elif value is False:
        chunks.append("false")
    elif isinstance(value, int):
        chunks.append(int.__repr__(value))
    elif isinstance(value, float):
        chunks.append(_json_float(value))
    elif isinstance(value, dict):
        items = [(_json_key(key), item) for key, item in value.items()]
        if sort_keys:
            items.sort(key=lambda pair: pair[0])
        chunks.append("{")
        for index, (key, item) in enumerate(items):
            chunks.append(", " if index else "")
            chunks.append(_json.encode_basestring_ascii(key))
            chunks.append(": ")
            _encode_json(item, chunks, sort_keys)
        chunks.append("}")
    elif isinstance(value, (list, tuple)):
        chunks.append("[")
        for index, item in enumerate(value):
            chunks.append(", " if index else "")
            _encode_json(item, chunks, sort_keys)
        chunks.append("]")
    else:
        raise TypeError("Object of type %s is not JSON serializable" % type(value).__name__)


def b64_text(data):
    """`data` in standard base64, as text."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def is_hex(value, *lengths):
    """Whether `value` is a string of lowercase hex digits, of one of `lengths` when any are given."""
    return (isinstance(value, str) and bool(value) and not value.strip("0123456789abcdef")
            and (not lengths or len(value) in lengths))



def record_type(name, fields):
    """A small immutable-by-convention record class (collections.namedtuple without importing collections)."""
    fields = tuple(fields.split())

    def __init__(self, *values):
        if len(values) != len(fields):
            raise TypeError("%s takes %d values, got %d" % (name, len(fields), len(values)))
        for field, value in zip(fields, values):
            setattr(self, field, value)

    def __repr__(self):
        return "%s(%s)" % (name, ", ".join("%s=%r" % (field, getattr(self, field)) for field in fields))

    return type(name, (object,), {"__slots__": fields, "__init__": __init__, "__repr__": __repr__})


Change = record_type("Change", "path target patch_ids expected new_bytes new_sha")
Restore = record_type("Restore", "path target patch_ids expected restore force")
Original = record_type("Original", "data stat")


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


# -- paths ------------------------------------------------------------------------------------------------------


def open_repo(payload):
    """The real path of payload["repo"]; fault `no_repo` when it is not an existing directory."""
    raw = require_str(payload, "repo")
    path = os.path.expanduser(raw)
    if not os.path.isabs(path):
        raise bad_request("repo must be an absolute path, got %r" % raw)
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise AgentFault("no_repo", "repo %s does not exist or is not a directory" % raw)
    return real


def unsafe_path(rel, why):
    """The fault for a repo-relative path we refuse to touch."""
    return AgentFault("unsafe_path", "refusing path %r: %s" % (rel, why))


def check_relpath(rel):
    """Refuse anything but a plain, normalized path below the repo, outside ddops' and git's state."""
    if not isinstance(rel, str) or not rel:
        raise bad_request("file paths must be non-empty strings")
    if "\0" in rel:
        raise unsafe_path(rel, "it contains a NUL byte")
    if rel.startswith("/"):
        raise unsafe_path(rel, "it is absolute")
    parts = rel.split("/")
    if ".." in parts:
        raise unsafe_path(rel, "it contains '..'")
    if "" in parts or "." in parts or posixpath.normpath(rel) != rel:
        raise unsafe_path(rel, "it is not a normalized relative path")
    if parts[0] in PROTECTED_TOP_DIRS:
        raise unsafe_path(rel, "it is inside %s/" % parts[0])


def is_inside(path, root):
    """Whether real path `path` is `root` or below it."""
    return os.path.commonpath([path, root]) == root


def resolve_target(repo, rel):
    """The absolute path of repo-relative `rel`, refused if it could reach outside the repo."""
    check_relpath(rel)
    joined = os.path.join(repo, rel)
    parent = os.path.realpath(os.path.dirname(joined))
    if not is_inside(parent, repo):
        raise unsafe_path(rel, "it resolves outside the repo (through a symlinked directory)")
    target = os.path.join(parent, os.path.basename(joined))
    if os.path.islink(target):
        raise AgentFault("symlink", "refusing %s: it is a symlink (ddops never writes through symlinks)" % rel)
    return target


# -- reading --------------------------------------------------------------------------------------------------


def sha256_hex(data):
    """The hex sha256 of `data`."""
    # OpenSSL's hashlib costs a few ms to load and only pays that back on large inputs.
    if BUILTIN_SHA256 is not None and len(data) < 1 << 20:
        return BUILTIN_SHA256(data).hexdigest()
    return hashlib.sha256(data).hexdigest()


def read_regular(path, rel):
    """The file's bytes and stat as an Original, or None when it does not exist; faults for other kinds."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        raise AgentFault("symlink", "refusing %s: it is a symlink (ddops never writes through symlinks)" % rel)
    if not stat.S_ISREG(st.st_mode):
        raise AgentFault("not_file", "%s is not a regular file" % rel)
    if st.st_size > MAX_FILE_BYTES:
        raise AgentFault("too_large", "%s is %d bytes, over the %d byte limit" % (rel, st.st_size, MAX_FILE_BYTES))
    # O_NOFOLLOW: the file could have been swapped for a symlink since the lstat above.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
        st = os.fstat(handle.fileno())
    if len(data) > MAX_FILE_BYTES:
        raise AgentFault("too_large", "%s grew over the %d byte limit while being read" % (rel, MAX_FILE_BYTES))
    return Original(data, st)


def current_sha(original):
    """The sha256 of an Original, or None for a missing file."""
    return None if original is None else sha256_hex(original.data)


# -- writing --------------------------------------------------------------------------------------------------


def write_all(fd, data):
    """Write every byte of `data` to `fd` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(directory):
    """Make a rename in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:
        # Some filesystems cannot fsync a directory; the rename itself has still happened.
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def chown_quietly(fd, uid, gid):
    """Give the file the original's owner and group when we are allowed to; keep ours otherwise."""
    for wanted_uid in (uid, -1):
        try:
            os.fchown(fd, wanted_uid, gid)
            return
        except PermissionError:
            continue


def make_temp(directory, name):
    """(fd, path) of a new private file `.<name>.<random>.ddops-tmp` in `directory`, as tempfile.mkstemp makes
    them (O_EXCL, mode 0600, no symlink followed); the agent starts on every call and tempfile costs ~4 ms."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temp = os.path.join(directory, ".%s.%s%s" % (name, os.urandom(6).hex(), TEMP_SUFFIX))
        try:
            return os.open(temp, flags, 0o600), temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", os.path.join(directory, name))


def atomic_write(path, data, mode, owner=None, durable=True):
    """Replace `path` by `data` so that readers see the old bytes or the new ones, never a mix.

    durable: fsync the file and its directory, so that the new bytes survive a crash (not needed for notes that a
    crash makes moot anyway; each fsync costs a disk flush).
    """
    directory, name = os.path.split(path)
    fd, temp = make_temp(directory, name)
    try:
        try:
            write_all(fd, data)
            if owner is not None:
                chown_quietly(fd, owner[0], owner[1])
            # After fchown, which clears set-id bits.
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        fault_point("temp-written", path)
        os.replace(temp, path)
        fault_point("renamed", path)
    except BaseException as error:
        try:
            os.unlink(temp)
        except OSError:
            pass
        if isinstance(error, OSError) and not error.filename:
            raise OSError(error.errno, error.strerror, path) from None  # say which file could not be written
        raise
    if durable:
        fsync_dir(directory)


def default_file_mode():
    """The mode a new file gets under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_like(path, data, original):
    """atomic_write keeping the mode bits and owner of `original` (an Original or None)."""
    if original is None:
        atomic_write(path, data, default_file_mode())
    else:
        mode = stat.S_IMODE(original.stat.st_mode)
        atomic_write(path, data, mode, (original.stat.st_uid, original.stat.st_gid))


def verify_written(path, rel, expected_sha):
    """Re-read what we wrote and fault `verify_failed` if it is not what we meant to write."""
    found = current_sha(read_regular(path, rel))
    if found != expected_sha:
        raise AgentFault("verify_failed", "%s reads back as %s after writing %s" % (rel, found, expected_sha))


# -- state directory, backups, journal --------------------------------------------------------------------------


def state_dir(repo):
    """The path of the repo's `.ddops/` directory (which may not exist yet)."""
    return os.path.join(repo, STATE_DIR)


def make_private_dir(path):
    """Create `path` with mode 0700 unless it exists; refuse a symlink or non-directory there."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # the umask may have removed bits we want
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise AgentFault("unsafe_path", "%s exists and is not a directory (or is a symlink)" % path)


def ensure_state_dir(repo):
    """Create `.ddops/` and `.ddops/backups/` (mode 0700) and return the state directory."""
    state = state_dir(repo)
    make_private_dir(state)
    make_private_dir(os.path.join(state, "backups"))
    ensure_git_exclude(repo)
    return state


def git_exclude_path(repo):
    """The repo's info/exclude file, or None when the repo is not a git checkout."""
    dot_git = os.path.join(repo, ".git")
    if os.path.isdir(dot_git):
        return os.path.join(dot_git, "info", "exclude")
    if os.path.isfile(dot_git):
        # A worktree or submodule: only git knows where its common directory is.
        out = run_quiet(["git", "rev-parse", "--git-path", "info/exclude"], cwd=repo)
        return os.path.join(repo, out) if out else None
    return None


def ensure_git_exclude(repo):
    """Add `/.ddops/` to the checkout's info/exclude, once."""
    path = git_exclude_path(repo)
    if path is None:
        return
    try:
        with open(path, "rb") as handle:
            existing = handle.read()
    except FileNotFoundError:
        existing = b""
    if EXCLUDE_LINE.encode() in existing.splitlines():
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    separator = b"\n" if existing and not existing.endswith(b"\n") else b""
    with open(path, "ab") as handle:
        handle.write(separator + EXCLUDE_LINE.encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def backup_path(state, sha):
    """Where the backup of content `sha` lives."""
    return os.path.join(state, "backups", sha)


def read_backup_bytes(state, sha):
    """The bytes of backup `sha`, checked against their name."""
    try:
        with open(backup_path(state, sha), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise AgentFault("no_backup", "backup %s is missing from .ddops/backups" % sha) from None
    if sha256_hex(data) != sha:
        raise AgentFault("corrupt_backup", "backup %s in .ddops/backups does not match its hash" % sha)
    return data


def store_backup(state, data, sha):
    """Keep `data` as backup `sha`: written once, rewritten only if the stored copy is damaged."""
    try:
        read_backup_bytes(state, sha)
        return
    except AgentFault:
        pass
    atomic_write(backup_path(state, sha), data, 0o600)


def journal_path(state):
    """Where the append-only journal lives."""
    return os.path.join(state, "journal.jsonl")


def now_iso():
    """The current UTC time, ISO 8601 with milliseconds (`2026-01-31T12:00:00.123Z`; no datetime import)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%03dZ" % (int(now * 1000) % 1000)


def new_id():
    """A random id in the form of uuid.uuid4().hex (without importing uuid: the agent starts on every call)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


def journal_entries(event, who, rel, patch_ids, **fields):
    """One journal entry per patch id (one with patch null when there is none)."""
    entries = []
    for patch in patch_ids or [None]:
        entry = {"event": event, "patch": patch, "file": rel, "time": now_iso(), "id": new_id()}
        entry.update(who)
        entry.update(fields)
        entries.append(entry)
    return entries


def ends_without_newline(path):
    """Whether the file's last byte is not a newline (a torn earlier append)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except FileNotFoundError:
        return False


def append_journal(state, entries):
    """Append `entries` as JSON lines in one write, then fsync."""
    if not entries:
        return
    path = journal_path(state)
    blob = b"".join(to_json(entry, sort_keys=True).encode("utf-8") + b"\n" for entry in entries)
    if ends_without_newline(path):
        blob = b"\n" + blob  # keep our entries parseable after a torn line
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, blob)
            os.fsync(fd)
        except OSError as error:
            os.ftruncate(fd, size)  # undo a partial append (a full disk), rather than leave a torn line
            raise OSError(error.errno, error.strerror, path) from None
    finally:
        os.close(fd)


def read_journal(state):
    """(entries, corrupt): parsed journal objects, and {line, error} for lines that do not parse.

    The entries of a write whose agent was cut off after the rename but before its journal line are included, as
    that write's pending note describes them (see journalled_write), so readers see the file as it is.
    """
    landed = [entry for _, entries in pending_notes(state) for entry in entries]  # before the journal: no gap
    entries, corrupt = read_journal_lines(state)
    known = set(entry.get("id") for entry in entries)
    return entries + [entry for entry in landed if entry.get("id") not in known], corrupt


def read_journal_lines(state):
    """(entries, corrupt): the journal file's objects, and {line, error} for lines that do not parse."""
    entries, corrupt = [], []
    try:
        handle = open(journal_path(state), "rb")
    except FileNotFoundError:
        return entries, corrupt
    with handle:
        for number, line in enumerate(handle, 1):
            text = line.strip()
            if not text:
                continue
            try:
                entry = from_json(text.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as error:
                corrupt.append({"line": number, "error": str(error)})
                continue
            if isinstance(entry, dict):
                entries.append(entry)
            else:
                corrupt.append({"line": number, "error": "not a JSON object"})
    return entries, corrupt


def pending_notes(state):
    """(note path, entries) for every pending note: the entries if the note's write landed, else []."""
    notes = []
    repo = os.path.dirname(state)
    folder = os.path.join(state, "pending")
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        names = []
    for path in (os.path.join(folder, name) for name in names):
        try:
            with open(path, "rb") as handle:
                note = from_json(handle.read().decode("utf-8"))
            target = resolve_target(repo, note["file"])
            landed = current_sha(read_regular(target, note["file"])) == note["after"]
            entries = [entry for entry in note["entries"] if isinstance(entry, dict)] if landed else []
        except (OSError, ValueError, KeyError, TypeError, AgentFault):
            entries = []
        notes.append((path, entries))
    return notes


def settle_pending(state):
    """Under the lock: journal what cut-off writes that landed left unjournalled, then drop every pending note."""
    notes = pending_notes(state)
    known = set(entry.get("id") for entry in read_journal_lines(state)[0])
    append_journal(state, [entry for _, entries in notes for entry in entries if entry.get("id") not in known])
    for path, _ in notes:
        os.unlink(path)
    release_space(os.path.join(state, "reserve"))
    remove_stale_temps(os.path.join(state, "pending"))
    remove_stale_temps(os.path.join(state, "backups"))


def remove_stale_temps(directory, name=""):
    """Temp files a killed agent left in `directory` (beside `name` only, if given); callers hold the repo lock."""
    prefix = "." + (name + "." if name else "")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for stale in names:
        if stale.startswith(prefix) and stale.endswith(TEMP_SUFFIX):
            try:
                os.unlink(os.path.join(directory, stale))
            except OSError:
                pass


def journalled_write(state, target, rel, data, original, entries):
    """write_like, then journal `entries`; a pending note written first lets readers and the next call account for
    a write whose agent was cut off between the rename and the journal line (see read_journal, settle_pending)."""
    folder = os.path.join(state, "pending")
    make_private_dir(folder)
    note = os.path.join(folder, entries[0]["id"] + ".json")
    after = sha256_hex(data)
    atomic_write(note, to_json({"file": rel, "after": after, "entries": entries}).encode("utf-8"), 0o600)
    WRITE_TARGETS[target] = rel
    fault_point("pending", target)
    write_like(target, data, original)
    verify_written(target, rel, after)
    fault_point("before-journal", target)
    append_journal(state, entries)
    os.unlink(note)
    fault_point("journalled", target)


def refuse_unwritable(original, rel):
    """Fault `not_writable` unless we may write the file in place and can keep its owner (nothing written yet)."""
    st = original.stat
    mode = stat.S_IMODE(st.st_mode)
    owner = user_name(st.st_uid)
    if not mode & 0o222:
        raise AgentFault("not_writable", "%s is read-only (mode %04o, owner %s): nothing written; make it "
                                         "writable first if it should be patched" % (rel, mode, owner))
    if os.geteuid() != 0 and (st.st_uid != os.geteuid() or not mode & stat.S_IWUSR):
        raise AgentFault("not_writable", "%s belongs to %s (mode %04o): %s could not write it in place and keep "
                                         "its owner, so nothing was written" % (rel, owner, mode, current_user()))


# -- the repo lock --------------------------------------------------------------------------------------------


def lock_info_path(state):
    """Where the lock holder describes itself."""
    return os.path.join(state, "lock.info")


def read_lock_info(state):
    """The holder description in lock.info, or None when absent or unreadable."""
    try:
        with open(lock_info_path(state), "rb") as handle:
            info = from_json(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def describe_holder(info):
    """`<user>@<host> since <time> (pid N)` plus the actor, for the `locked` message."""
    if not info:
        return "an unknown holder (no readable .ddops/lock.info)"
    text = "%s@%s since %s (pid %s)" % (info.get("user"), info.get("host"), info.get("since"), info.get("pid"))
    if info.get("actor"):
        text += " for %s" % info["actor"]
    if info.get("verb"):
        text += " running %s" % info["verb"]
    return text


def lock_holder(state):
    """lock.info of whoever holds the repo lock right now, or None when it is free."""
    try:
        fd = os.open(os.path.join(state, "lock"), os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        # A shared probe fails exactly when someone holds the exclusive lock.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_lock_info(state) or {}
    finally:
        os.close(fd)
    return None


class RepoLock:
    """The exclusive flock on `.ddops/lock`, with lock.info saying who holds it."""

    def __init__(self, state, timeout, who, verb_name):
        self.state = state
        self.timeout = timeout
        self.info = {
            "user": current_user(),
            "host": os.uname().nodename,  # what socket.gethostname() says, without importing socket
            "pid": os.getpid(),
            "actor": who.get("actor"),
            "verb": verb_name,
        }
        self.fd = None

    def __enter__(self):
        fd = os.open(os.path.join(self.state, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    holder = describe_holder(read_lock_info(self.state))
                    raise AgentFault("locked", "locked by %s; gave up after %gs" % (holder, self.timeout)) from None
                time.sleep(LOCK_POLL_SECONDS)
        self.fd = fd
        self.info["since"] = now_iso()
        try:
            # Who holds the lock, for whoever waits on it: a crash releases the lock and makes the note moot.
            atomic_write(lock_info_path(self.state), to_json(self.info).encode("utf-8"), 0o600, durable=False)
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def release(self):
        """Forget lock.info and drop the lock."""
        try:
            # Removed while still holding the lock, so nobody reads a stale holder.
            os.unlink(lock_info_path(self.state))
        except FileNotFoundError:
            pass
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def lock_timeout(payload):
    """payload["lock_timeout"] in seconds (default 10)."""
    return optional_number(payload, "lock_timeout", DEFAULT_LOCK_TIMEOUT)


# -- fault injection, for tests ---------------------------------------------------------------------------------


def arm_faults(state, verb_name):
    """Load this verb's fault points from <repo>/.ddops/faults.json and delete it (one shot); absent normally."""
    path = os.path.join(state, "faults.json")
    FAULTS.clear()
    try:
        with open(path, "rb") as handle:
            table = from_json(handle.read().decode("utf-8"))
        os.unlink(path)
    except (OSError, ValueError):
        return
    if isinstance(table, dict) and isinstance(table.get(verb_name), dict):
        FAULTS.update(table[verb_name])


def fault_point(stage, target=None):
    """Do what an armed fault asks at this stage ("kill": cut the SSH connection and die; "drop": cut it only)."""
    if not FAULTS or (target is not None and target not in WRITE_TARGETS):
        return
    action = FAULTS.pop("%s:%s" % (stage, WRITE_TARGETS.get(target)), None) or FAULTS.pop(stage, None)
    if action in ("kill", "drop"):
        session = ssh_session_pid()
        if session is not None:
            os.kill(session, signal.SIGKILL)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


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
    try:
        os.killpg(process.pid, 9)
    except OSError:
        pass


def output_tail(data):
    """The last CHECK_OUTPUT_BYTES of `data`, decoded leniently."""
    return data[-CHECK_OUTPUT_BYTES:].decode("utf-8", "replace")


def run_check(repo, check):
    """Run one post check with /bin/sh in the repo: {name, ok, exit_code, output, timed_out, seconds}."""
    started = time.monotonic()
    process = subprocess.Popen(
        ["/bin/sh", "-c", check["command"]], cwd=repo, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    timed_out = False
    try:
        output, _ = process.communicate(timeout=check["timeout"])
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(process)
        output = collect_after_kill(process)
    exit_code = None if timed_out else process.returncode
    text = output_tail(output)
    if timed_out:
        text += "\n[ddops: timed out after %gs]" % check["timeout"]
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


# -- facts ----------------------------------------------------------------------------------------------------


def current_user():
    """The name of the user the agent runs as (its uid when it has no passwd entry)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or str(os.geteuid())


def user_name(uid):
    """The name of user `uid`, or the number when it has no passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def os_pretty_name():
    """PRETTY_NAME from os-release, or None."""
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("PRETTY_NAME="):
                value = line.split("=", 1)[1]
                try:
                    return " ".join(shlex.split(value))
                except ValueError:
                    return value.strip("\"'")
    return None


def parse_gpu_line(line):
    """One nvidia-smi CSV line as {name, memory_total_mib, driver_version}."""
    name, memory, driver = (part.strip() for part in line.rsplit(",", 2))
    digits = memory.split()[0] if memory else ""
    return {"name": name, "memory_total_mib": int(digits) if digits.isdigit() else None, "driver_version": driver}


def query_gpus():
    """(gpus, error): the GPUs nvidia-smi lists, [] without nvidia-smi; error says why a listing failed."""
    if shutil.which("nvidia-smi") is None:
        return [], None
    argv = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=20)
    except (OSError, subprocess.SubprocessError) as error:
        return [], "nvidia-smi: %s" % error
    text = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode != 0:
        return [], "nvidia-smi exit %d: %s" % (done.returncode, text.splitlines()[-1] if text else "")
    try:
        return [parse_gpu_line(line) for line in text.splitlines() if line.strip()], None
    except ValueError:
        return [], "nvidia-smi printed something unexpected: %s" % text[:200]


def nearest_existing(path):
    """`path` or its closest existing parent."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def disk_free_bytes(path):
    """Bytes available to us on the filesystem holding `path` (or its nearest existing parent)."""
    try:
        st = os.statvfs(nearest_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def distribution_version(name):
    """The installed version of distribution `name` without importing it, or None."""
    if sys.flags.no_site and "site" not in sys.modules:
        # The bootstrap starts Python with -S (faster); package versions need site-packages on sys.path.
        import site

        site.main()
    try:
        from importlib import metadata
    except ImportError:
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_head(repo):
    """HEAD of `repo` when it is a git checkout, else None."""
    if not os.path.exists(os.path.join(repo, ".git")):
        return None
    return run_quiet(["git", "rev-parse", "HEAD"], cwd=repo)


def collect_facts(raw_repo):
    """What the controller wants to know about this host before planning."""
    repo = os.path.realpath(os.path.expanduser(raw_repo)) if raw_repo else None
    repo_exists = bool(repo) and os.path.isdir(repo)
    gpus, gpu_error = query_gpus()
    return {
        "hostname": socket.gethostname(),
        "os": os_pretty_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "user": current_user(),
        "gpus": gpus,
        "gpu_error": gpu_error,
        "disk_free_bytes": disk_free_bytes(repo or os.path.expanduser("~")),
        "repo_exists": repo_exists,
        "git_commit": git_head(repo) if repo_exists else None,
        "versions": {"torch": distribution_version("torch"), "transformers": distribution_version("transformers")},
        "verbs": sorted(VERBS),
    }


@verb("facts")
def facts_verb(payload):
    """Host facts; `repo` is optional and need not exist."""
    return collect_facts(optional_str(payload, "repo"))


# -- snapshot -------------------------------------------------------------------------------------------------


def file_record(original, error=None):
    """One snapshot entry: {exists, sha256, mode, size, content_b64, error}."""
    if original is None:
        return {"exists": False, "sha256": None, "mode": None, "size": None, "content_b64": None, "error": error}
    return {
        "exists": True,
        "sha256": sha256_hex(original.data),
        "mode": stat.S_IMODE(original.stat.st_mode),
        "size": len(original.data),
        "content_b64": b64_text(original.data),
        "error": error,
    }


def snapshot_file(repo, rel):
    """The snapshot entry of one file; refusals and read errors become its `error`."""
    try:
        return file_record(read_regular(resolve_target(repo, rel), rel))
    except AgentFault as fault:
        exists = fault.kind in ("symlink", "not_file", "too_large")
        record = file_record(None, {"kind": fault.kind, "message": fault.message})
        record["exists"] = exists
        return record
    except OSError as error:
        return file_record(None, {"kind": "io", "message": "%s: %s" % (rel, error.strerror or error)})


@verb("snapshot")
def snapshot_verb(payload):
    """Files with hashes and contents, the journal and the lock holder, in one call."""
    repo = open_repo(payload)
    files = require_list(payload, "files")
    if not all(isinstance(rel, str) for rel in files):
        raise bad_request("payload.files must be a list of strings")
    state = state_dir(repo)
    entries, corrupt = read_journal(state)
    return {
        "repo": repo,
        "files": {rel: snapshot_file(repo, rel) for rel in files},
        "journal": entries,
        "journal_corrupt": corrupt,
        "lock": lock_holder(state),
        "facts": collect_facts(repo) if payload.get("facts") else None,
    }


# -- commit ---------------------------------------------------------------------------------------------------


def parse_change(repo, raw, index):
    """One validated `changes[i]` as a Change."""
    where = "changes[%d]" % index
    require_object(raw, where)
    rel = require_str(raw, "path", where)
    new_bytes = decode_b64(raw, "new_content_b64", where)
    new_sha = require_sha(raw, "new_sha256", where)
    if sha256_hex(new_bytes) != new_sha:
        raise bad_request("%s (%s): new_content_b64 does not hash to new_sha256" % (where, rel))
    if len(new_bytes) > MAX_FILE_BYTES:
        raise AgentFault("too_large", "new content of %s is over the %d byte limit" % (rel, MAX_FILE_BYTES))
    target = resolve_target(repo, rel)
    return Change(rel, target, require_patch_ids(raw, where), require_sha(raw, "expected_sha256", where),
                  new_bytes, new_sha)


def parse_changes(repo, payload):
    """payload["changes"] as Changes, every path validated before anything is touched."""
    changes = [parse_change(repo, raw, index) for index, raw in enumerate(require_list(payload, "changes"))]
    paths = [change.path for change in changes]
    if len(set(paths)) != len(paths):
        raise bad_request("payload.changes names the same file twice")
    return changes


def read_originals(changes):
    """The current bytes of every file, faulting `conflict` when one is not what the plan was made from (or
    `not_writable` when it could not be replaced keeping its owner)."""
    originals = {}
    for change in changes:
        original = read_regular(change.target, change.path)
        found = current_sha(original)
        if found != change.expected:
            state = "is missing" if found is None else "has sha256 %s" % found
            raise AgentFault("conflict", "%s changed since it was read: expected sha256 %s, it now %s"
                             % (change.path, change.expected, state))
        refuse_unwritable(original, change.path)
        remove_stale_temps(os.path.dirname(change.target), os.path.basename(change.target))
        originals[change.path] = original
    return originals


def apply_change(state, change, original, who):
    """Back the original up, write the new bytes in its place, check them, journal it."""
    store_backup(state, original.data, change.expected)
    journalled_write(state, change.target, change.path, change.new_bytes, original,
                     journal_entries("apply", who, change.path, change.patch_ids,
                                     before=change.expected, after=change.new_sha))


def restore_original(state, change, original, who):
    """Put the backed-up original bytes back after a failed check or write, and journal the revert."""
    before = current_sha(read_regular(change.target, change.path))
    if before == change.expected:
        return  # its write never landed: nothing to put back
    data = read_backup_bytes(state, change.expected)
    journalled_write(state, change.target, change.path, data, original,
                     journal_entries("revert", who, change.path, change.patch_ids,
                                     before=before, after=change.expected))


def revert_all(state, written, originals, who):
    """Restore every written file, newest first."""
    for change in reversed(written):
        restore_original(state, change, originals[change.path], who)


def write_changes(state, changes, originals, who):
    """Apply every change; if one fails, put the ones already written back before reporting it."""
    reserve = reserve_space(state, sum(len(originals[change.path].data) + 8192 for change in changes))
    written = []
    try:
        for change in changes:
            written.append(change)  # first: a write that fails half way is put back too
            apply_change(state, change, originals[change.path], who)
    except BaseException as error:
        release_space(reserve)
        try:
            revert_all(state, written, originals, who)
        except Exception as revert_error:
            raise AgentFault("io", "%s; restoring the files already written also failed: %s"
                             % (describe_error(error), describe_error(revert_error))) from error
        raise
    release_space(reserve)
    return written


def reserve_space(state, size):
    """Hold `size` bytes in .ddops/reserve while a commit writes: freed before putting originals back, so that a
    disk filling up cannot stop a revert half way. None where the filesystem cannot preallocate."""
    path = os.path.join(state, "reserve")
    if not hasattr(os, "posix_fallocate"):
        return None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        release_space(path)
        if error.errno != errno.ENOSPC:
            return None
        raise AgentFault("io", "No space left on device: %s needs about %d KiB free to write the patched files and "
                               "to be sure it can put the originals back; nothing was written"
                         % (os.path.dirname(state), size // 1024 + 1)) from None
    finally:
        os.close(fd)
    return path


def release_space(path):
    """Give back what reserve_space held."""
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@verb("commit")
def commit_verb(payload):
    """Compare-and-swap write with backups and journal, then post checks; revert all if one fails."""
    repo = open_repo(payload)
    who = identity(payload)
    changes = parse_changes(repo, payload)
    checks = parse_post_checks(payload)
    timeout = lock_timeout(payload)
    state = ensure_state_dir(repo)
    arm_faults(state, "commit")
    with RepoLock(state, timeout, who, "commit"):
        fault_point("locked")
        settle_pending(state)
        originals = read_originals(changes)
        written = write_changes(state, changes, originals, who)
        results = [run_check(repo, check) for check in checks]
        reverted = not all(result["ok"] for result in results)
        if reverted and written:
            revert_all(state, written, originals, who)
    return {"written": [change.path for change in written], "checks": results, "reverted": reverted and bool(written)}


# -- rollback -------------------------------------------------------------------------------------------------


def parse_restore(repo, raw, index):
    """One validated `restores[i]` as a Restore."""
    where = "restores[%d]" % index
    require_object(raw, where)
    rel = require_str(raw, "path", where)
    expected = raw.get("expected_sha256")
    if expected is not None:
        expected = require_sha(raw, "expected_sha256", where)
    return Restore(rel, resolve_target(repo, rel), require_patch_ids(raw, where), expected,
                   require_sha(raw, "restore_sha256", where), bool(raw.get("force", False)))


def rollback_one(state, restore, who, result):
    """Restore one file from its backup, or record why not; the result lists are filled in place."""
    original = read_regular(restore.target, restore.path)
    found = current_sha(original)
    entries = journal_entries("rollback", who, restore.path, restore.patch_ids, before=found, after=restore.restore)
    if found == restore.restore:
        # Already the original (restored by hand): journal it, so that the journal stops calling it applied.
        append_journal(state, entries)
        result["unchanged"].append(restore.path)
        return
    if found != restore.expected and not restore.force:
        reason = "missing" if found is None else "modified"
        result["refused"].append({"path": restore.path, "reason": reason, "current_sha256": found})
        return
    data = read_backup_bytes(state, restore.restore)
    if original is not None:
        refuse_unwritable(original, restore.path)
        remove_stale_temps(os.path.dirname(restore.target), os.path.basename(restore.target))
    if found != restore.expected and original is not None:
        store_backup(state, original.data, found)
        append_journal(state, journal_entries("save-foreign", who, restore.path, [], sha256=found,
                                              expected=restore.expected))
        result["saved"].append({"path": restore.path, "sha256": found})
    journalled_write(state, restore.target, restore.path, data, original, entries)
    result["restored"].append(restore.path)


@verb("rollback")
def rollback_verb(payload):
    """Restore files from backups; edited files are refused unless forced (then the edit is saved first)."""
    repo = open_repo(payload)
    who = identity(payload)
    restores = [parse_restore(repo, raw, index) for index, raw in enumerate(require_list(payload, "restores"))]
    timeout = lock_timeout(payload)
    state = ensure_state_dir(repo)
    result = {"restored": [], "refused": [], "saved": [], "unchanged": [], "failed": []}
    arm_faults(state, "rollback")
    with RepoLock(state, timeout, who, "rollback"):
        fault_point("locked")
        settle_pending(state)
        for restore in restores:
            try:
                rollback_one(state, restore, who, result)
            except AgentFault as fault:
                result["failed"].append({"path": restore.path, "kind": fault.kind, "message": fault.message})
            except OSError as error:
                result["failed"].append({"path": restore.path, "kind": "io", "message": describe_error(error)})
    return result


# -- backups and journal on their own ---------------------------------------------------------------------------


@verb("read_backup")
def read_backup_verb(payload):
    """The bytes of one backup, by its sha256."""
    repo = open_repo(payload)
    sha = require_sha(payload, "sha256")
    data = read_backup_bytes(state_dir(repo), sha)
    return {"sha256": sha, "size": len(data), "content_b64": b64_text(data)}


@verb("journal")
def journal_verb(payload):
    """The parsed journal; lines that do not parse are listed, not fatal."""
    entries, corrupt = read_journal(state_dir(open_repo(payload)))
    return {"entries": entries, "corrupt": corrupt}


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
        request = from_json(raw.decode("utf-8"))
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
        return to_json(response) + "\n"
    except (TypeError, ValueError) as error:
        return to_json(failure("internal", "result is not JSON: %s" % error)) + "\n"


# -- resident: staying on between sessions -------------------------------------------------------------------
# Starting Python and loading the agent is most of the host's share of a short command. So an agent started with
# --linger forks, once its session ends, a resident server on a unix socket in a directory only this user can
# enter; ddops' next sessions reach it through sshd (a direct-streamlocal channel) and start nothing. It forks
# a process per session, which loads a fresh agent per request as the bootstrap does, and it exits after
# `linger` idle seconds. Its socket name carries the agent's hash: a new ddops version starts a new resident.

RESIDENT_BACKLOG = 64
MAX_UNIX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux, fewer elsewhere


def resident_socket_path(digest):
    """Where the resident for this agent version and Python listens; None when no usable path exists."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        folder = os.path.join(runtime, "ddops")
    else:
        folder = os.path.join(os.path.expanduser("~"), ".cache", "ddops", "run")
    name = "agent-%s-%s.sock" % (digest[:16], sha256_hex(sys.executable.encode("utf-8", "replace"))[:8])
    path = os.path.join(folder, name)
    return path if os.path.isabs(path) and len(path.encode("utf-8")) <= MAX_UNIX_SOCKET_PATH else None


def resident_alive(path):
    """Whether a resident accepts connections on `path` now (one that is sent nothing just ends the session)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2.0)
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def private_directory(folder):
    """Make `folder` (mode 0700) if needed; whether it is a real directory of ours that nobody else can enter."""
    try:
        os.makedirs(folder, 0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def become_resident(path, linger, load):
    """Fork the resident server for socket `path` and return at once; the caller goes on to exit.

    The server detaches from the session (its own session, standard streams on /dev/null) so that sshd can close
    the channel of the session that started it.
    """
    sys.stdout.flush()
    if os.fork() != 0:
        return
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        serve_resident(path, linger, load)
    finally:
        os._exit(0)


def serve_resident(path, linger, load):
    """Accept sessions on unix socket `path` until none came for `linger` seconds; return if another serves it."""
    if not private_directory(os.path.dirname(path)):
        return
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # a resident for this version already serves (we hold no lock: nothing to clean up)
    try:
        os.unlink(path)  # a socket left by a resident that was killed
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        server.bind(path)
    finally:
        os.umask(umask)
    server.listen(RESIDENT_BACKLOG)
    bound = os.stat(path).st_ino
    sessions = set()
    # Reap each session process as it ends rather than at the next accept (until then it would be a zombie).
    signal.signal(signal.SIGCHLD, lambda number, frame: reap_sessions(sessions))
    idle_until = time.monotonic() + linger
    while True:
        reap_sessions(sessions)
        remaining = idle_until - time.monotonic()
        if remaining <= 0:
            break
        server.settimeout(min(remaining, 5.0))
        try:
            connection, _ = server.accept()
        except (socket.timeout, InterruptedError):
            continue
        sessions.add(fork_resident_session(server, connection, load))
        idle_until = time.monotonic() + linger
    # Take the name away first, then serve whoever connected before that: no session is left unanswered.
    try:
        if os.stat(path).st_ino == bound:
            os.unlink(path)
    except OSError:
        pass
    server.setblocking(False)
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            break
        connection.setblocking(True)
        sessions.add(fork_resident_session(server, connection, load))
    server.close()
    os.close(lock)


def reap_sessions(sessions):
    """Collect the exit status of the session processes that have ended."""
    for pid in list(sessions):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            sessions.discard(pid)


def fork_resident_session(server, connection, load):
    """Serve one connection in a child process; the pid of that child."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's reaper is not ours
            server.close()
            serve_connection(connection, load)
        finally:
            os._exit(0)
    connection.close()
    return pid


def peer_credentials(connection):
    """(pid, uid) of the process at the other end of a unix socket, or (None, None) where the OS does not say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None, None
    import struct
    pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return pid, uid


def serve_connection(connection, load):
    """One session on the resident: a JSON request per line in, a JSON answer per line out, until EOF."""
    pid, uid = peer_credentials(connection)
    if uid is not None and uid != os.getuid():
        return  # sshd connects as the user it logged in; anyone else is refused without a word
    # The greeting, an empty line: a session that ends without one was never served, so the controller may send
    # its request to an agent of its own instead (a resident killed as it connected).
    connection.sendall(b"\n")
    reader = connection.makefile("rb")
    while True:
        line = reader.readline()
        if not line:
            break
        namespace = load()  # as in the bootstrap: every request gets a freshly loaded agent
        namespace["SSH_SESSION_PID"] = pid
        answer_line = namespace["encode_response"](namespace["answer"](line))
        connection.sendall(answer_line.encode("utf-8"))


def main():
    """Read one request from stdin, print one JSON answer on stdout, exit 0."""
    response = answer(sys.stdin.buffer.read())
    sys.stdout.write(encode_response(response))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
