"""ddops as a user installs it: the wheel, non-editable, in a fresh venv, patching real sshd hosts.

The wheel must carry the host agent and the built-in playbooks: nothing may come from this checkout. So the venv
sees ddops only through the wheel; it sees the other dependencies (paramiko, typer, libcst...) through a .pth line
naming the project venv's site-packages, whose own .pth files (the editable install's path to the checkout among
them) Python does not read; and every command runs from a temporary directory, never from the checkout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import MINI_DDTREE, REPO_ROOT, _fresh_prefix, git_seed, requires_sshd

pytestmark = [pytest.mark.sshd, requires_sshd]

PATCHES = ("cpu-timing", "hybrid-cache", "crop-relative")
# What the wheel is built from: the package, the agent and the playbooks, and the project metadata.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "ddops", "remote", "playbooks", "examples")


def wheel_venv(root: Path) -> tuple[Path, Path]:
    """(a venv under root with the wheel of this tree installed, not editable, and nothing else; its site folder)."""
    tree = root / "tree"  # a copy: the build writes build/ and *.egg-info, which must not race other test runs
    tree.mkdir()
    for name in SOURCES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, tree / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(tree)],
                   check=True, cwd=root, capture_output=True, timeout=300)
    [wheel] = (root / "dist").glob("ddops-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   cwd=root, capture_output=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    return venv, site


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel of this tree installed (not editable); its bin/ folder."""
    venv, site = wheel_venv(tmp_path_factory.mktemp("wheel"))
    (site / "project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def run_installed(bin_dir: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**env, "COLUMNS": "200"})


def test_the_installed_package_finds_its_agent_and_playbooks_inside_itself(installed, tmp_path):
    probe = run_installed(installed, "python", "-c", "import ddops, ddops.resources as r; "
                          "print(ddops.__file__); print(r.remote_dir()); print(r.playbooks_dir())", cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    package, remote, playbooks = (Path(line) for line in probe.stdout.splitlines())
    venv = installed.parent
    assert venv in package.parents and REPO_ROOT not in package.parents
    assert remote == package.parent / "_remote" and (remote / "ddops_agent" / "protocol.py").is_file()
    assert playbooks == package.parent / "_playbooks" and (playbooks / "hybrid-cache.yaml").is_file()


def test_the_installed_ddops_checks_and_patches_testbed_hosts(installed, make_testbed, tmp_path):
    seed = git_seed(MINI_DDTREE, tmp_path / "seed")
    bed = make_testbed(2, seed=seed, patches=PATCHES)
    before = {h.name: hashlib.sha256((h.repo_dir / "ddtree.py").read_bytes()).hexdigest() for h in bed.hosts}

    check = run_installed(installed, "ddops", "-i", str(bed.inventory_path), "patch", "--all", "--check",
                          cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "2 hosts: identical diff" in check.stdout
    assert not (bed.hosts[0].repo_dir / ".ddops").exists()

    applied = run_installed(installed, "ddops", "--json", "-i", str(bed.inventory_path), "patch", "--all",
                            cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert {h["status"] for h in json.loads(applied.stdout)["hosts"]} == {"changed"}
    for host in bed.hosts:
        assert hashlib.sha256((host.repo_dir / "ddtree.py").read_bytes()).hexdigest() != before[host.name]
        assert (host.repo_dir / ".ddops" / "journal.jsonl").exists()


def test_the_installed_package_carries_mini_ddtree_and_its_metadata_names_license_and_urls(installed, tmp_path):
    probe = run_installed(installed, "python", "-c", "import json, importlib.metadata as m, ddops.testbed as t; "
                          "meta = m.metadata('ddops'); print(t.resolve_seed('mini-ddtree')); "
                          "print(json.dumps([meta.get('License-Expression'), meta.get_all('Project-URL')]))",
                          cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    seed_line, meta_line = probe.stdout.splitlines()
    seed = Path(seed_line)
    assert installed.parent in seed.parents and REPO_ROOT not in seed.parents
    for name in ("benchmark.py", "ddtree.py", "dflash.py", "make_models.py", "run_benchmark.sh", "data/mini.jsonl",
                 "model/__init__.py"):
        assert (seed / name).is_file(), name
    assert (seed.parent / "ci" / "github-actions.yml").is_file()
    license_, urls = json.loads(meta_line)
    assert license_ == "MIT" and any(u.startswith("Documentation, https://") for u in urls)


def test_a_pipx_user_seeds_a_testbed_with_mini_ddtree_and_takes_it_down_with_i(installed, tmp_path):
    root, inventory = tmp_path / "bed", tmp_path / "elsewhere" / "inventory.yaml"
    inventory.parent.mkdir()
    up = run_installed(installed, "ddops", "testbed", "up", "-n", "1", "--seed", "mini-ddtree", "--root", str(root),
                       "--address-prefix", _fresh_prefix(), "--inventory-out", str(inventory), cwd=tmp_path)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        repo = root / "hosts" / "host1" / "repo"
        assert (repo / "ddtree.py").read_bytes() == (MINI_DDTREE / "ddtree.py").read_bytes()
        ping = run_installed(installed, "ddops", "-i", str(inventory), "ping", "--all", cwd=tmp_path)
        assert ping.returncode == 0, ping.stdout + ping.stderr
    finally:
        down = run_installed(installed, "ddops", "-i", str(inventory), "testbed", "down", cwd=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped 1 sshd process" in down.stdout and not root.exists()
