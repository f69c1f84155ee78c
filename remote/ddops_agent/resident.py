"""The resident agent: a server on a unix socket that serves later sessions (remote/README.md, "The resident agent").

Three things keep a session from being served by the wrong process (issue 11):
- the socket's name is derived from everything a resident shares with the session that starts it: the host (its
  name, boot, mount namespace and root directory), the user's ids and groups, the environment and the interpreter.
  Hosts that share one home directory (containers with a common volume) therefore never meet at one socket, and a
  session whose environment changed gets a resident of its own;
- the resident serves only a peer that sees its filesystem: SO_PEERCRED names the sshd process that connected, and
  a peer in another mount namespace, another root, or a pid namespace it cannot see is refused without a word;
- each resident has a secret, handed to the controller on the exec channel that started it: the controller's
  first line proves it knows the secret (or the resident serves nothing), and the greeting proves the resident
  does (or the controller believes nothing).

A resident tells its secret to one more kind of peer: an agent of the same user that provably sees the same
filesystem, i.e. one started on this host by another controller (another engineer's, a CI runner's, one that lost
its book). That agent hands it to its controller, which then uses the resident too instead of starting an agent for
every command while this one lives. Such a peer can already read the resident's memory, so nothing is given away."""

import fcntl
import hashlib
import hmac
import json
import os
import re
import select
import signal
import socket
import stat
import sys
import time
from contextlib import suppress

RESIDENT_BACKLOG = 64
MAX_UNIX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux, fewer elsewhere
MAX_LIFETIME = 3600.0  # seconds a resident serves at most, however busy: it carries its first session's environment
SECRET_BYTES = 32
HELLO_TIMEOUT = 30.0  # seconds a connection may take to send its first line
MAX_HELLO = 4096
LOCAL_HELLO = b'{"hello": "local"}\n'  # an agent on this host asking for the secret (secret_of_resident)
BIND_WAIT = 10.0  # seconds the starting agent waits for the server to say whether it bound the socket
# The variables that describe the SSH connection rather than the environment a verb runs in: they differ for every
# connection, so a resident named by them would never be found again.
CONNECTION_VARIABLES = ("SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "XDG_SESSION_ID", "_")
# The files a login's environment is built from (PAM's pam_env, sshd's PermitUserEnvironment, the shells' rc files).
LOGIN_FILES = ("/etc/environment", "/etc/security/pam_env.conf", "/etc/profile", "/etc/profile.d", "/etc/bash.bashrc",
               "/etc/zsh/zshenv", "~/.ssh/environment", "~/.pam_environment", "~/.profile", "~/.bash_profile",
               "~/.bash_login", "~/.bashrc", "~/.zshenv", "~/.zprofile", "~/.zshrc")
# What the server was started for (its groups and login_sources()), which its session processes check every login
# against; set when the server starts.
STARTED_FOR = []


def read_text(path):
    """The stripped content of a small file, or None."""
    try:
        with open(path, "rb") as handle:
            return handle.read(256).decode("utf-8", "replace").strip()
    except OSError:
        return None


def mount_namespace(pid="self"):
    """The mount namespace of process `pid` ("mnt:[4026531840]"); raises OSError where it cannot be read."""
    return os.readlink("/proc/%s/ns/mnt" % pid)


def host_view():
    """What tells this host's view of the filesystem from another's: host name, boot, mount namespace, root."""
    try:
        namespace = mount_namespace()
    except OSError:
        namespace = None
    root = os.stat("/")
    return [os.uname()[1], read_text("/proc/sys/kernel/random/boot_id"), namespace, root.st_dev, root.st_ino]


def session_identity(digest):
    """Everything a resident must share with a session to serve it in its place, as one hashable text."""
    environment = sorted((key, value) for key, value in os.environ.items() if key not in CONNECTION_VARIABLES)
    credentials = [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(set(os.getgroups()))]
    interpreter = [os.path.realpath(sys.executable), sys.executable, sys.version]
    return json.dumps([digest, host_view(), credentials, interpreter, environment, login_sources()])


def login_sources():
    """What a new login's environment and interpreter come from, as it is now: (inode, size, mtime) of each file a
    login's environment is built from, and of the interpreter's file. A resident started before one of them changed
    has a login's environment that a new login would no longer get."""
    found = []
    for name in LOGIN_FILES + (os.path.realpath(sys.executable),):
        try:
            st = os.stat(os.path.expanduser(name))
            found.append([st.st_ino, st.st_size, st.st_mtime_ns])
        except OSError:
            found.append(None)
    return found


def process_groups(pid):
    """The effective group and the supplementary groups of process `pid`, or None where /proc does not say."""
    try:
        with open("/proc/%d/status" % pid) as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        return sorted(set([int(fields["Gid"].split()[1])] + [int(g) for g in fields["Groups"].split()]))
    except (OSError, KeyError, IndexError, ValueError):
        return None


def same_login(pid, started_for):
    """Whether the login that connected (sshd's session process `pid`, which holds the login's groups) is still the
    one this resident was started for (`started_for`: its groups and login_sources() then): checked on every
    connection, for the price of a few stat calls."""
    groups = process_groups(pid) if pid else None
    if None not in (groups, started_for[0]) and groups != started_for[0]:
        return False  # a group added or taken away since (the group database is read again at every login)
    return login_sources() == started_for[1]


def host_label(limit):
    """The host name as it may appear in a file name, at most `limit` characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", os.uname()[1])[:max(0, limit)]


def resident_socket_path(digest):
    """Where the resident for this session's host, user, environment, Python and agent version listens; None when
    no usable path exists."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        folder = os.path.join(runtime, "ddops")
    else:
        folder = os.path.join(os.path.expanduser("~"), ".cache", "ddops", "run")
    if not os.path.isabs(folder):
        return None
    identity = hashlib.sha256(session_identity(digest).encode("utf-8", "surrogateescape")).hexdigest()[:24]
    fixed = len(folder.encode("utf-8", "surrogateescape")) + len("/agent--%s.sock" % identity)
    label = host_label(min(32, MAX_UNIX_SOCKET_PATH - fixed))
    path = os.path.join(folder, "agent-%s-%s.sock" % (label, identity))
    return path if len(path.encode("utf-8", "surrogateescape")) <= MAX_UNIX_SOCKET_PATH else None


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


def new_secret():
    """A fresh secret for one resident (kept in its memory and by its controllers, never written to a file)."""
    return os.urandom(SECRET_BYTES)


def proof(secret, role, nonce):
    """HMAC-SHA256 of the nonce under the secret, for `role` "controller" or "resident" (so neither can be
    reflected back as the other's)."""
    return hmac.new(secret, ("ddops-%s:%s" % (role, nonce)).encode("ascii"), hashlib.sha256).hexdigest()


def secret_of_resident(path):
    """The secret of the resident that serves `path` now, asked over its socket (it tells an agent of its own user
    on its own filesystem: see sends_secret_to); None when no resident of ours answers. Asked only in a private
    directory, and believed only from a process of our uid: a listener that another user put there would otherwise
    choose the secret this controller then trusts."""
    if not private_directory(os.path.dirname(path)):
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.settimeout(2.0)
        client.connect(path)
        _, uid = peer_credentials(client)
        if uid is not None and uid != os.getuid():
            return None
        client.sendall(LOCAL_HELLO)
        reply = client.makefile("rb").readline(MAX_HELLO)
        secret = json.loads(reply.decode("ascii"))["resident_secret"]
        if isinstance(secret, str) and re.match(r"^[0-9a-f]{%d}$" % (2 * SECRET_BYTES), secret):
            return bytes.fromhex(secret)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    finally:
        client.close()
    return None


def sends_secret_to(pid):
    """Whether peer `pid` (of our uid) provably sees our filesystem: the same mount namespace and root, read from
    /proc. Unlike sees_our_filesystem, "cannot tell" is a no (sshd's processes, for a user who is not root)."""
    try:
        if pid is None or pid <= 0 or mount_namespace(pid) != mount_namespace():
            return False
        root, here = os.stat("/proc/%d/root" % pid), os.stat("/")
    except OSError:
        return False
    return (root.st_dev, root.st_ino) == (here.st_dev, here.st_ino)


def answer_hello(line, secret):
    """The resident's proof for a controller's first line, or None when that line does not prove the secret."""
    try:
        hello = json.loads(line.decode("utf-8"))["hello"]
        nonce, claimed = hello["nonce"], hello["proof"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None
    if not (isinstance(nonce, str) and re.match(r"^[0-9a-f]{32,128}$", nonce) and isinstance(claimed, str)):
        return None
    if not hmac.compare_digest(proof(secret, "controller", nonce).encode("ascii"), claimed.encode("utf-8")):
        return None
    return proof(secret, "resident", nonce)


def is_private_directory(st):
    """Whether stat result `st` is a directory of ours that nobody else can enter."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def private_directory(folder):
    """Whether `folder` is a real directory of ours (not a symlink) that nobody else can enter."""
    try:
        return is_private_directory(os.lstat(folder))
    except OSError:
        return False


def open_private_directory(folder):
    """A descriptor of `folder` (made, mode 0700, if missing) when it is a real directory of ours that nobody else
    can enter; None otherwise (a symlink, another owner, or open to others: never used)."""
    try:
        os.makedirs(folder, 0o700, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    if is_private_directory(os.fstat(fd)):
        return fd
    os.close(fd)
    return None


def start_resident(path, secret, linger, lifetime, agent, inherited=()):
    """Fork the resident server for socket `path`, serving with the loaded `agent` package; a descriptor that
    bound_resident() reads its word from.

    The server detaches at once (its own session, reparented, standard streams on /dev/null, the descriptors in
    `inherited` closed) so that sshd can close the channel of the session that started it."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            os.setsid()
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.close(devnull)
                for fd in inherited:
                    with suppress(OSError):
                        os.close(fd)
                serve_resident(path, secret, linger, lifetime, agent, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(middle, 0)
    return read_end


def bound_resident(ready):
    """Whether the server started by start_resident bound its socket (closes `ready`)."""
    try:
        word = b""
        deadline = time.monotonic() + BIND_WAIT
        while len(word) < 5:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([ready], [], [], remaining)[0]:
                return False
            chunk = os.read(ready, 5 - len(word))
            if not chunk:
                return False
            word += chunk
        return word == b"bound"
    finally:
        os.close(ready)


def serve_resident(path, secret, linger, lifetime, agent, ready):
    """Accept sessions on unix socket `path` until none came for `linger` seconds or `lifetime` seconds have passed;
    return at once (without a word on `ready`) if its directory is not private or another resident serves it."""
    folder, name = os.path.split(path)
    directory = open_private_directory(folder)
    if directory is None:
        return
    try:
        lock = os.open(name + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=directory)
    except OSError:
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # a resident for this very session identity already serves (we hold no lock: nothing to clean up)
    server = bind_in(directory, name)
    if server is None:
        return
    bound = os.stat(name, dir_fd=directory, follow_symlinks=False).st_ino
    STARTED_FOR[:] = [process_groups(os.getpid()), login_sources()]
    os.write(ready, b"bound")  # only now may the starting agent announce the path
    os.close(ready)
    sessions = set()
    keep_out = (lock, directory)  # a session must not hold these: an orphaned one would block every successor
    # Reap each session process as it ends rather than at the next accept (until then it would be a zombie).
    signal.signal(signal.SIGCHLD, lambda number, frame: reap_sessions(sessions))
    started = time.monotonic()
    idle_until, end_of_life = started + linger, started + lifetime
    while True:
        reap_sessions(sessions)
        remaining = min(idle_until, end_of_life) - time.monotonic()
        if remaining <= 0:
            break
        server.settimeout(min(remaining, 5.0))
        try:
            connection, _ = server.accept()
        except (socket.timeout, InterruptedError):
            continue
        sessions.add(fork_resident_session(server, connection, agent, secret, keep_out))
        idle_until = time.monotonic() + linger
    # Take the name away first, then serve whoever connected before that: no session is left unanswered.
    with suppress(OSError):
        if os.stat(name, dir_fd=directory, follow_symlinks=False).st_ino == bound:
            os.unlink(name, dir_fd=directory)
    server.setblocking(False)
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            break
        connection.setblocking(True)
        sessions.add(fork_resident_session(server, connection, agent, secret, keep_out))
    server.close()
    os.close(lock)
    os.close(directory)


def bind_in(directory, name):
    """A listening unix socket bound to `name` inside the directory open as `directory` (the name is resolved from
    that descriptor, so no path component can be swapped between the check and the bind); None if that fails."""
    here = os.open(".", os.O_RDONLY)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        os.fchdir(directory)
        with suppress(FileNotFoundError):
            os.unlink(name)  # a socket left by a resident that was killed
        server.bind(name)
        server.listen(RESIDENT_BACKLOG)
        return server
    except OSError:
        server.close()
        return None
    finally:
        os.umask(umask)
        os.fchdir(here)
        os.close(here)


def reap_sessions(sessions):
    """Collect the exit status of the session processes that have ended."""
    for pid in list(sessions):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            sessions.discard(pid)


def fork_resident_session(server, connection, agent, secret, keep_out):
    """Serve one connection in a child process (which closes the descriptors in `keep_out`); its pid. The child
    inherits the agent the server loaded, which has answered nothing: each session starts from the same state."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's reaper is not ours
            server.close()
            for fd in keep_out:
                os.close(fd)
            serve_connection(connection, agent, secret)
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


def sees_our_filesystem(pid):
    """False when the peer provably sees another filesystem than ours: another mount namespace or root, or a pid
    namespace we cannot see into (pid 0: another container). True when it is the same, or where the OS does not let
    us look (a user who is not root may not read sshd's /proc entries): the secret still stands then."""
    if pid is None:
        return True
    if pid <= 0:
        return False
    try:
        ours = mount_namespace()
    except OSError:
        return True  # no namespaces to tell apart here
    try:
        if mount_namespace(pid) != ours:
            return False
        root = os.stat("/proc/%d/root" % pid)
    except PermissionError:
        return True
    except OSError:
        return False  # the peer is gone already
    here = os.stat("/")
    return (root.st_dev, root.st_ino) == (here.st_dev, here.st_ino)


def serve_connection(connection, agent, secret):
    """One session on the resident: the controller's proof, then a JSON request per line in, a JSON answer per line
    out, until EOF."""
    pid, uid = peer_credentials(connection)
    if uid is not None and uid != os.getuid():
        return  # sshd connects as the user it logged in; anyone else is refused without a word
    if not sees_our_filesystem(pid):
        return  # a host that shares our socket's directory, not our files: its controller starts its own agent
    if STARTED_FOR and not same_login(pid, STARTED_FOR):
        # Its groups, its environment's files or its interpreter changed since this resident started: no greeting,
        # so the controller starts an agent for it, which names (and starts) a resident of its own.
        return
    connection.settimeout(HELLO_TIMEOUT)
    reader = connection.makefile("rb")
    try:
        hello = reader.readline(MAX_HELLO)
    except OSError:
        return
    if hello == LOCAL_HELLO:
        if uid is not None and sends_secret_to(pid):
            connection.sendall((json.dumps({"resident_secret": secret.hex()}) + "\n").encode("ascii"))
        return
    greeting = answer_hello(hello, secret)
    if greeting is None:
        return  # not the controller this resident was started for: nothing is read or run
    connection.settimeout(None)
    # The greeting proves the secret; a session that ends without it was never served, so the controller may send
    # its request to an agent of its own instead (a resident killed as it connected, or one not its own).
    connection.sendall((json.dumps({"resident": greeting}) + "\n").encode("ascii"))
    agent.protocol.fault_hook("note_ssh_session", pid)
    while True:
        line = reader.readline()
        if not line:
            break
        answer_line = agent.protocol.encode_response(agent.protocol.answer(line))
        connection.sendall(answer_line.encode("utf-8"))
