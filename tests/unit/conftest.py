"""Fixtures shared by the unit tests only (tests/integration/test_sync.py has an `upstream` of its own, over
mini-DDTree, which a root-level one of this name would be shadowed by)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddops.inventory import Host
from ddops.transport.local import LocalSession
from tests.conftest import git


@pytest.fixture
def host(tmp_path: Path) -> Host:
    """A host on this machine whose repo is an empty folder (a module's own `host` fixture may give it another)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    return Host(name="here", address="localhost", repo=str(repo), command_timeout=60)


@pytest.fixture
def session(host: Host) -> Iterator[LocalSession]:
    """The real agent as a local subprocess, on the test's `host`; closed after the test."""
    with LocalSession(host) as s:
        yield s


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
