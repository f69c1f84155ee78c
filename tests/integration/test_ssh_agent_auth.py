"""Authenticating as OpenSSH does, against real sshd hosts and a real ssh-agent: the agent's copy of an encrypted key,
its passphrase asked once on a terminal, no key at all, and a key file that is not there."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, requires_sshd, run_ddops, wait_until

PASSPHRASE = "correct horse battery"


@pytest.fixture
def ssh_agent(tmp_path):
    """A real ssh-agent on a socket of its own (never the user's), killed after the test."""
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("needs openssh-client (ssh-agent, ssh-add)")
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, timeout=10)
        yield sock
    finally:
        proc.kill()
        proc.wait()


def ssh_add(sock: Path, key: Path, passphrase: str, tmp_path: Path) -> None:
    """`ssh-add KEY`, its passphrase given through SSH_ASKPASS (ssh-add reads no stdin without a terminal)."""
    askpass = tmp_path / "askpass.sh"
    askpass.write_text(f"#!/bin/sh\nprintf '%s\\n' '{passphrase}'\n")
    askpass.chmod(0o700)
    env = {**os.environ, "SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
           "DISPLAY": os.environ.get("DISPLAY", ":0")}
    done = subprocess.run(["ssh-add", str(key)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr


def encrypted_copy(bed, tmp_path: Path) -> Path:
    """The testbed's client key (the one its hosts accept), encrypted with PASSPHRASE; no .pub beside it."""
    key = tmp_path / "encrypted_key"
    shutil.copyfile(bed.client_key, key)
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", PASSPHRASE, "-f", str(key)], check=True,
                   capture_output=True)
    assert b"bcrypt" in base64.b64decode("".join(key.read_text().splitlines()[1:-1]))
    return key


def inventory_with_key(bed, key: Path | str | None, tmp_path: Path) -> Path:
    text = bed.inventory_path.read_text()
    line = f"  identity_file: {json.dumps(str(bed.client_key))}\n"
    assert line in text
    path = tmp_path / "inventory.yaml"
    path.write_text(text.replace(line, f"  identity_file: {json.dumps(str(key))}\n" if key else ""))
    return path


def clean_env(tmp_path: Path, agent: Path | None = None) -> dict[str, str]:
    """A home without keys, and the test's own agent or none (never the user's)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update(HOME=str(home), COLUMNS="200")
    if agent is not None:
        env["SSH_AUTH_SOCK"] = str(agent)
    return env


def ddops(*args: str, env: dict[str, str], input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddops", *args], capture_output=True, text=True, env=env,
                          input=input if input is not None else "", timeout=120, cwd=REPO_ROOT)


@pytest.mark.sshd
@requires_sshd
def test_an_encrypted_key_loaded_in_ssh_agent_connects_through_the_agents_copy(make_testbed, ssh_agent, tmp_path):
    bed = make_testbed(2)
    key = encrypted_copy(bed, tmp_path)
    inventory = inventory_with_key(bed, key, tmp_path)

    # Without the agent holding it and without a terminal: one line saying to ssh-add it, and nothing connects.
    refused = ddops("-i", str(inventory), "--json", "ping", "--all", env=clean_env(tmp_path))
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert f"identity_file {key} is encrypted" in line and f"ssh-add {key}" in line
    assert "hosts" not in json.loads(refused.stdout)  # no host was worked on

    ssh_add(ssh_agent, key, PASSPHRASE, tmp_path)
    done = ddops("-i", str(inventory), "--json", "ping", "--all", env=clean_env(tmp_path, ssh_agent))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [h["status"] for h in json.loads(done.stdout)["hosts"]] == ["ok", "ok"]


@pytest.mark.sshd
@requires_sshd
def test_an_agent_key_the_host_refuses_is_named_and_the_key_file_is_tried_after_it(make_testbed, ssh_agent,
                                                                                     tmp_path):
    bed = make_testbed(1)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    ssh_add(ssh_agent, other, "", tmp_path)

    # The agent's key is refused, the (plain) identity_file then gets in.
    done = ddops("-i", str(bed.inventory_path), "--json", "ping", "--all", env=clean_env(tmp_path, ssh_agent))
    assert done.returncode == 0, done.stdout + done.stderr

    # No identity_file, and only a key the host does not accept: what was tried, in one line.
    inventory = inventory_with_key(bed, None, tmp_path)
    failed = ddops("-i", str(inventory), "--json", "ping", "--all", env=clean_env(tmp_path, ssh_agent))
    assert failed.returncode == 1
    (host,) = json.loads(failed.stdout)["hosts"]
    assert host["status"] == "unreachable"
    assert "authentication failed for root@" in host["message"] and "ssh-agent key ssh-ed25519" in host["message"]


@pytest.mark.sshd
@requires_sshd
@pytest.mark.parametrize("set_in", ["inventory", "ssh_config"])
def test_identities_only_offers_the_hosts_own_key_and_none_of_the_agents_others(make_testbed, ssh_agent, tmp_path,
                                                                                  set_in):
    bed = make_testbed(1)
    for i in range(6):  # sshd's MaxAuthTries: six refused keys end the connection before the identity file's turn
        other = tmp_path / f"other{i}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        ssh_add(ssh_agent, other, "", tmp_path)
    every_key = ddops("-i", str(bed.inventory_path), "--json", "ping", "--all", env=clean_env(tmp_path, ssh_agent))
    assert every_key.returncode == 1 and json.loads(every_key.stdout)["hosts"][0]["status"] == "unreachable"

    text = bed.inventory_path.read_text()
    if set_in == "inventory":
        text = text.replace("  connect_timeout: 5\n", "  connect_timeout: 5\n  identities_only: true\n")
    else:
        (tmp_path / "ssh_config").write_text("Host *\n  IdentitiesOnly yes\n")
        text = text.replace("ssh_config: /dev/null", f"ssh_config: {tmp_path / 'ssh_config'}")
    assert "identities_only: true" in text or str(tmp_path / "ssh_config") in text
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(text)
    only_its_own = ddops("-i", str(inventory), "--json", "ping", "--all", env=clean_env(tmp_path, ssh_agent))
    assert only_its_own.returncode == 0, only_its_own.stdout + only_its_own.stderr


@pytest.mark.sshd
@requires_sshd
def test_no_key_at_all_says_what_was_tried_and_what_to_set(make_testbed, tmp_path):
    bed = make_testbed(1)
    inventory = inventory_with_key(bed, None, tmp_path)
    done = ddops("-i", str(inventory), "--json", "ping", "--all", env=clean_env(tmp_path))
    assert done.returncode == 1
    (host,) = json.loads(done.stdout)["hosts"]
    assert host["status"] == "unreachable"
    message = host["message"]
    assert message.startswith("no authentication method for root@")  # the host is beside it, once
    assert "no ssh-agent" in message and "no identity_file set" in message
    assert "set `identity_file:`" in message and "ssh-add" in message
    assert "\n" not in message


def run_on_a_terminal(argv: list[str], env: dict[str, str], answers: dict[bytes, bytes],
                      timeout: float = 120) -> tuple[int, bytes]:
    """Run argv with a pseudo-terminal as its controlling terminal and stdio; answer each prompt once it appears."""
    master, slave = os.openpty()

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # after setsid: the pty becomes /dev/tty, where getpass asks

    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO_ROOT,
                            start_new_session=True, preexec_fn=take_terminal)
    os.close(slave)
    seen = b""
    answered: set[bytes] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed its end
                    break
                if not chunk:
                    break
                seen += chunk
                for prompt, answer in answers.items():
                    if prompt in seen and prompt not in answered:
                        answered.add(prompt)
                        os.write(master, answer)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return code, seen


@pytest.mark.sshd
@requires_sshd
def test_an_encrypted_key_without_an_agent_asks_its_passphrase_once_on_a_terminal(make_testbed, tmp_path):
    bed = make_testbed(3)
    key = encrypted_copy(bed, tmp_path)
    inventory = inventory_with_key(bed, key, tmp_path)
    prompt = f"Enter passphrase for key '{key}': ".encode()
    code, seen = run_on_a_terminal([sys.executable, "-m", "ddops", "-i", str(inventory), "ping", "--all"],
                                   clean_env(tmp_path), {prompt: PASSPHRASE.encode() + b"\n"})
    text = seen.decode("utf-8", "replace")
    assert code == 0, text
    assert seen.count(prompt) == 1  # once per run, not once per host
    assert PASSPHRASE not in text  # not echoed
    assert text.count(" ok") >= 3 or text.count("ok") >= 3

    # Without a terminal, --ask-key-passphrase reads it from stdin.
    done = ddops("-i", str(inventory), "--ask-key-passphrase", "--json", "ping", "--all", env=clean_env(tmp_path),
                 input=PASSPHRASE + "\n")
    assert done.returncode == 0, done.stderr
    assert {h["status"] for h in json.loads(done.stdout)["hosts"]} == {"ok"}

    # A wrong one is refused in one line, after the tries ssh gives.
    wrong = ddops("-i", str(inventory), "--ask-key-passphrase", "--json", "ping", "--all", env=clean_env(tmp_path),
                  input="no\nnope\nstill no\n")
    assert wrong.returncode == 2
    assert f"identity_file {key}: no correct passphrase given" in wrong.stderr


def test_a_missing_identity_file_is_an_inventory_error_before_any_connection(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    missing = tmp_path / "no_such_key"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("ssh_config: /dev/null\n"
                         f"known_hosts: {tmp_path / 'known_hosts'}\n"
                         "hosts:\n"
                         f"  h1: {{address: localhost, port: {port}}}\n"
                         f"  h2: {{address: 127.0.0.1, port: {port}, user: me,\n"
                         f"       identity_file: {missing}}}\n")
    try:
        done = run_ddops("--json", "ping", "--all", inventory=inventory, env=clean_env(tmp_path))
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert f"{inventory}:6: hosts.h2.identity_file: {missing} does not exist" in line
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected, not even for h1
    finally:
        listener.close()
