"""Paths inside a repo, and safe reads and atomic writes of its files."""

import collections
import errno
import hashlib
import os
import posixpath
import stat
from contextlib import suppress

from ddops_agent.protocol import AgentFault, bad_request, fault_point, require_str

MAX_FILE_BYTES = 16 * 1024 * 1024
STATE_DIR = ".ddops"
PROTECTED_TOP_DIRS = (STATE_DIR, ".git")
TEMP_SUFFIX = ".ddops-tmp"
Original = collections.namedtuple("Original", "data stat")


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
    # The textual check above sees `lnk/config`; with `lnk -> .git` it is .git/config all the same (a commit could
    # write core.fsmonitor there): what counts is where the path resolves.
    inside = os.path.relpath(target, repo).split(os.sep)
    if inside[0] in PROTECTED_TOP_DIRS or ".git" in inside:
        raise unsafe_path(rel, "it resolves to %s, inside %s/ (through a symlinked directory)"
                          % ("/".join(inside), inside[0] if inside[0] in PROTECTED_TOP_DIRS else ".git"))
    if os.path.islink(target):
        raise AgentFault("symlink", "refusing %s: it is a symlink (ddops never writes through symlinks)" % rel)
    return target


# -- reading --------------------------------------------------------------------------------------------------


def sha256_hex(data):
    """The hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def file_kind(mode):
    """What a non-regular file is, in words (a FIFO, a socket ...)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path, rel):
    """The file's bytes and stat as an Original, or None when it does not exist; faults for other kinds."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        raise AgentFault("symlink", "refusing %s: it is a symlink (ddops never writes through symlinks)" % rel)
    if not stat.S_ISREG(st.st_mode):
        raise AgentFault("not_file", "%s is %s, not a regular file" % (rel, file_kind(st.st_mode)))
    if st.st_size > MAX_FILE_BYTES:
        raise AgentFault("too_large", "%s is %d bytes, over the %d byte limit" % (rel, st.st_size, MAX_FILE_BYTES))
    # O_NOFOLLOW: the file could have been swapped for a symlink since the lstat above.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        # As much as lstat saw and a byte more (read(MAX_FILE_BYTES + 1) would allocate that much for every file),
        # then, if the file grew since, the rest up to the limit.
        data = handle.read(st.st_size + 1)
        if len(data) > st.st_size:
            data += handle.read(MAX_FILE_BYTES + 1 - len(data))
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
    """(fd, path) of a new private file `.<name>.<random>.ddops-tmp` in `directory` (O_EXCL, mode 0600)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = os.path.join(directory, ".%s.%s%s" % (name, os.urandom(6).hex(), TEMP_SUFFIX))
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue  # 48 random bits taken already: draw again


def atomic_write(path, data, mode, owner=None, durable=True):
    """Replace `path` by `data` so that readers see the old bytes or the new ones, never a mix.

    durable: fsync the file and its directory, so that the new bytes survive a crash (not needed for notes that a
    crash makes moot anyway; each fsync costs a disk flush)."""
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
        with suppress(OSError):
            os.unlink(temp)
        if isinstance(error, OSError) and not error.filename:
            raise OSError(error.errno, error.strerror, path) from None  # say which file could not be written
        raise
    if durable:
        fsync_dir(directory)


def remove_file(path):
    """Remove `path` durably (a file ddops created, rolled back); the same fault point as a write's rename."""
    with suppress(FileNotFoundError):
        os.unlink(path)
    fault_point("renamed", path)
    fsync_dir(os.path.dirname(path))


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


def make_private_dir(path):
    """Create `path` with mode 0700 unless it exists; refuse a symlink or non-directory there."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # the umask may have removed bits we want
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise AgentFault("unsafe_path", "%s exists and is not a directory (or is a symlink)" % path) from None
