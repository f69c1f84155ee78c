"""The resident agent, driven as sshd would drive it: started by the bootstrap with --linger, then reached on its
unix socket. (tests/integration/test_resident_agent.py covers the same through real sshd and ddops.)"""

from __future__ import annotations

import json
import os
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

from ddops.transport.agent import agent_digest, agent_source, bootstrap_command
from tests.conftest import exited, wait_until


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
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


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


def start(home: Path, linger: float, *requests: bytes, probe: bool = False) -> list[dict]:
    """Run an agent session with --linger; its answers. The resident it leaves runs on in the background."""
    source = agent_source()
    command = bootstrap_command(sys.executable, len(source), digest=agent_digest(), serve=True, linger=linger,
                                probe_resident=probe)
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(home / ".cache")}
    done = subprocess.run(["/bin/sh", "-c", command], input=source + b"".join(requests), capture_output=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def ask(socket_path: str, *requests: bytes) -> list[dict]:
    """Send requests to the resident over its socket, as sshd forwards them; one answer per request."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(30)
        client.connect(socket_path)
        reader = client.makefile("rb")
        assert reader.readline() == b"\n"  # the greeting: a session process is there for us
        answers = []
        for line in requests:
            client.sendall(line)
            answers.append(json.loads(reader.readline()))
        return answers


def journal(home: Path) -> bytes:
    return request("journal", {"repo": str(home / "repo")})


def test_the_first_answer_names_the_socket_where_the_agent_stays_on(home):
    first, second = start(home, 30, journal(home), journal(home))
    path = first["resident"]
    assert "resident" not in second
    python_tag = Path(path).name[-13:-5]  # a hash of the Python's path
    assert path == str(home / ".cache" / "ddops" / "run" / f"agent-{agent_digest()[:16]}-{python_tag}.sock")
    wait_until(lambda: os.path.exists(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_the_resident_answers_later_sessions_each_in_a_process_of_its_own(home):
    path = start(home, 30, journal(home))[0]["resident"]
    wait_until(lambda: os.path.exists(path))
    probe = request("facts", {"repo": str(home / "repo")})
    one = ask(path, probe, journal(home))
    two = ask(path, probe)
    assert [a["ok"] for a in one + two] == [True, True, True]
    assert one[1]["result"] == {"entries": [], "corrupt": []}
    assert one[0]["result"]["repo_exists"] is True


def test_the_resident_leaves_once_idle_and_takes_its_socket_with_it(home):
    path = start(home, 1, journal(home))[0]["resident"]
    wait_until(lambda: os.path.exists(path))
    wait_until(lambda: not os.path.exists(path) and not resident_pids(home), timeout=15)


def test_a_second_lingering_agent_leaves_the_serving_resident_in_place(home):
    path = start(home, 30, journal(home))[0]["resident"]
    wait_until(lambda: os.path.exists(path))
    inode = os.stat(path).st_ino
    assert start(home, 30, journal(home))[0]["resident"] == path
    time.sleep(0.5)
    assert os.stat(path).st_ino == inode
    assert ask(path, journal(home))[0]["ok"]


def test_a_socket_left_by_a_killed_resident_is_replaced(home):
    path = start(home, 30, journal(home))[0]["resident"]
    wait_until(lambda: os.path.exists(path))
    killed = resident_pids(home)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(map(exited, killed)))
    with pytest.raises(ConnectionRefusedError):
        ask(path, journal(home))
    start(home, 30, journal(home))
    wait_until(lambda: resident_pids(home))
    assert wait_until(lambda: _answers(path, journal(home)))[0]["ok"]


def _answers(path: str, line: bytes) -> list[dict] | None:
    try:
        return ask(path, line)
    except OSError:
        return None


def test_without_linger_nothing_stays_behind(home):
    answers = start(home, 0, journal(home))
    assert "resident" not in answers[0]
    time.sleep(0.3)
    assert not resident_pids(home) and not (home / ".cache" / "ddops" / "run").exists()


def test_another_user_gets_no_answer_even_through_an_opened_directory(home):
    path = start(home, 30, journal(home))[0]["resident"]
    wait_until(lambda: os.path.exists(path))
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
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(path)
                try:
                    client.sendall(journal(home))
                    answer = client.recv(100)
                except (ConnectionResetError, BrokenPipeError):  # closed before or after our request came
                    answer = b""
                os._exit(0 if answer == b"" else 1)
        except BaseException as error:
            os.write(2, repr(error).encode())
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_directory_others_can_enter_is_never_used(home):
    run = home / ".cache" / "ddops" / "run"
    run.mkdir(parents=True)
    os.chmod(run, 0o755)
    path = start(home, 30, journal(home))[0]["resident"]
    time.sleep(0.5)
    assert not os.path.exists(path) and not resident_pids(home)


def test_asked_to_probe_the_first_answer_says_whether_a_resident_listens(home):
    first = start(home, 30, journal(home), probe=True)[0]
    assert first["resident_alive"] is False
    wait_until(lambda: os.path.exists(first["resident"]))
    assert start(home, 30, journal(home), probe=True)[0]["resident_alive"] is True
    assert "resident_alive" not in start(home, 30, journal(home))[0]
