"""The transformers releases the hybrid playbooks support, each in a venv of its own under .cache/, built once.

A venv holds the pinned CPU torch and one transformers release, nothing else: torch lies once in a base venv that
every release venv sees through a .pth line (pip then finds it installed and leaves it alone), so a release costs
its own wheels only. A venv is reused while its stamp names what it was built from.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
SUPPORT = REPO_ROOT / "playbooks" / "hybrid-support.yaml"
MATRIX_DIR = Path(os.environ.get("DDOPS_HYBRID_MATRIX_DIR", REPO_ROOT / ".cache" / "hybrid-matrix"))
TORCH = "torch==2.13.0"


def support() -> dict:
    """playbooks/hybrid-support.yaml: the releases and what the matrix proved on each."""
    return yaml.safe_load(SUPPORT.read_text())


def releases() -> list[str]:
    return [str(entry["version"]) for entry in support()["transformers"]]


def subset(all_releases: list[str]) -> list[str]:
    """What the default suite runs: the oldest, a middle one and the newest."""
    return list(dict.fromkeys([all_releases[0], all_releases[len(all_releases) // 2], all_releases[-1]]))


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _pip(venv: Path, *args: str) -> None:
    done = subprocess.run([str(_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} into {venv} failed:\n{done.stderr[-3000:]}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _built(venv: Path, stamp: str, build) -> Path:
    """venv, built by build(venv) unless its stamp already says stamp (a venv half built is built again)."""
    done = venv / ".ddops-built"
    with _locked(venv.parent / f".{venv.name}.lock"):
        if not (done.is_file() and done.read_text() == stamp):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            build(venv)
            done.write_text(stamp)
    return venv


def _site_packages(venv: Path) -> str:
    return subprocess.run([str(_python(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()


def base_venv() -> Path:
    """The venv holding torch alone."""
    return _built(MATRIX_DIR / "base", TORCH, lambda venv: _pip(venv, TORCH))


def venv_python(version: str) -> Path:
    """The python of the venv with torch and transformers==version (built on first use)."""
    base = base_venv()

    def build(venv: Path) -> None:
        # After the venv's own site-packages: the release's own dependencies win over anything the base holds.
        Path(_site_packages(venv), "ddops-torch.pth").write_text(_site_packages(base) + "\n")
        _pip(venv, f"transformers=={version}")

    return _python(_built(MATRIX_DIR / f"transformers-{version}", f"{TORCH} transformers=={version}", build))


if __name__ == "__main__":  # python tests/hybrid_matrix.py [VERSION...]: build the venvs ahead of a run
    for wanted in sys.argv[1:] or releases():
        print(venv_python(wanted), flush=True)
