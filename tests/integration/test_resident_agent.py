"""The resident agent through real sshd: later commands reach each host's own resident over a direct-streamlocal
channel and start no Python; when it is gone or refused, ddops starts the agent as usual."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from ddops.testbed import start_host, stop_host
from tests.conftest import (MINI_DDTREE, both_engines, exited, files_patched_by, host_processes, requires_sshd,
                            resident_agents, run_ddops, wait_until)

pytestmark = [pytest.mark.sshd, requires_sshd]

OLD_LINE = "past_key_values_target = DynamicCache()"

FILES = files_patched_by(("hybrid-cache",))


@pytest.fixture
def bed(make_testbed):
    return make_testbed(2, seed=MINI_DDTREE, patches=("hybrid-cache",))


def lingering(bed, seconds: float):
    """The testbed inventory with agent_linger set for every host."""
    path = bed.inventory_path
    path.write_text(path.read_text().replace("defaults:\n", f"defaults:\n  agent_linger: {seconds}\n", 1))
    return bed


def ddops(bed, *args: str, cache: Path | None = None) -> dict:
    """ddops --json ARGS on the testbed; `cache`: as a controller with that cache directory (its own resident book)."""
    proc = run_ddops("--json", *args, inventory=bed.inventory_path,
                     env={"DDOPS_CACHE_DIR": str(cache)} if cache else None)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr and "open FAILED" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def agents(doc: dict) -> dict[str, str]:
    return {h["host"]: h["agent"] for h in doc["hosts"]}


def statuses(doc: dict) -> dict[str, str]:
    return {h["host"]: h["status"] for h in doc["hosts"]}


def system_python() -> str:
    """A python3 outside the user's home, which a shared home hides from the hosts (a pyenv under /root here)."""
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if found is None:
        pytest.skip("no system python3 for hosts whose home is shared")
    return found


def test_the_next_command_reaches_each_host_s_own_resident(bed):
    # host2 already carries half the fix: its resident must see host2's files, not host1's.
    ddtree2 = bed.host("host2").repo_dir / "ddtree.py"
    ddtree2.write_text(ddtree2.read_text().replace(OLD_LINE, "past_key_values_target = DynamicCache(config=target."
                                                  "config if hasattr(target, \"config\") else None)"))
    first = ddops(bed, "patch", "--all", "--check")
    assert agents(first) == {"host1": "started", "host2": "started"}
    wait_until(lambda: all(resident_agents(bed, h.name) for h in bed.hosts))

    applied = ddops(bed, "patch", "--all")
    assert agents(applied) == {"host1": "resident", "host2": "resident"}
    assert statuses(applied) == {"host1": "changed", "host2": "changed"}
    messages = {h["host"]: h["message"] for h in applied["hosts"]}
    assert "ddtree.py, dflash.py" in messages["host1"] and "dflash.py" in messages["host2"] \
        and "ddtree.py" not in messages["host2"]
    for host in bed.hosts:
        for name in FILES:
            assert OLD_LINE not in (host.repo_dir / name).read_text(), (host.name, name)
    assert [h["round_trips"] for h in applied["hosts"]] == [2, 2]

    back = ddops(bed, "rollback", "--all", "--yes")
    assert statuses(back) == {"host1": "changed", "host2": "changed"} and set(agents(back).values()) == {"resident"}


def test_a_second_controller_learns_of_the_resident_and_shares_it(bed, tmp_path):
    # Two engineers (or a workstation and a CI runner) drive the same hosts as the same user, each with a book of
    # its own: the second is told of the first one's residents and uses them from its next command on.
    assert agents(ddops(bed, "patch", "--all", "--check")) == {"host1": "started", "host2": "started"}
    wait_until(lambda: all(resident_agents(bed, h.name) for h in bed.hosts))
    serving = {h.name: set(resident_agents(bed, h.name)) for h in bed.hosts}
    other = tmp_path / "other-controller"
    assert agents(ddops(bed, "patch", "--all", "--check", cache=other)) == {"host1": "started", "host2": "started"}
    assert agents(ddops(bed, "patch", "--all", "--check", cache=other)) == {"host1": "resident", "host2": "resident"}
    assert agents(ddops(bed, "patch", "--all", "--check")) == {"host1": "resident", "host2": "resident"}
    assert {h.name: set(resident_agents(bed, h.name)) for h in bed.hosts} == serving  # the same ones, no others


def test_agent_linger_0_leaves_nothing_running_on_the_hosts(bed):
    lingering(bed, 0)
    assert agents(ddops(bed, "patch", "--all", "--check")) == {"host1": "started", "host2": "started"}
    assert agents(ddops(bed, "patch", "--all", "--check")) == {"host1": "started", "host2": "started"}
    wait_until(lambda: not any(host_processes(bed, h.name) for h in bed.hosts))


def test_a_resident_that_is_gone_costs_only_a_fresh_start(bed):
    ddops(bed, "patch", "--all", "--check")
    wait_until(lambda: resident_agents(bed, "host1"))
    killed = resident_agents(bed, "host1")
    for pid in killed:
        os.kill(pid, signal.SIGKILL)  # as a reboot would: the socket file stays behind
    wait_until(lambda: all(map(exited, killed)))

    after = ddops(bed, "patch", "--all")
    assert agents(after) == {"host1": "started", "host2": "resident"}
    assert statuses(after) == {"host1": "changed", "host2": "changed"}
    wait_until(lambda: resident_agents(bed, "host1"))
    assert agents(ddops(bed, "status", "--all")) == {"host1": "resident", "host2": "resident"}


def test_a_resident_idles_out_after_agent_linger_seconds(bed, tmp_path):
    lingering(bed, 1)
    ddops(bed, "patch", "--all", "--check", cache=tmp_path)
    # Each host's agent announced the resident it left (read from the book: a one-second resident may be gone before
    # a process listing would see it).
    book = json.loads((tmp_path / "residents.json").read_text())
    assert [bool(entry.get("socket")) for entry in book.values()] == [True, True]
    wait_until(lambda: not any(host_processes(bed, h.name) for h in bed.hosts), timeout=20)
    assert agents(ddops(bed, "patch", "--all", "--check", cache=tmp_path)) == {"host1": "started", "host2": "started"}


def test_a_host_whose_sshd_refuses_socket_channels_is_served_without_a_resident(bed):
    host = bed.host("host1")
    host.config.write_text(host.config.read_text() + "AllowStreamLocalForwarding no\n")
    stop_host(bed, "host1")
    start_host(bed, "host1")

    ddops(bed, "patch", "--all", "--check")  # leaves a resident, which sshd will not let us reach
    wait_until(lambda: resident_agents(bed, "host1"))
    refused = ddops(bed, "patch", "--all", "--check")
    assert agents(refused) == {"host1": "started", "host2": "resident"}
    assert statuses(refused) == {"host1": "changed", "host2": "changed"}

    killed = resident_agents(bed, "host1")
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(map(exited, killed)))
    assert agents(ddops(bed, "patch", "--all", "--check"))["host1"] == "started"
    time.sleep(0.5)
    assert not host_processes(bed, "host1")  # not asked to linger again: nothing left behind


IMPOSTORS = {
    # a resident dying under us: accepts and hangs up at once
    "hangs_up": lambda connection, reader: None,
    # a listener put in the resident's place that greets as residents did before issue 11 and answers everything
    "answers_everything": lambda connection, reader: [connection.sendall(b"\n")] + [
        connection.sendall(b'{"ok": false, "error": {"kind": "internal", "message": "impostor"}}\n')
        for _ in iter(reader.readline, b"")],
}


@pytest.mark.parametrize("impostor", sorted(IMPOSTORS))
def test_a_listener_in_the_resident_s_place_is_bypassed_and_nothing_is_lost(bed, impostor, tmp_path):
    import socket
    import threading

    ddops(bed, "patch", "--all", "--check")
    wait_until(lambda: resident_agents(bed, "host1"))
    [socket_path] = (Path(bed.host("host1").dir) / "agent-cache" / "run").glob("*.sock")
    killed = resident_agents(bed, "host1")
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(map(exited, killed)))
    socket_path.unlink()
    short = Path(tempfile.mkdtemp(prefix="imp", dir="/tmp"))  # unix socket paths are limited to ~100 bytes
    (short / "run").symlink_to(socket_path.parent)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(short / "run" / socket_path.name))
    listener.listen(8)
    served = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            served.append(1)
            with connection, connection.makefile("rb") as reader:
                try:
                    IMPOSTORS[impostor](connection, reader)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        applied = ddops(bed, "patch", "--all")
    finally:
        listener.close()
        shutil.rmtree(short)
    assert served, "the command never tried the socket"
    assert statuses(applied) == {"host1": "changed", "host2": "changed"}, applied
    assert agents(applied) == {"host1": "started", "host2": "resident"}
    for name in FILES:
        assert OLD_LINE not in (bed.host("host1").repo_dir / name).read_text()


@both_engines
def test_on_hosts_that_share_one_home_each_command_acts_only_on_the_host_it_names(make_testbed, testbed_engine):
    # Containers with a common /root volume, or namespace hosts with --shared-home: every host sees the same
    # ~/.cache/ddops, where the resident's socket lives, and each has its own repo (issue 11, the user's sequence).
    python = system_python() if testbed_engine == "namespace" else None  # containers: the image's python3
    bed = make_testbed(3, seed=MINI_DDTREE, patches=("hybrid-cache",), shared_home=True, python=python)
    one, three = bed.host("host1"), bed.host("host3")
    originals = {name: (three.repo_dir / name).read_bytes() for name in FILES}
    first = ddops(bed, "patch", "--host", "host1")  # leaves host1's resident, bound before the answer came
    assert statuses(first) == {"host1": "changed"}, first
    for _ in range(2):  # the first check starts an agent on host3; the second would reach a resident
        checked = ddops(bed, "patch", "--host", "host3", "--check")
        assert statuses(checked) == {"host3": "changed"}, checked  # pending there, never "already applied"
    assert agents(checked) == {"host3": "resident"}  # host3's own resident, which sees host3's repo
    assert {name: (three.repo_dir / name).read_bytes() for name in FILES} == originals

    back = ddops(bed, "rollback", "--host", "host3", "--yes")
    assert statuses(back)["host3"] != "changed", back  # nothing of host3's was ever patched
    for name in FILES:
        assert OLD_LINE not in (one.repo_dir / name).read_text(), f"host1's {name} was rolled back through host3"
        assert (three.repo_dir / name).read_bytes() == originals[name]


def test_a_changed_rc_file_sends_the_next_command_to_a_fresh_agent_and_a_new_resident(bed):
    # The login's environment is built from ~/.bashrc (among others): after it changed, the resident started before
    # greets no one, so ddops starts the agent for the command, and that agent leaves a resident of the new login.
    first = ddops(bed, "patch", "--all", "--check")
    assert agents(first) == {"host1": "started", "host2": "started"}
    wait_until(lambda: all(resident_agents(bed, h.name) for h in bed.hosts))
    assert agents(ddops(bed, "patch", "--all", "--check")) == {"host1": "resident", "host2": "resident"}
    rc_file = Path(bed.host("host1").dir) / "bashrc"  # bind-mounted over host1's ~/.bashrc
    with open(rc_file, "a") as fh:  # in place: the bind mount follows the inode
        fh.write("export DDOPS_TEST_MARK=changed\n")
    changed = ddops(bed, "patch", "--all", "--check")
    assert agents(changed) == {"host1": "started", "host2": "resident"}
    assert statuses(changed) == {"host1": "changed", "host2": "changed"}
    wait_until(lambda: len(resident_agents(bed, "host1")) == 2)  # the old one idles out in its own time
    assert agents(ddops(bed, "patch", "--all", "--check")) == {"host1": "resident", "host2": "resident"}
