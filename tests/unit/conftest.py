"""Fixtures shared by the unit tests only (tests/integration/test_sync.py has an `upstream` of its own, over
mini-DDTree, which a root-level one of this name would be shadowed by)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import git


@pytest.fixture
def upstream(tmp_path: Path) -> dict:
    """A work repo with two commits on main, an annotated tag v1 on the first, and a bare origin of it."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "ddtree.py").write_text("past_key_values_target = DynamicCache()\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "one")
    first = git(work, "rev-parse", "HEAD")
    git(work, "tag", "-a", "v1", "-m", "release one")
    (work / "README").write_text("two\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "two")
    second = git(work, "rev-parse", "HEAD")
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(origin))
    return {"work": work, "origin": origin, "url": f"file://{origin}", "first": first, "second": second}
