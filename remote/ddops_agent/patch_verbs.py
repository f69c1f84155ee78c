"""The patch verbs: snapshot, commit, rollback, read_backup, journal."""

import collections
import os
import stat

from ddops_agent.checks import parse_post_checks, run_check
from ddops_agent.facts import collect_facts, requested_versions
from ddops_agent.files import MAX_FILE_BYTES, current_sha, open_repo, read_regular, resolve_target, sha256_hex
from ddops_agent.journal import (RepoLock, append_journal, compact_quietly, ensure_state_dir, journal_entries,
                                 journalled_write, live_entries, lock_holder, lock_timeout, read_backup_bytes,
                                 read_journal, refuse_unwritable, release_space, remove_stale_temps, reserve_space,
                                 settle_pending, state_dir, store_backup)
from ddops_agent.protocol import (AgentFault, b64_text, bad_request, decode_b64, describe_error, fault_hook,
                                  fault_point, identity, optional_sha, require_list, require_object, require_patch_ids,
                                  require_sha, require_str, verb)

Change = collections.namedtuple("Change", "path target patch_ids expected new_bytes new_sha")
Restore = collections.namedtuple("Restore", "path target patch_ids expected restore force")


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
    """Files with hashes and contents, the journal's live entries and the lock holder, in one call.

    Live entries (what a compaction keeps) give every reader of a snapshot what the whole journal gives: the
    applications in place, each file's last write, the saved edits. The history grows with every patch and rollback
    (up to the 512 KiB that compaction allows), and went to the controller with every snapshot, to be parsed there,
    for every host and command; the `journal` verb still returns all of it."""
    repo = open_repo(payload)
    files = require_list(payload, "files")
    if not all(isinstance(rel, str) for rel in files):
        raise bad_request("payload.files must be a list of strings")
    state = state_dir(repo)
    entries, corrupt = read_journal(state)
    return {
        "repo": repo,
        "files": {rel: snapshot_file(repo, rel) for rel in files},
        "journal": live_entries(entries),
        "journal_corrupt": corrupt,
        "lock": lock_holder(state),
        "facts": collect_facts(repo) if payload.get("facts") else None,
        "versions": requested_versions(payload),  # packages' versions alone (patch --check: transformers)
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
    return Change(rel, target, require_patch_ids(raw, where), optional_sha(raw, "expected_sha256", where),
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
    seen = {}
    for change in changes:
        original = read_regular(change.target, change.path)
        # Two names of one file (`b/x.py` with `b -> a`, or hard links) would both pass the compare-and-swap
        # below, and the second write would land on the first's result.
        inode = None if original is None else (original.stat.st_dev, original.stat.st_ino)
        if inode is not None and inode in seen:
            raise AgentFault("unsafe_path", "%s and %s are the same file (a symlinked directory or a hard link): "
                                            "nothing written" % (seen[inode], change.path))
        seen[inode] = change.path
        found = current_sha(original)
        if found != change.expected:
            state = "is missing" if found is None else "has sha256 %s" % found
            raise AgentFault("conflict", "%s changed since it was read: expected sha256 %s, it now %s"
                             % (change.path, change.expected, state))
        if original is not None:
            refuse_unwritable(original, change.path)
        elif not os.path.isdir(os.path.dirname(change.target)):
            raise AgentFault("io", "%s: its folder does not exist (ddops creates files, not folders): nothing "
                                   "written" % change.path)
        remove_stale_temps(os.path.dirname(change.target), os.path.basename(change.target))
        originals[change.path] = original
    return originals


def apply_change(state, change, original, who):
    """Back the original up (none for a file it creates), write the new bytes in its place, check them, journal it."""
    if original is not None:
        store_backup(state, original.data, change.expected)
    # Compare-and-swap once more right before this write: the first check was made before any file was written,
    # and what was written since (or anyone else) may have changed this one.
    found = current_sha(read_regular(change.target, change.path))
    if found != change.expected:
        state_now = "is missing" if found is None else "has sha256 %s" % found
        raise AgentFault("conflict", "%s changed while the commit ran: expected sha256 %s, it now %s"
                         % (change.path, change.expected, state_now))
    journalled_write(state, change.target, change.path, change.new_bytes, original,
                     journal_entries("apply", who, change.path, change.patch_ids,
                                     before=change.expected, after=change.new_sha))


def restore_original(state, change, original, who):
    """Put the backed-up original bytes back after a failed check or write, and journal the revert."""
    before = current_sha(read_regular(change.target, change.path))
    if before != change.new_sha:
        # Its write never landed, or someone else wrote the file since (the check right before each write found
        # it changed): nothing of ours to put back, and a foreign edit is not ours to overwrite.
        return
    data = read_backup_bytes(state, change.expected) if change.expected else None  # None: it created the file
    journalled_write(state, change.target, change.path, data, original,
                     journal_entries("revert", who, change.path, change.patch_ids,
                                     before=before, after=change.expected))


def revert_all(state, written, originals, who):
    """Restore every written file, newest first; each is tried even after one failed (the first error is raised)."""
    failure = None
    for change in reversed(written):
        try:
            restore_original(state, change, originals[change.path], who)
        except (AgentFault, OSError) as error:
            failure = failure or error
    if failure is not None:
        raise failure


def file_state(change):
    """What `change`'s file holds now, in words: `still patched`, `restored`, or what else."""
    try:
        found = current_sha(read_regular(change.target, change.path))
    except (AgentFault, OSError) as error:
        return "%s unreadable (%s)" % (change.path, describe_error(error))
    if found == change.new_sha:
        return "%s still patched" % change.path
    if found == change.expected:
        return "%s restored" % change.path
    return "%s %s" % (change.path, "missing" if found is None else "holds sha256 %s, neither the original nor the "
                                                                  "patched file" % found)


def put_back(state, written, originals, who, reserve, why):
    """Free the reserve (the room the originals need) and restore every written file; fault `revert_failed`,
    naming what each file holds now, when that fails too."""
    release_space(reserve)
    try:
        revert_all(state, written, originals, who)
    except (AgentFault, OSError) as error:
        raise AgentFault("revert_failed", "%s; putting the originals back failed (%s): %s"
                         % (why, describe_error(error), ", ".join(file_state(change) for change in written))) from None


def write_changes(state, changes, originals, who):
    """Apply every change; if one fails, put the ones already written back before reporting it.

    (written, reserve): the disk held back stays held until the post checks have passed or the files are put back
    (release_space or put_back), so that a check that fills the disk cannot take the room the revert needs."""
    reserve = reserve_space(state, sum(len(getattr(originals[change.path], "data", b"")) + 8192 for change in changes))
    written = []
    try:
        for change in changes:
            written.append(change)  # first: a write that fails half way is put back too
            apply_change(state, change, originals[change.path], who)
    except BaseException as error:
        put_back(state, written, originals, who, reserve, describe_error(error))
        raise
    return written, reserve


def run_post_checks(state, repo, checks, written, originals, who, reserve):
    """Every post check's result; if one fails, every written file is put back (then the reserve is freed)."""
    try:
        results = [run_check(repo, check) for check in checks]
    except BaseException as error:
        put_back(state, written, originals, who, reserve, "a post check could not run: %s" % describe_error(error))
        raise
    failed = [result["name"] for result in results if not result["ok"]]
    if failed and written:
        put_back(state, written, originals, who, reserve, "post check %s failed" % ", ".join(failed))
    release_space(reserve)
    return results


@verb("commit", interrupt=False)
def commit_verb(payload):
    """Compare-and-swap write with backups and journal, then post checks; revert all if one fails."""
    repo = open_repo(payload)
    who = identity(payload)
    changes = parse_changes(repo, payload)
    checks = parse_post_checks(payload)
    timeout = lock_timeout(payload)
    state = ensure_state_dir(repo)
    fault_hook("arm_faults", state, "commit")
    with RepoLock(state, timeout, who, "commit"):
        fault_point("locked")
        settle_pending(state)
        originals = read_originals(changes)
        written, reserve = write_changes(state, changes, originals, who)
        results = run_post_checks(state, repo, checks, written, originals, who, reserve)
        reverted = not all(result["ok"] for result in results)
        compact_quietly(state)
    return {"written": [change.path for change in written], "checks": results, "reverted": reverted and bool(written)}


# -- rollback -------------------------------------------------------------------------------------------------


def parse_restore(repo, raw, index):
    """One validated `restores[i]` as a Restore."""
    where = "restores[%d]" % index
    require_object(raw, where)
    rel = require_str(raw, "path", where)
    return Restore(rel, resolve_target(repo, rel), require_patch_ids(raw, where),
                   optional_sha(raw, "expected_sha256", where), optional_sha(raw, "restore_sha256", where),
                   bool(raw.get("force", False)))


def rollback_one(state, restore, who, result):
    """Restore one file from its backup (remove it, where ddops created it), or record why not; the result lists are
    filled in place."""
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
    data = read_backup_bytes(state, restore.restore) if restore.restore else None
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


def refuse_if_journal_moved(state, seen_last):
    """Fault `journal_moved` unless the journal's last entry is still the one the plan was made from.

    The file hashes alone do not tell: another controller's patch or rollback may have left a file as the plan
    expects while the applications behind it changed, and a rollback planned from the old journal would then leave
    files and journal disagreeing. The controller plans again."""
    entries, _ = read_journal(state)
    last = entries[-1].get("id") if entries else None
    if last != seen_last:
        raise AgentFault("journal_moved", "the journal changed since this rollback was planned (another ddops wrote "
                                          "to it meanwhile): nothing written; plan again")


@verb("rollback", interrupt=False)
def rollback_verb(payload):
    """Restore files from backups; edited files are refused unless forced (then the edit is saved first)."""
    repo = open_repo(payload)
    who = identity(payload)
    restores = [parse_restore(repo, raw, index) for index, raw in enumerate(require_list(payload, "restores"))]
    timeout = lock_timeout(payload)
    state = ensure_state_dir(repo)
    result = {"restored": [], "refused": [], "saved": [], "unchanged": [], "failed": []}
    fault_hook("arm_faults", state, "rollback")
    with RepoLock(state, timeout, who, "rollback"):
        fault_point("locked")
        settle_pending(state)
        if "journal_last" in payload:
            refuse_if_journal_moved(state, payload["journal_last"])
        for restore in restores:
            try:
                rollback_one(state, restore, who, result)
            except AgentFault as fault:
                result["failed"].append({"path": restore.path, "kind": fault.kind, "message": fault.message})
            except OSError as error:
                result["failed"].append({"path": restore.path, "kind": "io", "message": describe_error(error)})
        compact_quietly(state)
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
