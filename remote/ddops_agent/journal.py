"""The repo's .ddops/ state: backups, the append-only journal, pending notes, the repo lock, reserved space."""

import errno
import fcntl
import json
import os
import stat
import time
import uuid
from contextlib import suppress

from ddops_agent.checks import run_quiet
from ddops_agent.facts import current_user, user_name
from ddops_agent.files import (STATE_DIR, TEMP_SUFFIX, atomic_write, current_sha, make_private_dir, read_regular,
                               remove_file, resolve_target, sha256_hex, verify_written, write_all, write_like)
from ddops_agent.protocol import AgentFault, fault_hook, fault_point, optional_number, within_deadline

DEFAULT_LOCK_TIMEOUT = 10.0
LOCK_POLL_SECONDS = 0.05
EXCLUDE_LINE = "/.ddops/"


# -- state directory, backups, journal --------------------------------------------------------------------------


def state_dir(repo):
    """The path of the repo's `.ddops/` directory (which may not exist yet)."""
    return os.path.join(repo, STATE_DIR)


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
    with suppress(AgentFault):
        read_backup_bytes(state, sha)
        return
    atomic_write(backup_path(state, sha), data, 0o600)


def journal_path(state):
    """Where the append-only journal lives."""
    return os.path.join(state, "journal.jsonl")


def now_iso():
    """The current UTC time, ISO 8601 with milliseconds (`2026-01-31T12:00:00.123Z`)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%03dZ" % (int(now * 1000) % 1000)


def new_id():
    """A random id for a journal entry."""
    return uuid.uuid4().hex


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
    blob = b"".join(json.dumps(entry, sort_keys=True).encode("utf-8") + b"\n" for entry in entries)
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


# The events this agent writes (ddops/patching/journal.py reads the same four); others are a newer ddops's.
KNOWN_EVENTS = ("apply", "rollback", "revert", "save-foreign")
JOURNAL_NAME = STATE_DIR + "/journal.jsonl"
UNKNOWN_EVENT = "unknown event"
# What compaction writes in the place of a line it could not read (the line itself stays in the rotated file).
UNREADABLE_EVENT = "unreadable"


def entry_problem(entry):
    """What is wrong with a journal object, None when nothing is, or UNKNOWN_EVENT for an event of a newer ddops."""
    event = entry.get("event")
    if not isinstance(event, str) or not event:
        return "`event` must be a non-empty string"
    if event not in KNOWN_EVENTS:
        return UNKNOWN_EVENT
    if not isinstance(entry.get("file"), str) or not entry["file"]:
        return "a %s entry needs `file`, a non-empty string" % event
    for key in ("patch", "before", "after", "id", "time"):
        value = entry.get(key)
        if value is not None and not isinstance(value, str):
            return "`%s` must be a string or null, not %s" % (key, type(value).__name__)
    if event == "apply" and not (entry.get("patch") and entry.get("after")):
        return "an apply entry needs `patch` and `after`"
    return None


def read_journal(state):
    """(entries, corrupt): the journal's entries, and {line, error} for lines that do not parse.

    The entries of a write whose agent was cut off after the rename but before its journal line are included, as
    that write's pending note describes them (see journalled_write), so readers see the file as it is. Entries of
    events a newer ddops may write are skipped; a malformed entry of a known event is refused (fault `bad_journal`,
    naming its line), never half read."""
    landed = [entry for _, entries in pending_notes(state) for entry in entries]  # before the journal: no gap
    entries, corrupt = read_journal_lines(state)
    known = set(entry.get("id") for entry in entries if isinstance(entry.get("id"), str))
    entries = entries + [entry for entry in landed if isinstance(entry.get("id"), str) and entry["id"] not in known]
    # read_journal_lines refused every malformed entry of a known event, and pending_notes kept sound entries only:
    # what is left to drop is a newer ddops's events and unreadable-line markers, which is what `event` says
    # (checking each entry again cost as much as reading it).
    return [entry for entry in entries if entry.get("event") in KNOWN_EVENTS], corrupt


PARTIAL_KEYS = ("event", "file", "before", "after")  # of a torn line that is not a whole entry, as far as it goes


def salvage_torn_line(text):
    """The complete `"key": value` pairs at the start of a cut-off JSON object line, as a dict ({} if none).

    Our lines are written by json.dumps(sort_keys=True): a line cut short (a power cut after a partial append)
    still holds every pair before the cut, and an apply's file, patch and hashes say which backup undoes it."""
    decoder = json.JSONDecoder()
    pairs = {}
    position = text.find("{") + 1
    if position == 0:
        return pairs
    while True:
        while position < len(text) and text[position] in " ,":
            position += 1
        try:
            key, position = decoder.raw_decode(text, position)
            while position < len(text) and text[position] in " :":
                position += 1
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            return pairs
        # A number cut short would still decode, as another number: only strings and null are ever taken.
        if not isinstance(key, str) or not (value is None or isinstance(value, str)):
            return pairs
        pairs[key] = value


def read_journal_lines(state):
    """(entries, corrupt): the journal file's objects, and {line, error} for lines that do not parse.

    A torn line whose pairs still make a whole entry (see salvage_torn_line) is read as that entry, marked `torn`,
    and listed among the corrupt lines all the same (`salvaged`), so that status says so."""
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
                entry = json.loads(text.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as error:
                salvaged = salvage_torn_line(text.decode("utf-8", "replace"))
                whole = bool(salvaged) and entry_problem(salvaged) is None
                corrupt.append({"line": number, "error": str(error), "salvaged": whole})
                if not whole:  # what the pairs still say (a line cut before its patch id names file and hashes)
                    corrupt[-1].update((key, value) for key, value in salvaged.items()
                                       if key in PARTIAL_KEYS and isinstance(value, str))
                if whole:
                    salvaged["torn"] = True
                    entries.append(salvaged)
                continue
            if not isinstance(entry, dict):
                corrupt.append({"line": number, "error": "not a JSON object", "salvaged": False})
                continue
            if entry.get("event") == UNREADABLE_EVENT:  # a line compaction could not read, kept in the rotated file
                corrupt.append({"line": number, "error": "%s (line %s of %s/%s, where it is kept)" % (
                    entry.get("error"), entry.get("line"), STATE_DIR, entry.get("rotated")), "salvaged": False})
                entries.append(entry)
                continue
            problem = entry_problem(entry)
            if problem not in (None, UNKNOWN_EVENT):
                raise AgentFault("bad_journal", "%s line %d: %s: nothing was read or written; fix or remove that "
                                                "line" % (JOURNAL_NAME, number, problem))
            entries.append(entry)
    return entries, corrupt


# -- compaction -------------------------------------------------------------------------------------------------

# A journal bigger than this is compacted by the commit or rollback that finds it so: every status, patch and
# rollback reads all of it (what an unbounded one cost: benchmarks/journal-compaction/RESULTS.md).
COMPACT_BYTES = 512 * 1024
ROTATED_DIR = "journal-old"


def live_entries(entries):
    """The entries that still decide something, in journal order: each application not undone (with the applies of
    the same patch it continues), each file's last write, every saved foreign edit (`ddops backups`) and every
    unreadable-line marker.

    Replayed, they give what the whole journal gives to ddops/patching/journal.py: the same active applications, in
    the same order, and the same last written hash per file."""
    active, last_write, always = {}, {}, []
    for index, entry in enumerate(entries):
        event, rel = entry.get("event"), entry.get("file")
        if event == "apply":
            chain = active.get((entry.get("patch"), rel), [])
            # Applied again over what it wrote itself (a newer version of it): the application goes on from the first.
            continues = chain and entries[chain[-1]].get("after") == entry.get("before")
            active[(entry.get("patch"), rel)] = (chain if continues else []) + [index]
        elif event in ("rollback", "revert"):
            for key in [k for k in active if k[1] == rel and (not entry.get("patch") or k[0] == entry.get("patch"))]:
                del active[key]
        elif event in ("save-foreign", UNREADABLE_EVENT):
            always.append(index)
        if event in ("apply", "rollback", "revert") and "after" in entry:  # after null: the write removed the file
            last_write[rel] = index
    keep = set(i for chain in active.values() for i in chain) | set(last_write.values()) | set(always)
    return [entries[index] for index in sorted(keep)]


def compact_journal(state):
    """Under the lock, once the journal is over COMPACT_BYTES: keep its whole self as a rotated file and put in its
    place a checkpoint of the live state (live_entries), written atomically. None when there was nothing to do.

    Every stage leaves a journal that says the same: before the rename the old one (the rotated name is a hard link
    to it, which the next compaction drops if it was cut off), after it the checkpoint. Appends only ever happen
    under the lock, so none can land in between."""
    path = journal_path(state)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None
    if size <= COMPACT_BYTES:
        return None
    entries, corrupt = read_journal_lines(state)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = "%s/journal-%s-%s.jsonl" % (ROTATED_DIR, stamp, new_id()[:8])
    markers = [{"event": UNREADABLE_EVENT, "line": c["line"], "error": c["error"], "rotated": name,
                "time": now_iso(), "id": new_id()} for c in corrupt if not c.get("salvaged")]
    live = live_entries(entries) + markers
    blob = b"".join(json.dumps(entry, sort_keys=True).encode("utf-8") + b"\n" for entry in live)
    if len(blob) > size // 2:
        return None  # mostly live already: compacting would not pay for itself
    fault_point("compact-planned")
    folder = os.path.join(state, ROTATED_DIR)
    make_private_dir(folder)
    drop_links_to(folder, os.stat(path))
    os.link(path, os.path.join(state, name))
    fault_point("compact-rotated")
    atomic_write(path, blob, 0o600)
    fault_point("compact-written")
    return {"entries": len(entries), "kept": len(live), "rotated": STATE_DIR + "/" + name}


def drop_links_to(folder, journal_stat):
    """Remove rotated names that are the live journal itself (a compaction cut off before its rename)."""
    for name in os.listdir(folder):
        try:
            found = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        if (found.st_dev, found.st_ino) == (journal_stat.st_dev, journal_stat.st_ino):
            os.unlink(os.path.join(folder, name))


def compact_quietly(state):
    """compact_journal after a write verb's work is done: a compaction that fails leaves the journal as it was, and
    must not turn that verb's success into an error."""
    try:
        return compact_journal(state)
    except (AgentFault, OSError):
        return None


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
                note = json.loads(handle.read().decode("utf-8"))
            target = resolve_target(repo, note["file"])
            landed = current_sha(read_regular(target, note["file"])) == note["after"]
            entries = [entry for entry in note["entries"]
                       if isinstance(entry, dict) and entry_problem(entry) is None] if landed else []
        except (OSError, ValueError, KeyError, TypeError, AgentFault):
            entries = []
        notes.append((path, entries))
    return notes


def settle_pending(state):
    """Under the lock: journal what cut-off writes that landed left unjournalled, then drop every pending note."""
    notes = pending_notes(state)
    landed = [entry for _, entries in notes for entry in entries]
    if landed:  # the journal is read only when there is something to add to it: it grows with every command
        known = set(entry.get("id") for entry in read_journal_lines(state)[0] if isinstance(entry.get("id"), str))
        append_journal(state, [entry for entry in landed if entry.get("id") not in known])
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
            with suppress(OSError):
                os.unlink(os.path.join(directory, stale))


def journalled_write(state, target, rel, data, original, entries):
    """write_like (data None: remove the file), then journal `entries`; a pending note written first lets readers
    and the next call account for a write whose agent was cut off between the rename and the journal line (see
    read_journal, settle_pending)."""
    folder = os.path.join(state, "pending")
    make_private_dir(folder)
    note = os.path.join(folder, entries[0]["id"] + ".json")
    after = sha256_hex(data) if data is not None else None
    atomic_write(note, json.dumps({"file": rel, "after": after, "entries": entries}).encode("utf-8"), 0o600)
    fault_hook("note_write_target", target, rel)
    fault_point("pending", target)
    if data is None:
        remove_file(target)
    else:
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
    # Names are looked up only to say why not: each lookup reads the passwd database.
    if not mode & 0o222:
        raise AgentFault("not_writable", "%s is read-only (mode %04o, owner %s): nothing written; make it "
                                         "writable first if it should be patched" % (rel, mode, user_name(st.st_uid)))
    if os.geteuid() != 0 and (st.st_uid != os.geteuid() or not mode & stat.S_IWUSR):
        raise AgentFault("not_writable", "%s belongs to %s (mode %04o): %s could not write it in place and keep "
                                         "its owner, so nothing was written"
                         % (rel, user_name(st.st_uid), mode, current_user()))


# -- the repo lock --------------------------------------------------------------------------------------------


def lock_info_path(state):
    """Where the lock holder describes itself."""
    return os.path.join(state, "lock.info")


def read_lock_info(state):
    """The holder description in lock.info, or None when absent or unreadable."""
    try:
        with open(lock_info_path(state), "rb") as handle:
            info = json.loads(handle.read().decode("utf-8"))
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
            "host": os.uname().nodename,
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
            atomic_write(lock_info_path(self.state), json.dumps(self.info).encode("utf-8"), 0o600, durable=False)
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
    """payload["lock_timeout"] in seconds (default 10), no longer than what is left of the request's deadline."""
    return within_deadline(optional_number(payload, "lock_timeout", DEFAULT_LOCK_TIMEOUT))


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
        with suppress(FileNotFoundError):
            os.unlink(path)
