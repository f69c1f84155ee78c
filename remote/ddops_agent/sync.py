"""ddops agent extension: the repo at a pinned commit (inspect, save local edits, fetch, checkout detached)."""

import functools
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import time
import uuid
from contextlib import suppress

from ddops_agent.checks import kill_group
from ddops_agent.files import STATE_DIR, check_relpath, make_private_dir, open_repo, unsafe_path, write_all
from ddops_agent.journal import RepoLock, ensure_state_dir, lock_timeout, now_iso, read_journal, state_dir
from ddops_agent.protocol import (AgentFault, bad_request, identity, is_hex, optional_number, optional_str,
                                  require_list, require_object, require_sha, require_str, verb)

LOG_NAME = "sync.jsonl"
BUNDLE_NAME_PATTERN = r"(?:[0-9a-f]{40}|[0-9a-f]{64})-[0-9a-f]{8,32}\.bundle"
DEFAULT_FETCH_TIMEOUT = 600.0
DEFAULT_PROBE_TIMEOUT = 10.0
STALE_BUNDLE_SECONDS = 24 * 3600
GIT_ERROR_CHARS = 2000


def require_commit(payload, key="commit"):
    """payload[key] as a full lowercase hex commit id (sha1 or sha256 repositories)."""
    value = payload.get(key)
    if not is_hex(value, 40, 64):
        raise bad_request("payload.%s must be a full lowercase hex commit id" % key)
    return value


def git_operand(value, what):
    """A user value that goes to git as an operand (a URL), refused when git could read it as an option.

    `--upload-pack=CMD` as a URL runs CMD. The calls below also put `--` before such operands, which every git
    understands (`--end-of-options` needs git 2.24): this check is the one that does not depend on the host's git."""
    if not isinstance(value, str) or not value or value.startswith("-") or "\0" in value or "\n" in value:
        raise bad_request("%s %r: must not be empty, start with '-' (git would read it as an option) or contain "
                          "newlines or NUL bytes" % (what, value))
    return value


def check_operands(payload):
    """(repo, commit): every operand of a sync request checked before anything runs, used by this call or not.

    A check made only where an operand is used depends on the repo's state (a commit already there skips the
    fetch, and with it the URL): a bad value must be refused the same way every time."""
    repo = repo_path(payload)
    commit = require_commit(payload)
    for key in ("repo_url", "probe_url"):
        value = optional_str(payload, key)
        if value:
            git_operand(value, key)
    source = optional_str(payload, "source")
    if source is not None and source not in ("remote", "bundle"):
        raise bad_request("payload.source must be 'remote' or 'bundle'")
    if payload.get("bundle") is not None:
        bundle = require_object(payload["bundle"], "payload.bundle")
        require_sha(bundle, "sha256", "bundle")
        path = require_str(bundle, "path", "bundle")
        if os.path.dirname(path) != staging_dir(False) or not is_bundle_name(os.path.basename(path)):
            raise unsafe_path(path, "bundles are only read from ddops' staging directory")
    return repo, commit


def repo_path(payload):
    """The real path of payload["repo"], which need not exist yet (a sync may create it)."""
    raw = require_str(payload, "repo")
    path = os.path.expanduser(raw)
    if not os.path.isabs(path):
        raise bad_request("repo must be an absolute path, got %r" % raw)
    return os.path.realpath(path)


def git_env():
    """The environment git runs in: never prompt (no terminal here), messages in English."""
    env = dict(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return env


def run_git(repo, args, timeout, env=None):
    """(exit code, stdout bytes, stderr text) of `git args` in `repo`; killed with its children on timeout."""
    try:
        process = subprocess.Popen(
            ["git"] + list(args), cwd=repo, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, env=env or git_env(),
        )
    except FileNotFoundError:
        raise AgentFault("no_git", "git is not installed on this host (or not on PATH)") from None
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        process.communicate()
        raise AgentFault("timeout", "git %s timed out after %gs and was stopped" % (args[0], timeout)) from None
    return process.returncode, out, err.decode("utf-8", "replace").strip()[-GIT_ERROR_CHARS:]


def git_ok(repo, args, timeout=60, kind="git_failed", env=None):
    """stdout text of a git command that must succeed; fault `kind` with git's own message otherwise."""
    code, out, err = run_git(repo, args, timeout, env)
    if code != 0:
        raise AgentFault(kind, "git %s failed (exit %d): %s" % (" ".join(args[:2]), code, last_lines(err)))
    return out.decode("utf-8", "replace").strip()


def last_lines(text, count=6):
    """git's complaint in one line: from its first error:/fatal: line on (a few lines), else its last lines."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith(("error:", "fatal:"))), None)
    picked = lines[start:start + count] if start is not None else lines[-3:]
    if start is not None and len(lines) > start + count:
        picked.append("...")
    return " / ".join(picked) or "no message"


def is_checkout(repo):
    """Whether `repo` is the top of a git work tree (a `.git` directory or gitfile right there)."""
    return os.path.exists(os.path.join(repo, ".git"))


def is_empty_dir(repo):
    """Whether `repo` holds nothing but (maybe) ddops' own state directory."""
    try:
        return all(name == STATE_DIR for name in os.listdir(repo))
    except FileNotFoundError:
        return True


def has_commit(repo, commit):
    """Whether the commit object is in the repo."""
    code, _, _ = run_git(repo, ["cat-file", "-e", commit + "^{commit}"], 30)
    return code == 0


def head_commit(repo):
    """HEAD's commit id, or None in a repo without commits."""
    code, out, _ = run_git(repo, ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], 30)
    return out.decode().strip() if code == 0 and out.strip() else None


def remote_url(repo, name="origin"):
    """The URL of remote `name`, or None."""
    code, out, _ = run_git(repo, ["config", "--get", "remote.%s.url" % name], 30)
    return out.decode("utf-8", "replace").strip() if code == 0 and out.strip() else None


def parse_porcelain(raw):
    """`git status --porcelain=v1 -z` output as [{path, xy, orig}] (orig: a rename's source, else None)."""
    items = raw.split(b"\0")
    out = []
    index = 0
    while index < len(items):
        item = items[index]
        index += 1
        if len(item) < 4:
            continue
        xy = item[:2].decode("ascii", "replace")
        path = item[3:].decode("utf-8", "surrogateescape")
        orig = None
        if "R" in xy or "C" in xy:
            orig = items[index].decode("utf-8", "surrogateescape") if index < len(items) else None
            index += 1
        out.append({"path": path, "xy": xy, "orig": orig})
    return out


def dirty_tracked(repo):
    """Tracked files with staged or unstaged changes (untracked files are left alone by checkout)."""
    raw = run_git(repo, ["--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=no"], 60)
    code, out, err = raw
    if code != 0:
        raise AgentFault("git_failed", "git status failed (exit %d): %s" % (code, last_lines(err)))
    return parse_porcelain(out)


def file_sha_or_none(repo, rel):
    """The sha256 of a regular file in the repo (streamed), or None when missing or not a regular file."""
    path = os.path.join(repo, rel)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def describe_dirty(repo):
    """Each dirty tracked file with its sha256 and the journal entries ddops wrote for it."""
    dirty = dirty_tracked(repo)
    if not dirty:
        return []
    entries, _ = read_journal(state_dir(repo))
    by_file = {}
    for entry in entries:
        if isinstance(entry.get("file"), str):
            by_file.setdefault(entry["file"], []).append(entry)
    for item in dirty:
        item["sha256"] = file_sha_or_none(repo, item["path"])
        item["journal"] = by_file.get(item["path"], [])
    return dirty


def objects_bytes(repo):
    """Bytes under the repo's object store (to report how much a fetch brought in)."""
    root = os.path.join(repo, ".git", "objects")
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def probe_url(repo, url, timeout):
    """Whether this host can list refs at `url` within `timeout`: {reachable, error, seconds}."""
    started = time.monotonic()
    cwd = repo if os.path.isdir(repo) else "/"
    try:
        code, _, err = run_git(cwd, ["ls-remote", "--quiet", "--", url, "HEAD"], timeout)
        error = None if code == 0 else last_lines(err)
    except AgentFault as fault:
        code, error = -1, fault.message
    return {"reachable": code == 0, "error": error, "seconds": round(time.monotonic() - started, 3)}


# -- staging of uploaded bundles ----------------------------------------------------------------------------------


def staging_dir(create):
    """Where the controller uploads bundles: a private per-user cache directory (outside any repo)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "ddops", "incoming")
    if create:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        make_private_dir(path)
        remove_stale_bundles(path)
    return os.path.realpath(path)


def is_bundle_name(name):
    """Whether `name` is a bundle name ddops makes: <commit>-<nonce>.bundle."""
    return re.fullmatch(BUNDLE_NAME_PATTERN, name) is not None


def remove_stale_bundles(directory):
    """Bundles left behind by interrupted runs, older than a day (names ddops made only)."""
    cutoff = time.time() - STALE_BUNDLE_SECONDS
    for name in os.listdir(directory):
        if is_bundle_name(name) or name.endswith(".bundle.part"):
            path = os.path.join(directory, name)
            with suppress(OSError):
                if os.lstat(path).st_mtime < cutoff:
                    os.unlink(path)


def bundle_target(raw):
    """The real path of an uploaded bundle: only a ddops-named file directly in the staging directory."""
    path = require_str(raw, "path", "bundle")
    if os.path.dirname(path) != staging_dir(False) or not is_bundle_name(os.path.basename(path)):
        raise unsafe_path(path, "bundles are only read from ddops' staging directory")
    if os.path.islink(path) or not os.path.isfile(path):
        raise AgentFault("no_bundle", "the uploaded bundle %s is missing" % path)
    return path


def discard_bundle(payload):
    """Remove an uploaded bundle that is not needed (the commit arrived some other way)."""
    if isinstance(payload.get("bundle"), dict):
        with suppress(AgentFault, OSError):
            os.unlink(bundle_target(payload["bundle"]))


def check_bundle(path, expected_sha):
    """Fault `checksum` (and delete the file) when the uploaded bundle is not the bytes the controller sent."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    found = digest.hexdigest()
    if found != expected_sha:
        raise AgentFault("checksum", "the uploaded bundle has sha256 %s, the controller sent %s: the upload was "
                                     "damaged; run sync again" % (found, expected_sha))


# -- verbs ------------------------------------------------------------------------------------------------------


@verb("sync_inspect")
def inspect_verb(payload):
    """Where the repo stands against a commit, in one call: head, whether it has the commit, dirty files."""
    repo, commit = check_operands(payload)
    result = {"repo": repo, "exists": os.path.isdir(repo), "is_git": False, "empty": False, "head": None,
              "has_commit": False, "origin_url": None, "dirty": [], "probe": None, "staging_dir": None}
    if os.path.exists(repo) and not os.path.isdir(repo):
        raise AgentFault("no_repo", "repo %s exists and is not a directory" % repo)
    result["empty"] = is_empty_dir(repo)
    if result["exists"] and is_checkout(repo):
        result["is_git"] = True
        result["head"] = head_commit(repo)
        result["has_commit"] = has_commit(repo, commit)
        result["origin_url"] = remote_url(repo)
        result["dirty"] = describe_dirty(repo)
    if not result["has_commit"]:
        url = optional_str(payload, "probe_url")
        if url:
            timeout = optional_number(payload, "probe_timeout", DEFAULT_PROBE_TIMEOUT)
            result["probe"] = probe_url(repo, url, timeout)
        if payload.get("staging"):
            result["staging_dir"] = staging_dir(True)
    return result


@verb("sync_save", interrupt=False)
def save_verb(payload):
    """Save local edits to tracked files in a git stash named after ddops, before the commit moves."""
    repo = open_repo(payload)
    paths = require_list(payload, "paths")
    for rel in paths:
        check_relpath(rel)
    message = require_str(payload, "message")
    if not paths:
        raise bad_request("payload.paths must name at least one file")
    env = git_env()
    # A stash is a commit: give it an author when the host has no git identity configured.
    for key, name in (("user.name", "GIT_AUTHOR_NAME"), ("user.email", "GIT_AUTHOR_EMAIL")):
        code, out, _ = run_git(repo, ["config", "--get", key], 30)
        if code != 0 or not out.strip():
            value = "ddops" if key == "user.name" else "ddops@" + socket.gethostname()
            env[name] = value
            env[name.replace("AUTHOR", "COMMITTER")] = value
    git_ok(repo, ["stash", "push", "--quiet", "--message", message, "--"] + paths, kind="save_failed", env=env)
    stash = git_ok(repo, ["rev-parse", "--verify", "refs/stash"], kind="save_failed")
    listed = git_ok(repo, ["stash", "list", "--format=%H %gd"], kind="save_failed")
    ref = next((line.split()[1] for line in listed.splitlines() if line.split()[0] == stash), "stash@{0}")
    still = [item["path"] for item in dirty_tracked(repo) if item["path"] in paths]
    if still:
        raise AgentFault("save_failed", "git stash left these files changed: %s" % ", ".join(still))
    return {"stash": stash, "ref": ref, "message": message, "paths": paths}


def prepare_repo(repo, url):
    """Make `repo` a git checkout: an empty or missing directory gets `git init` (and origin = url).

    None when it already was one; else what to call (undo_prepare) if the sync then fails, so that an unusable
    URL does not leave an empty `git init` where the repo should be."""
    if os.path.exists(repo) and not os.path.isdir(repo):
        raise AgentFault("no_repo", "repo %s exists and is not a directory" % repo)
    if os.path.isdir(repo) and is_checkout(repo):
        return None
    if not is_empty_dir(repo):
        raise AgentFault("not_git", "%s is not a git checkout and is not empty: ddops will not clone over it "
                                    "(move it away, or point `repo:` elsewhere)" % repo)
    missing = not os.path.exists(repo)
    os.makedirs(repo, exist_ok=True)
    undo = functools.partial(undo_prepare, repo, missing)
    try:
        git_ok(repo, ["init", "--quiet"], kind="init_failed")
        if url:
            git_ok(repo, ["remote", "add", "--", "origin", url], kind="init_failed")
    except BaseException:
        undo()
        raise
    return undo


def undo_prepare(repo, was_missing):
    """Take back what prepare_repo made: the directory it created, or what it put into the empty one it found."""
    if was_missing:
        shutil.rmtree(repo, ignore_errors=True)
        return
    for name in (".git", STATE_DIR):
        path = os.path.join(repo, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def fetch_commit(repo, commit, payload):
    """Bring `commit` into the repo from the remote URL or an uploaded bundle; {source, fetched_bytes}."""
    source = require_str(payload, "source")
    timeout = optional_number(payload, "fetch_timeout", DEFAULT_FETCH_TIMEOUT)
    before = objects_bytes(repo)
    if source == "bundle":
        bundle = require_object(payload.get("bundle"), "payload.bundle")
        path = bundle_target(bundle)
        try:
            check_bundle(path, require_sha(bundle, "sha256", "bundle"))
            git_ok(repo, ["fetch", "--quiet", "--no-tags", "--", path, commit], timeout, kind="fetch_failed")
        finally:
            with suppress(OSError):
                os.unlink(path)
    elif source == "remote":
        url = git_operand(require_str(payload, "repo_url"), "repo_url")
        if remote_url(repo) == url:
            # The branches and tags too, so the checkout looks like an ordinary clone to people on the host.
            code, _, err = run_git(repo, ["fetch", "--quiet", "--tags", "--", "origin"], timeout)
            if code != 0:
                raise AgentFault("fetch_failed", "git fetch from %s failed (exit %d): %s"
                                 % (url, code, last_lines(err)))
            if not has_commit(repo, commit):
                git_ok(repo, ["fetch", "--quiet", "--", "origin", commit], timeout, kind="fetch_failed")
        else:
            git_ok(repo, ["fetch", "--quiet", "--no-tags", "--", url, commit], timeout, kind="fetch_failed")
    else:
        raise bad_request("payload.source must be 'remote' or 'bundle'")
    if not has_commit(repo, commit):
        raise AgentFault("fetch_failed", "fetched from %s, but commit %s is not there" % (source, commit))
    return {"source": source, "fetched_bytes": max(0, objects_bytes(repo) - before)}


def append_log(repo, record):
    """One line per sync in .ddops/sync.jsonl: who moved the checkout from where to where."""
    state = ensure_state_dir(repo)
    path = os.path.join(state, LOG_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        write_all(fd, json.dumps(record, sort_keys=True).encode("utf-8") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


@verb("sync_fetch", interrupt=False)
def fetch_verb(payload):
    """Only bring the commit in (the checkout does not move): used before rolling patches back."""
    repo, commit = check_operands(payload)
    undo = prepare_repo(repo, optional_str(payload, "repo_url"))
    try:
        if has_commit(repo, commit):
            discard_bundle(payload)
            return {"created": undo is not None, "fetched": False, "source": None, "fetched_bytes": 0}
        fetched = fetch_commit(repo, commit, payload)
    except BaseException:
        if undo is not None:
            undo()
        raise
    return dict(fetched, created=undo is not None, fetched=True)


@verb("sync_checkout", interrupt=False)
def checkout_verb(payload):
    """Fetch the commit when missing, then check it out detached; refuses if tracked files are changed."""
    repo, commit = check_operands(payload)
    who = identity(payload)
    undo = prepare_repo(repo, optional_str(payload, "repo_url"))
    try:
        return checkout_prepared(repo, commit, who, payload, created=undo is not None)
    except BaseException:
        if undo is not None:
            undo()
        raise


def checkout_prepared(repo, commit, who, payload, created):
    """sync_checkout once the repo is a checkout: under the repo lock, fetch if needed and move HEAD."""
    state = ensure_state_dir(repo)
    with RepoLock(state, lock_timeout(payload), who, "sync"):
        before = head_commit(repo)
        fetched = {"source": None, "fetched_bytes": 0}
        if not has_commit(repo, commit):
            fetched = fetch_commit(repo, commit, payload)
        else:
            discard_bundle(payload)
        if before != commit:
            # The compare-and-swap of a sync: never move under someone's edits (the controller checked too).
            dirty = dirty_tracked(repo)
            if dirty:
                raise AgentFault("dirty", "refusing to move %s: tracked files have local changes: %s"
                                 % (repo, ", ".join(item["path"] for item in dirty)))
            timeout = optional_number(payload, "fetch_timeout", DEFAULT_FETCH_TIMEOUT)
            # `commit` is full hex (require_commit); the `--` after it: a revision, never a path (checkout, unlike
            # fetch and ls-remote, refuses `--end-of-options` in git 2.39).
            git_ok(repo, ["checkout", "--quiet", "--detach", commit, "--"], timeout, kind="checkout_failed")
        after = head_commit(repo)
        if after != commit:
            raise AgentFault("checkout_failed", "HEAD is %s after checking out %s" % (after, commit))
        if before != after:
            record = {"event": "sync", "before": before, "after": after, "source": fetched["source"],
                      "time": now_iso(), "id": uuid.uuid4().hex}
            record.update(who)
            append_log(repo, record)
    return {"before": before, "after": after, "created": created, "fetched": fetched["source"] is not None,
            "source": fetched["source"], "fetched_bytes": fetched["fetched_bytes"]}
