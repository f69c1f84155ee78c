"""The lint and the type check hold on every run of the suite: ruff over the checkout and mypy over ddops/, each
with the configuration in pyproject.toml (the versions the `test` extra pins)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT


def tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO_ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    proc = tool("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing_in_ddops():
    # The cache lives under .cache/ (ignored): a rerun checks only what changed.
    proc = tool("mypy", "--cache-dir", str(REPO_ROOT / ".cache" / "mypy"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
