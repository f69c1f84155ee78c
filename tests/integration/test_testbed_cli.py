"""`ddops testbed` as a user drives it: `-i FILE testbed down` takes down the testbed FILE describes (an exported
DDOPS_INVENTORY yields to DDOPS_TESTBED_ROOT), and a shared
home that hides the controller's Python (pyenv under /root) still gives the hosts an interpreter they can run."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from ddops.errors import TestbedError
from tests.conftest import requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]


def test_testbed_down_with_i_takes_down_the_testbed_that_file_describes_and_leaves_the_default_one(
        make_testbed, tmp_path):
    mine, default = make_testbed(1), make_testbed(1)
    copy = tmp_path / "copied-inventory.yaml"  # as `testbed up --inventory-out` leaves it: away from the testbed
    shutil.copyfile(mine.inventory_path, copy)
    proc = run_ddops("testbed", "down", inventory=copy, env={"DDOPS_TESTBED_ROOT": default.root})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not Path(mine.root).exists() and not mine.hosts[0].running()
    assert default.hosts[0].running()
    status = run_ddops("testbed", "status", inventory=default.inventory_path)
    assert status.returncode == 0 and "host1" in status.stdout


def test_testbed_down_takes_ddops_testbed_root_over_an_exported_ddops_inventory_and_names_the_bed(make_testbed):
    exported, meant = make_testbed(1), make_testbed(1)
    env = {"DDOPS_INVENTORY": str(exported.inventory_path), "DDOPS_TESTBED_ROOT": meant.root}
    proc = run_ddops("testbed", "down", env=env)
    assert proc.returncode == 0 and f"testbed down: {meant.root}: stopped 1 sshd process" in proc.stdout
    assert not Path(meant.root).exists() and exported.hosts[0].running()
    # Without DDOPS_TESTBED_ROOT the exported inventory says which bed; an -i typed always does.
    proc = run_ddops("testbed", "status", env={"DDOPS_INVENTORY": str(exported.inventory_path)})
    assert proc.returncode == 0 and "host1" in proc.stdout


def test_testbed_down_with_an_inventory_no_testbed_wrote_is_refused_and_stops_nothing(make_testbed, tmp_path):
    bed = make_testbed(1)
    other = tmp_path / "inventory.yaml"
    other.write_text("hosts:\n  a: {address: 127.0.0.9}\n")
    proc = run_ddops("testbed", "down", inventory=other, env={"DDOPS_TESTBED_ROOT": bed.root})
    assert proc.returncode == 2 and f"{other}: not an inventory written by `ddops testbed up`" in proc.stderr
    assert bed.hosts[0].running()


@pytest.fixture
def python_under_root_home(monkeypatch):
    """The controller's interpreter as pyenv installs it: a path under root's home (a symlink to a real Python)."""
    home = Path(os.path.expanduser("~root"))
    folder = Path(tempfile.mkdtemp(prefix="ddops-test-pyenv-", dir=home))
    (folder / "python3").symlink_to(shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable)
    monkeypatch.setattr(sys, "executable", str(folder / "python3"))
    yield folder / "python3"
    shutil.rmtree(folder)


def test_a_shared_home_that_hides_the_controllers_python_gives_hosts_one_they_can_run(make_testbed, monkeypatch,
                                                                                       python_under_root_home):
    bed = make_testbed(2, shared_home=True)
    monkeypatch.undo()  # the CLI below runs on the real interpreter
    text = bed.inventory_path.read_text()
    assert str(python_under_root_home) not in text
    proc = run_ddops("ping", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_hosts_python_the_shared_home_hides_is_refused_when_the_testbed_comes_up(make_testbed,
                                                                                    python_under_root_home):
    with pytest.raises(TestbedError, match=f"the hosts' python {python_under_root_home} does not run there"):
        make_testbed(1, shared_home=True, python=str(python_under_root_home))
