"""The resident agent: a server on a unix socket that serves later sessions (remote/README.md, "The resident agent")."""

import fcntl
import os
import signal
import socket
import stat
import sys
import time

from ddops_agent.files import sha256_hex


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
        agent = load()  # as in the bootstrap: every request gets a freshly loaded agent
        agent.faults.SSH_SESSION_PID = pid
        answer_line = agent.protocol.encode_response(agent.protocol.answer(line))
        connection.sendall(answer_line.encode("utf-8"))
