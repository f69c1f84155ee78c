"""A pipx user's first bench: the wheel installed on its own (ddops' dependencies, no torch, no transformers), a
testbed seeded with mini-ddtree, patched, then `bench`: it says, per host, exactly what to install and for which
python, instead of launching runs that die on an ImportError."""

from __future__ import annotations

import json
import subprocess
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import _fresh_prefix, requires_sshd
from tests.integration.test_wheel_install import run_installed, wheel_venv

pytestmark = [pytest.mark.sshd, requires_sshd]

# What a pipx venv of ddops lacks: what the hosts' plan needs (and what pulls in torch).
LEFT_OUT = ("torch", "transformers", "functorch", "torchgen", "nvidia", "triton")


@pytest.fixture(scope="module")
def pipx_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the wheel, seeing ddops' dependencies but not torch or transformers; its bin/ folder."""
    root = tmp_path_factory.mktemp("pipx")
    venv, site = wheel_venv(root)
    # The project venv's packages, but those the hosts' plan needs, as links in a folder of their own.
    deps = root / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        lowered = entry.name.lower()
        if entry.suffix == ".pth" or lowered.startswith(("ddops", "__editable__")) or \
                lowered.split("-")[0].split(".")[0] in LEFT_OUT:
            continue
        (deps / entry.name).symlink_to(entry)
    (site / "dependencies.pth").write_text(f"{deps}\n")
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                            "print(u.find_spec('torch'), u.find_spec('paramiko') is not None)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["None", "True"], probe.stdout
    return venv / "bin"


def test_a_pipx_install_seeds_a_testbed_and_bench_says_what_to_install_where(pipx_like, tmp_path):
    root, inventory = tmp_path / "bed", tmp_path / "inventory.yaml"
    python = pipx_like / "python"
    up = run_installed(pipx_like, "ddops", "testbed", "up", "-n", "2", "--seed", "mini-ddtree", "--root", str(root),
                       "--address-prefix", _fresh_prefix(), "--inventory-out", str(inventory), cwd=tmp_path)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        patched = run_installed(pipx_like, "ddops", "-i", str(inventory), "patch", "--all", "cpu-timing",
                                "hybrid-cache", "crop-relative", cwd=tmp_path)
        assert patched.returncode == 0, patched.stdout + patched.stderr
        bench = run_installed(pipx_like, "ddops", "--json", "-i", str(inventory), "bench", "mini-ddtree-bench",
                              "--all", cwd=tmp_path)
        assert bench.returncode == 1, bench.stdout + bench.stderr
        doc = json.loads(bench.stdout)
        assert doc["run_id"] is None  # nothing launched
        for host in doc["hosts"]:
            assert host["status"] == "failed"
            assert host["data"]["problems"] == [
                f"torch is not installed, plan needs >=2.4 (install it for {python}: {python} -m pip install "
                "'torch>=2.4')",
                f"transformers is not installed, plan needs >=5.2.0,<5.26 (install it for {python}: {python} -m pip "
                "install 'transformers>=5.2.0,<5.26')"], host
    finally:
        down = run_installed(pipx_like, "ddops", "-i", str(inventory), "testbed", "down", cwd=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
