"""The transformers releases the hybrid playbooks support, each in a venv of its own under .cache/, built once.

A venv holds the pinned CPU torch and one transformers release, nothing else: torch lies once in a base venv that
every release venv sees through a .pth line (pip then finds it installed and leaves it alone), so a release costs
its own wheels only; pip itself runs from the base, not copied into each. A venv is reused while its stamp names what
it was built from.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
SUPPORT = REPO_ROOT / "playbooks" / "hybrid-support.yaml"
MATRIX_DIR = Path(os.environ.get("DDOPS_HYBRID_MATRIX_DIR", REPO_ROOT / ".cache" / "hybrid-matrix"))
BASE = MATRIX_DIR / "base"  # torch, and the pip every release venv is installed with
TORCH = "torch==2.13.0"


README = REPO_ROOT / "README.md"
TABLE_BEGIN = "<!-- hybrid-support: begin (tests/hybrid_matrix.py --write) -->"
TABLE_END = "<!-- hybrid-support: end -->"
# Where a matrix run (DDOPS_HYBRID_MATRIX_RECORD=DIR) leaves what it observed on each release, one JSON file each.
RECORD_ENV = "DDOPS_HYBRID_MATRIX_RECORD"


def entries() -> list[dict]:
    """playbooks/hybrid-support.yaml's releases, oldest first, with what the matrix proved on each."""
    return yaml.safe_load(SUPPORT.read_text())["transformers"]


def releases() -> list[str]:
    return [str(entry["version"]) for entry in entries()]


def entry(version: str) -> dict:
    return next(e for e in entries() if str(e["version"]) == version)


def selected() -> list[str]:
    """The releases this run tests: by default the oldest, a middle one and the newest; DDOPS_HYBRID_MATRIX=rest
    the others (scripts/test runs them beside the default suite), =all every one."""
    every = releases()
    default = list(dict.fromkeys([every[0], every[len(every) // 2], every[-1]]))
    wanted = os.environ.get("DDOPS_HYBRID_MATRIX", "default")
    return {"default": default, "rest": [v for v in every if v not in default], "all": every}[wanted]


def readme_table(rows: list[dict]) -> str:
    """The README's compatibility table, from playbooks/hybrid-support.yaml."""
    lines = ["| transformers | with hybrid-cache, crop-relative, hybrid-tree-verify |", "| --- | --- |"]
    for row in rows:
        if row["supported"]:
            said = (f"every method equals cache-free greedy; DDTree's and DFlash's verify: `{row['verify']}`")
        else:
            said = f"not supported: {row['why']}"
        lines.append(f"| {row['version']} | {said} |")
    return "\n".join(lines)


def write(observed_dir: Path) -> None:
    """Each release's entry from what a matrix run observed (one JSON per release), then the README's table."""
    import json

    rows = []
    for row in entries():
        seen = observed_dir / f"{row['version']}.json"
        if seen.is_file():
            found = json.loads(seen.read_text())
            row = {"version": row["version"], **found}
        rows.append(row)
    SUPPORT.write_text(SUPPORT.read_text().split("transformers:")[0] + yaml.safe_dump(
        {"transformers": rows}, sort_keys=False, width=1000))
    text = README.read_text()
    head, rest = text.split(TABLE_BEGIN)
    README.write_text(f"{head}{TABLE_BEGIN}\n{readme_table(rows)}\n{TABLE_END}{rest.split(TABLE_END)[1]}")


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _pip(venv: Path, *args: str) -> None:
    """The base venv's pip on venv (the release venvs have none of their own)."""
    pip = [str(_python(BASE)), "-m", "pip", *([] if venv == BASE else ["--python", str(_python(venv))])]
    done = subprocess.run([*pip, *args, "-q", "--disable-pip-version-check"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} on {venv} failed:\n{done.stderr[-3000:]}")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on path (made with its folder if missing): one builder at a time across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _built(venv: Path, stamp: str, build, with_pip: bool = False) -> Path:
    """venv, built by build(venv) unless its stamp already says stamp (a venv half built is built again)."""
    done = venv / ".ddops-built"
    with locked(venv.parent / f".{venv.name}.lock"):
        if not (done.is_file() and done.read_text() == stamp):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(venv)],
                           check=True)
            build(venv)
            done.write_text(stamp)
    return venv


def _site_packages(venv: Path) -> str:
    return subprocess.run([str(_python(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()


def base_venv() -> Path:
    """The venv holding torch alone."""
    return _built(BASE, TORCH, lambda venv: _pip(venv, "install", TORCH), with_pip=True)


def venv_python(version: str) -> Path:
    """The python of the venv with torch and transformers==version (built on first use)."""
    base = base_venv()

    def build(venv: Path) -> None:
        # After the venv's own site-packages: the release's own dependencies win over anything the base holds.
        Path(_site_packages(venv), "ddops-torch.pth").write_text(_site_packages(base) + "\n")
        # No bytecode: a probe imports a small part of transformers.
        _pip(venv, "install", "--no-compile", f"transformers=={version}")

    return _python(_built(MATRIX_DIR / f"transformers-{version}", f"{TORCH} transformers=={version}", build))


if __name__ == "__main__":
    # python tests/hybrid_matrix.py [VERSION...]: build the venvs ahead of a run;
    # python tests/hybrid_matrix.py --write DIR: playbooks/hybrid-support.yaml and the README's table from a run.
    if sys.argv[1:2] == ["--write"]:
        write(Path(sys.argv[2]))
    else:
        for wanted in sys.argv[1:] or releases():
            print(venv_python(wanted), flush=True)
