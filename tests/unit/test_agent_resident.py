"""The resident agent, driven as sshd would drive it: started by the bootstrap with --linger, then reached on its
unix socket. (tests/integration/test_resident_agent.py covers the same through real sshd and ddops.)"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ddops.transport.agent import AgentProgram, agent_program, build_program
from ddops.transport.agent_client import resident_proof
from tests.conftest import exited, wait_until

# What an agent on the host sends a resident to learn its secret (remote/README.md, "The resident agent").
LOCAL_HELLO = b'{"hello": "local"}\n'

# Verbs that show what a request sees, and whether it ran at all.
PROBE = '''
import os

from ddops_agent.protocol import verb


@verb("environ_test")
def environ_test(payload):
    return {"value": os.environ.get(payload["name"]), "groups": sorted(os.getgroups())}


CALLS = []


@verb("count_test")
def count_test(payload):
    CALLS.append(1)
    return {"calls_in_this_load": len(CALLS), "pid": os.getpid()}


@verb("mark_test")
def mark_test(payload):
    with open(payload["path"], "w") as handle:
        handle.write("ran")
    return {}
'''


def request(verb: str, payload: dict) -> bytes:
    return json.dumps({"verb": verb, "payload": payload}).encode() + b"\n"


@pytest.fixture
def home():
    """A short HOME (unix socket paths are limited to ~100 bytes), with a repo in it."""
    path = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))
    (path / "repo").mkdir()
    (path / "repo" / "ddtree.py").write_text("past_key_values_target = DynamicCache()\n")
    yield path
    for pid in resident_pids(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it idled out between being listed and now
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def probe_program() -> AgentProgram:
    return build_program({"ddops_agent.probe_test": PROBE})


def resident_pids(home: Path) -> list[int]:
    """Processes whose environment has this HOME (the resident and its sessions)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"HOME={home}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def start(home: Path, linger: float, *requests: bytes, probe: bool = False, program: AgentProgram | None = None,
          env: dict[str, str] | None = None, lifetime: float = 0, wrap: tuple[str, ...] = (),
          preexec=None, python: str = sys.executable) -> list[dict]:
    """Run an agent session with --linger; its answers. The resident it leaves runs on in the background."""
    program = program or agent_program()
    command = shlex.join(program.argv(python, serve=True, linger=linger, probe_resident=probe, lifetime=lifetime))
    environment = {"HOME": str(home), "PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(home / ".cache"),
                   **(env or {})}
    # In HOME, as sshd starts it (the test's own directory may be one another user cannot enter).
    done = subprocess.run([*wrap, "/bin/sh", "-c", command], input=program.bundle + b"".join(requests),
                          capture_output=True, timeout=60, env=environment, preexec_fn=preexec, cwd=home)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def killed_resident(home: Path) -> str:
    """The socket path of a resident started and then killed, as by a reboot: its socket file stays."""
    path = start(home, 30, journal(home))[0]["resident"]
    killed = resident_pids(home)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(map(exited, killed)))
    return path


def hello(secret: bytes, nonce: str = "ab" * 16) -> bytes:
    """The controller's first line on a resident's socket: proof that it knows the resident's secret."""
    line = {"hello": {"nonce": nonce, "proof": resident_proof(secret, "controller", nonce)}}
    return json.dumps(line).encode() + b"\n"


def ask(announced: dict, *requests: bytes) -> list[dict]:
    """Send requests to the resident an answer announced, over its socket as sshd forwards them, after the hello;
    one answer per request."""
    secret = bytes.fromhex(announced["resident_secret"])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(30)
        client.connect(announced["resident"])
        reader = client.makefile("rb")
        client.sendall(hello(secret))
        greeting = json.loads(reader.readline())  # the resident proves the secret in turn
        assert greeting == {"resident": resident_proof(secret, "resident", "ab" * 16)}
        answers = []
        for line in requests:
            client.sendall(line)
            answers.append(json.loads(reader.readline()))
        return answers


def unanswered(path: str, *lines: bytes) -> bytes:
    """What the socket at `path` sends back to `lines` until it closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.connect(path)
        try:
            client.sendall(b"".join(lines))
            return client.recv(100)
        except (ConnectionResetError, BrokenPipeError):
            return b""


def journal(home: Path) -> bytes:
    return request("journal", {"repo": str(home / "repo")})


def test_the_first_answer_names_the_socket_once_it_is_bound_with_the_host_name_in_it(home):
    first, second = start(home, 30, journal(home), journal(home))
    path = first["resident"]
    assert "resident" not in second and "resident_secret" not in second
    assert re.fullmatch(r"[0-9a-f]{64}", first["resident_secret"])
    label = re.sub(r"[^A-Za-z0-9._-]", "_", os.uname()[1])[:32]
    assert re.fullmatch(rf"agent-{re.escape(label)}-[0-9a-f]{{24}}\.sock", Path(path).name), path
    assert Path(path).parent == home / ".cache" / "ddops" / "run"
    # Announced only after the bind: the socket is there the moment the answer is.
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_the_resident_answers_later_sessions_each_in_a_process_of_its_own(home):
    first = start(home, 30, journal(home))[0]
    probe = request("facts", {"repo": str(home / "repo")})
    one = ask(first, probe, journal(home))
    two = ask(first, probe)
    assert [a["ok"] for a in one + two] == [True, True, True]
    assert one[1]["result"] == {"entries": [], "corrupt": []}
    assert one[0]["result"]["repo_exists"] is True


def test_every_session_on_the_resident_starts_from_the_agent_the_server_loaded(home, probe_program):
    # The server loads the agent once and answers nothing itself: a session never sees another's module state.
    count = request("count_test", {})
    first = start(home, 30, count, program=probe_program)[0]
    sessions = [ask(first, count, count), ask(first, count), ask(first, count, count, count)]
    assert [[a["result"]["calls_in_this_load"] for a in answers] for answers in sessions] == [[1, 2], [1], [1, 2, 3]]
    assert len({answers[0]["result"]["pid"] for answers in sessions}) == 3  # a process per session


def test_the_resident_serves_nothing_to_a_peer_that_cannot_prove_its_secret(home, probe_program):
    first = start(home, 30, request("mark_test", {"path": str(home / "first")}), program=probe_program)[0]
    marker = home / "impostor-ran"
    mark = request("mark_test", {"path": str(marker)})
    wrong = hello(b"\x00" * 32)
    for lines in ((mark,), (b"\n", mark), (wrong, mark), (hello(bytes.fromhex(first["resident_secret"]))[:-3] + b"\n",
                                                           mark)):
        assert unanswered(first["resident"], *lines) == b""  # not even a greeting
    assert not marker.exists()
    assert ask(first, mark)[0]["ok"] and marker.read_text() == "ran"  # while the secret's holder is served


def test_a_resident_serves_no_peer_in_another_mount_namespace_even_one_that_knows_its_secret(home):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a mount namespace of its own")
    # Two hosts sharing one home: the same HOME seen from two mount namespaces.
    elsewhere = start(home, 30, journal(home), wrap=("unshare", "--mount", "--propagation", "private"))[0]
    here = start(home, 30, journal(home))[0]
    assert elsewhere["resident"] != here["resident"]  # each its own resident
    secret = bytes.fromhex(elsewhere["resident_secret"])
    assert unanswered(elsewhere["resident"], hello(secret), journal(home)) == b""
    assert ask(here, journal(home))[0]["ok"]


def test_the_resident_leaves_once_idle_and_takes_its_socket_with_it(home):
    path = start(home, 1, journal(home))[0]["resident"]
    assert os.path.exists(path)
    wait_until(lambda: not os.path.exists(path) and not resident_pids(home), timeout=15)


def test_a_busy_resident_still_leaves_at_the_end_of_its_lifetime(home):
    first = start(home, 30, journal(home), lifetime=2)[0]
    began = time.monotonic()
    while os.path.exists(first["resident"]) and time.monotonic() - began < 10:
        try:
            ask(first, journal(home))  # kept busy: never idle for long
        except OSError:
            break
        time.sleep(0.2)
    assert not os.path.exists(first["resident"]), "still serving after its lifetime"
    wait_until(lambda: not resident_pids(home), timeout=15)


def test_a_session_with_another_environment_or_groups_gets_a_resident_of_its_own(home, probe_program):
    def answers(**options) -> tuple[str, dict]:
        announced = start(home, 30, journal(home), program=probe_program, **options)[0]
        return announced["resident"], ask(announced, request("environ_test", {"name": "DDOPS_TEST_MARK"}))[0]

    one, seen_one = answers(env={"DDOPS_TEST_MARK": "one"})
    two, seen_two = answers(env={"DDOPS_TEST_MARK": "two"})
    assert one != two
    assert (seen_one["result"]["value"], seen_two["result"]["value"]) == ("one", "two")
    # Variables that only describe the connection do not count: the next connection's name is the first one's.
    again = start(home, 30, journal(home), program=probe_program, probe=True,
                  env={"DDOPS_TEST_MARK": "one", "SSH_CLIENT": "127.0.0.1 50000 22"})[0]
    assert again["resident_alive"] is True and "resident" not in again
    if os.geteuid() == 0:
        announced = start(home, 30, journal(home), program=probe_program, env={"DDOPS_TEST_MARK": "one"},
                          preexec=lambda: os.setgroups([4242]))[0]
        assert announced["resident"] != one
        seen = ask_as([4242], announced, request("environ_test", {"name": "DDOPS_TEST_MARK"}))[0]
        assert seen["result"]["groups"] == [4242]


# Connects to a resident as a login of other groups would (sshd's session process holds the login's groups): sends
# stdin, prints what comes back until the resident closes.
GROUPED_PEER = """
import socket, sys
client = socket.socket(socket.AF_UNIX)
client.settimeout(30)
client.connect(sys.argv[1])
client.sendall(sys.stdin.buffer.read())
client.shutdown(socket.SHUT_WR)
while True:
    chunk = client.recv(65536)
    if not chunk:
        break
    sys.stdout.buffer.write(chunk)
"""


def ask_as(groups: list[int], announced: dict, *requests: bytes) -> list[dict]:
    """ask(), from a process whose groups are `groups`: the greeting, then one answer per request ([] unanswered)."""
    secret = bytes.fromhex(announced["resident_secret"])
    done = subprocess.run([sys.executable, "-c", GROUPED_PEER, announced["resident"]],
                          input=hello(secret) + b"".join(requests), capture_output=True, timeout=60,
                          preexec_fn=lambda: os.setgroups(groups))
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    if not lines:
        return []
    assert lines[0] == {"resident": resident_proof(secret, "resident", "ab" * 16)}
    return lines[1:]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a process's groups needs root")
def test_a_login_whose_groups_changed_is_not_served_by_the_resident_started_before(home):
    # After an admin took a group away (or added one), sshd's next login has the new groups; the resident started
    # with the old ones greets no one of them, so the controller starts an agent, whose resident has the new groups.
    announced = start(home, 30, journal(home))[0]
    assert ask(announced, journal(home))[0]["ok"]
    assert ask_as([4242], announced, journal(home)) == []
    assert ask(announced, journal(home))[0]["ok"]  # the login it was started for is served as before


def test_a_change_to_a_login_file_turns_every_later_login_away_from_the_resident(home):
    # ~/.bashrc (or /etc/environment, ~/.profile, the interpreter's file...) changed: a new login's environment may
    # differ from the resident's, so the resident no longer greets, and the agent started instead names another.
    announced = start(home, 30, journal(home))[0]
    assert ask(announced, journal(home))[0]["ok"]
    (home / ".bashrc").write_text("export DDOPS_TEST_MARK=changed\n")
    secret = bytes.fromhex(announced["resident_secret"])
    assert unanswered(announced["resident"], hello(secret), journal(home)) == b""
    again = start(home, 30, journal(home))[0]
    assert again["resident"] != announced["resident"]
    assert ask(again, journal(home))[0]["ok"]


def test_a_second_lingering_agent_names_the_serving_resident_for_its_own_controller(home):
    # Another controller (another engineer's, a CI runner's) with no book entry starts an agent: it binds nothing,
    # and hands its controller the path and the secret of the resident already there.
    first = start(home, 30, journal(home))[0]
    inode = os.stat(first["resident"]).st_ino
    second = start(home, 30, journal(home))[0]
    assert (second["resident"], second["resident_secret"]) == (first["resident"], first["resident_secret"])
    time.sleep(0.3)
    assert os.stat(first["resident"]).st_ino == inode
    assert ask(second, journal(home))[0]["ok"]


# Asks the resident at argv[1] for its secret, as an agent would; with argv[2] == "hidden" first makes its own /proc
# entries unreadable to its user, as sshd's processes are to a user who is not root. Prints what came back.
SECRET_ASKER = f"""
import ctypes, socket, sys
if sys.argv[2] == "hidden":
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
client = socket.socket(socket.AF_UNIX)
client.settimeout(10)
client.connect(sys.argv[1])
try:
    client.sendall({LOCAL_HELLO!r})
    got = client.recv(200)
except (ConnectionResetError, BrokenPipeError):
    got = b""
sys.stdout.write(repr(got))
"""


def told(argv: list[str], path: str, how: str = "plain", **options) -> bytes:
    done = subprocess.run([*argv, "-c", SECRET_ASKER, path, how], capture_output=True, text=True, timeout=30,
                          cwd="/", **options)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout)


def as_nobody() -> None:
    os.setgid(65534)
    os.setgroups([])
    os.setuid(65534)


def test_the_secret_is_told_to_an_agent_of_its_user_that_provably_shares_its_filesystem(home):
    path = start(home, 30, journal(home))[0]["resident"]
    assert set(json.loads(told([sys.executable], path))) == {"resident_secret"}
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a mount namespace of its own")
    # a host that shares this home (another mount namespace)
    assert told(["unshare", "--mount", "--propagation", "private", sys.executable], path) == b""


def test_a_peer_whose_filesystem_cannot_be_read_is_not_told_the_secret(home):
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root to run a resident as another user, and a python3 that user can run")
    for folder, _, files in os.walk(home):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(name, 65534, 65534)
    path = start(home, 30, journal(home), preexec=as_nobody, python=python)[0]["resident"]
    assert set(json.loads(told([python], path, preexec_fn=as_nobody))) == {"resident_secret"}
    # sshd's processes, to a resident of a user who is not root: /proc does not say which filesystem they see
    assert told([python], path, "hidden", preexec_fn=as_nobody) == b""


def test_a_listener_of_another_user_in_the_resident_s_place_cannot_choose_the_secret(home):
    if os.geteuid() != 0:
        pytest.skip("needs root to listen as another user")
    path = killed_resident(home)
    os.unlink(path)
    planted = "ab" * 32
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # bound where the resident was, listening as user nobody (SO_PEERCRED names who listened)
        try:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            os.setgid(65534)
            os.setuid(65534)
            server.listen(4)
            server.settimeout(20)
            os.write(ready_w, b"x")
            connection, _ = server.accept()
            connection.settimeout(5)
            if connection.recv(100):
                connection.sendall(json.dumps({"resident_secret": planted}).encode() + b"\n")
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    try:
        second = start(home, 30, journal(home))[0]
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert second.get("resident_secret") != planted


def test_a_socket_left_by_a_killed_resident_is_replaced(home):
    path = killed_resident(home)
    with pytest.raises(ConnectionRefusedError):
        unanswered(path, journal(home))
    again = start(home, 30, journal(home))[0]
    assert again["resident"] == path
    assert ask(again, journal(home))[0]["ok"]


def test_no_path_is_announced_while_another_holds_its_name(home):
    path = killed_resident(home)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a resident still serving there (or starting): nothing of ours binds
        assert "resident" not in start(home, 30, journal(home))[0]


def test_an_orphaned_session_does_not_block_the_next_resident(home):
    first = start(home, 1, journal(home))[0]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.connect(first["resident"])  # a session that outlives its resident (a hung verb, a silent peer)
        wait_until(lambda: not os.path.exists(first["resident"]), timeout=15)
        assert resident_pids(home)  # the session goes on
        again = start(home, 30, journal(home))[0]
        assert again["resident"] == first["resident"], again
        assert ask(again, journal(home))[0]["ok"]


def test_without_linger_nothing_stays_behind(home):
    answers = start(home, 0, journal(home))
    assert "resident" not in answers[0]
    time.sleep(0.3)
    assert not resident_pids(home) and not (home / ".cache" / "ddops" / "run").exists()


def test_another_user_gets_no_answer_even_through_an_opened_directory(home):
    path = start(home, 30, journal(home))[0]["resident"]
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another user")
    # Open the way on purpose: only the peer check stands between user nobody and the agent now.
    for folder in (home, home / ".cache", home / ".cache" / "ddops", Path(path).parent):
        os.chmod(folder, 0o755)
    os.chmod(path, 0o777)
    child = os.fork()
    if child == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            os._exit(0 if unanswered(path, journal(home)) == unanswered(path, LOCAL_HELLO) == b"" else 1)
        except BaseException as error:
            os.write(2, repr(error).encode())
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("kind", ["open to others", "a symlink", "another user's"])
def test_a_socket_directory_that_is_not_private_is_never_used_nor_announced(home, tmp_path, kind):
    run = home / ".cache" / "ddops" / "run"
    run.parent.mkdir(parents=True)
    if kind == "open to others":
        run.mkdir()
        os.chmod(run, 0o755)
    elif kind == "a symlink":
        target = home / "elsewhere"
        target.mkdir(mode=0o700)
        run.symlink_to(target)  # whoever can change the link could move the socket away under us
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory away")
        run.mkdir(mode=0o700)
        os.chown(run, 65534, 65534)
    first = start(home, 30, journal(home))[0]
    assert first["ok"] and "resident" not in first and "resident_secret" not in first
    time.sleep(0.3)
    assert not list(run.glob("*.sock")) and not resident_pids(home)


def test_asked_to_probe_the_first_answer_says_whether_a_resident_listens(home):
    first = start(home, 30, journal(home), probe=True)[0]
    assert first["resident_alive"] is False and os.path.exists(first["resident"])
    probed = start(home, 30, journal(home), probe=True)[0]
    assert probed["resident_alive"] is True and "resident" not in probed
    assert "resident_alive" not in start(home, 30, journal(home))[0]
