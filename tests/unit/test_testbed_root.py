"""A testbed's root is a folder no other user can change: root's sshd trusts the key in it and `testbed down`
signals the processes its files name. Another user (`nobody`, through runuser) plants folders, links and state in
/tmp, as the review's repro did; nothing of it is taken over, read or obeyed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from ddops import testbed
from ddops.errors import TestbedError
from ddops.testbed import rootdir
from ddops.testbed import slurm as slurm_testbed
from tests.conftest import REPO_ROOT, requires_sshd, run_ddops, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                                reason="needs root and runuser, to act as another user")


def as_nobody(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "nobody", "--", *argv], check=True, capture_output=True)


@pytest.fixture
def in_tmp() -> Path:
    """A fresh name in /tmp, the world-writable folder where another user gets there first; removed after."""
    path = Path("/tmp") / f"ddops-trust-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim():
    """A process of root's whose command line names a path chosen by the test (as a real sshd names its config)."""
    started = []

    def start(*words: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *words])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_root_another_user_made_first_is_refused_and_nothing_is_written_in_it(in_tmp):
    as_nobody("mkdir", "-m", "0755", str(in_tmp))
    with pytest.raises(TestbedError, match=rf"testbed root {in_tmp} belongs to nobody \(uid 65534\): it must be a "
                                           r"folder of root \(uid 0\)'s, mode 0700"):
        rootdir.claim(in_tmp)
    assert list(in_tmp.iterdir()) == [] and in_tmp.stat().st_uid == 65534


def test_a_root_under_a_folder_another_user_owns_is_refused_and_not_made(in_tmp):
    as_nobody("mkdir", "-m", "0755", str(in_tmp))
    with pytest.raises(TestbedError, match=f"the folder above it {in_tmp} belongs to nobody"):
        rootdir.claim(in_tmp / "bed")
    assert not (in_tmp / "bed").exists()


def test_a_root_that_is_a_symlink_is_refused_even_to_a_folder_of_roots(in_tmp, tmp_path):
    as_nobody("ln", "-s", str(tmp_path), str(in_tmp))
    with pytest.raises(TestbedError, match=f"testbed root {in_tmp} is a symlink"):
        rootdir.claim(in_tmp)
    os.unlink(in_tmp)
    in_tmp.symlink_to(tmp_path)  # root's own link: still not a root (what it leads to may change)
    with pytest.raises(TestbedError, match=f"testbed root {in_tmp} is a symlink"):
        rootdir.claim(in_tmp)


def test_an_existing_root_of_roots_that_others_may_enter_or_a_folder_they_may_write_is_refused(tmp_path):
    open_root = tmp_path / "open"
    open_root.mkdir(mode=0o755)
    open_root.chmod(0o755)
    with pytest.raises(TestbedError, match=r"is open to others \(mode 0755\)"):
        rootdir.claim(open_root)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # world-writable without the sticky bit: anyone may rename what it holds
    with pytest.raises(TestbedError, match=r"the folder above it .*shared is writable by others \(mode 0777\)"):
        rootdir.claim(shared / "bed")
    made = rootdir.claim(tmp_path / "a" / "b")
    assert (made.stat().st_mode & 0o777, made.stat().st_uid) == (0o700, 0)
    assert rootdir.claim(made) == made  # a private root of root's stays usable


def test_testbed_up_refuses_a_root_another_user_made_before_anything_starts(in_tmp):
    as_nobody("mkdir", "-m", "0755", str(in_tmp))
    proc = run_ddops("testbed", "up", "--hosts", "1", "--root", str(in_tmp))
    assert proc.returncode == 1 and f"testbed root {in_tmp} belongs to nobody" in proc.stderr
    assert list(in_tmp.iterdir()) == []  # no key, no state, no sshd_config: nothing for nobody to swap


def plant_testbed(root: Path, host_dir: Path, pid: int) -> None:
    """A testbed.json and sshd.pid as another user would write them, naming a process of root's."""
    (root / "testbed.json").write_text(json.dumps({
        "root": str(root), "repo_path": "/root/ddtree", "user_home": "/root", "engine": "namespace",
        "hosts": [{"name": "host1", "address": "127.0.0.2", "port": 2222, "dir": str(host_dir)}]}))
    host_dir.mkdir(parents=True, exist_ok=True)
    (host_dir / "sshd.pid").write_text(f"{pid}\n")


def test_testbed_down_obeys_no_state_another_user_planted_and_signals_nothing(in_tmp, victim):
    as_nobody("mkdir", "-m", "0700", str(in_tmp))
    proc = victim(str(in_tmp / "hosts" / "host1" / "sshd_config"))  # what `down` takes for that host's sshd
    plant_testbed(in_tmp, in_tmp / "hosts" / "host1", proc.pid)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(in_tmp)], check=True)
    down = run_ddops("testbed", "down", "--root", str(in_tmp))
    assert down.returncode == 1 and f"testbed root {in_tmp} belongs to nobody" in down.stderr
    with pytest.raises(TestbedError, match="belongs to nobody"):
        testbed.status(in_tmp)
    assert proc.poll() is None and (in_tmp / "testbed.json").exists()  # alive, and nothing removed


def test_testbed_down_refuses_state_that_names_a_folder_outside_its_root(tmp_path, victim):
    root = rootdir.claim(tmp_path / "bed")
    elsewhere = tmp_path / "elsewhere" / "host1"
    proc = victim(str(elsewhere / "sshd_config"))
    plant_testbed(root, elsewhere, proc.pid)
    with pytest.raises(TestbedError, match=f"names {elsewhere}, which is not this testbed's: not state `testbed up` "
                                           "wrote, nothing stopped"):
        testbed.down(root)
    assert proc.poll() is None


def test_the_slurm_testbed_obeys_no_pid_file_another_user_planted(in_tmp, victim):
    as_nobody("mkdir", "-m", "0755", str(in_tmp))
    proc = victim("slurmctld", str(in_tmp))  # a slurmctld naming that root, as `down` looks for
    (in_tmp / "slurm.json").write_text(json.dumps({"root": str(in_tmp)}))
    (in_tmp / "slurmctld.pid").write_text(f"{proc.pid}\n")
    subprocess.run(["chown", "-R", "nobody:nogroup", str(in_tmp)], check=True)
    with pytest.raises(TestbedError, match=f"Slurm testbed root {in_tmp} belongs to nobody"):
        slurm_testbed.down(in_tmp)
    assert proc.poll() is None


def test_the_demo_refuses_a_demo_folder_another_user_made_before_it_writes_anything(in_tmp):
    as_nobody("mkdir", "-m", "0755", str(in_tmp))
    demo = subprocess.run([str(REPO_ROOT / "scripts" / "demo")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "DDOPS_DEMO_DIR": str(in_tmp)}, cwd=REPO_ROOT)
    assert demo.returncode != 0 and f"the demo folder {in_tmp} belongs to nobody" in demo.stderr
    assert list(in_tmp.iterdir()) == []


@requires_sshd
@pytest.mark.sshd
def test_testbed_up_without_a_root_makes_a_fresh_private_one_that_status_and_down_find(monkeypatch, tmp_path):
    from tests.conftest import _fresh_prefix

    monkeypatch.delenv("DDOPS_TESTBED_ROOT", raising=False)
    monkeypatch.setenv("DDOPS_CACHE_DIR", str(tmp_path / "cache"))  # where the default is remembered
    bed = testbed.up(1, address_prefix=_fresh_prefix())
    try:
        root = Path(bed.root)
        assert root.parent == Path(tempfile.gettempdir()).resolve() and root.name.startswith("ddops-testbed-")
        assert (root.stat().st_uid, root.stat().st_mode & 0o777) == (0, 0o700)
        # the key root's sshd trusts: in folders only root can change, up to /
        for folder in Path(bed.client_key).parents:
            info = folder.stat()
            assert info.st_uid == 0 and (not info.st_mode & 0o022 or info.st_mode & 0o1000), folder
        listed = run_ddops("testbed", "status", env={"DDOPS_CACHE_DIR": str(tmp_path / "cache")})
        assert listed.returncode == 0 and "host1" in listed.stdout
        with pytest.raises(TestbedError, match=f"a testbed is already up at {root}"):
            testbed.up(1, address_prefix=_fresh_prefix())
    finally:
        down = run_ddops("testbed", "down", env={"DDOPS_CACHE_DIR": str(tmp_path / "cache")})
    assert down.returncode == 0 and f"testbed down: {root}: stopped 1 sshd process" in down.stdout
    assert not root.exists() and rootdir.remembered_default() is None
    wait_until(lambda: not bed.hosts[0].running())
