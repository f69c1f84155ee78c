"""The reliability suite's fixtures: module-wide sshd testbeds seeded with mini-DDTree, ddops driven in-process (fast)
or through the real CLI, fault injection, and the invariant every fault test ends on: nothing lost."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (MINI_DDTREE, agent_program_with_faults, files_patched_by, git_seed, host_processes,
                            resident_agents, run_ddops, testbeds)

PLAYBOOKS = ("cpu-timing", "hybrid-cache", "crop-relative")
# The files these specs watch; the playbooks also patch model/dflash.py (PATCHED_FILES).
FILES = ("ddtree.py", "dflash.py")
PATCHED_FILES = files_patched_by(PLAYBOOKS)
LOCK_TIMEOUT = 5.0


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="package", autouse=True)
def fault_injection() -> Iterator[None]:
    """In-process ddops ships the agent with fault injection (agent_faults.py; the production bundle has none).
    Package scope: undone once these specs end, so that the tests after them see the production agent."""
    from ddops.transport import agent

    program = agent_program_with_faults()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent, "agent_program", lambda: program)
        yield


@pytest.fixture(scope="session")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mini-DDTree as a one-commit git checkout: what every host starts from."""
    return git_seed(MINI_DDTREE, tmp_path_factory.mktemp("seed") / "mini-ddtree")


@pytest.fixture(scope="session")
def books() -> list[Any]:
    from ddops.patching.playbook import load_playbooks

    return load_playbooks(list(PLAYBOOKS))


@pytest.fixture(scope="session")
def planner() -> Any:
    from ddops.patching.snapshot import make_planner

    return make_planner()


@pytest.fixture(scope="session")
def patched(seed: Path, books: list[Any], planner: Any) -> dict[str, bytes]:
    """Each target file with every built-in patch applied: the only 'new' a file may hold."""
    from ddops.patching.snapshot import all_patches

    plan = planner.plan_host(all_patches(books), {f: (seed / f).read_bytes() for f in PATCHED_FILES})
    assert all(f.changed for f in plan.files)
    return {f.path: f.new for f in plan.files}


@dataclass(frozen=True)
class Seen:
    """What assert_nothing_lost read on one host: the agent's journal answer and status's report."""

    journal: dict[str, Any]
    status: Any

    def to_json(self) -> dict[str, Any]:
        return {}


@dataclass
class Fleet:
    """A running testbed and in-process ddops over it: patch / rollback / status return {host: HostResult}."""

    bed: Any
    seed: Path
    books: list[Any]
    planner: Any
    patched: dict[str, bytes]
    repo_dirs: dict[str, Path]

    @property
    def inventory(self) -> Any:
        from ddops.inventory import load_inventory

        return load_inventory(self.bed.inventory_path)

    def hosts(self, *names: str) -> list[Any]:
        hosts = list(self.inventory.hosts)
        return [h for h in hosts if h.name in names] if names else hosts

    def connector(self) -> Any:
        from ddops.transport import Connector

        return Connector(self.inventory.known_hosts)

    def run(self, task: Callable[[Any, Any], Any], hosts: Sequence[Any] | None = None,
            wrap: Callable[[Any, Any], Any] | None = None) -> dict[str, Any]:
        """task(host, session) on each host, in parallel; `wrap(host, session)` may stand in for the session."""
        from ddops.fleet import run_fleet

        connector = self.connector()

        def connect(host: Any) -> Any:
            session = connector.connect(host)
            return wrap(host, session) if wrap else session

        try:
            results = run_fleet(list(hosts or self.hosts()), task, connect)
        finally:
            connector.close()
        return {r.host: r for r in results}

    def patch(self, *names: str, hosts: Sequence[Any] | None = None, wrap: Any = None,
              **kwargs: Any) -> dict[str, Any]:
        from ddops.tasks.patch import patch_host

        kwargs.setdefault("lock_timeout", LOCK_TIMEOUT)
        return self.run(lambda h, s: patch_host(h, s, self.books, planner=self.planner, **kwargs),
                        hosts or self.hosts(*names), wrap)

    def rollback(self, *names: str, hosts: Sequence[Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        from ddops.tasks.patch import rollback_host

        kwargs.setdefault("lock_timeout", LOCK_TIMEOUT)
        return self.run(lambda h, s: rollback_host(h, s, **kwargs), hosts or self.hosts(*names))

    def status(self, *names: str, hosts: Sequence[Any] | None = None) -> dict[str, Any]:
        from ddops.tasks.patch import status_host

        return self.run(lambda h, s: status_host(h, s, self.books, planner=self.planner), hosts or self.hosts(*names))

    def agent(self, name: str, verb: str, payload: dict[str, Any], host: Any = None) -> dict[str, Any]:
        host = host or self.hosts(name)[0]
        connector = self.connector()
        try:
            with connector.connect(host) as session:
                return session.call_agent(verb, {"repo": host.repo, **payload})
        finally:
            connector.close()

    def repo(self, name: str) -> Path:
        """This host's repo as the test sees it (its own directory, or its tmpfs through /proc/PID/root)."""
        return self.repo_dirs.get(name) or self.bed.host(name).repo_dir

    def reset(self, *names: str) -> None:
        """Every host (or those named) back to a fresh copy of the seed, owned by root, no .ddops state."""
        for name in names or [h.name for h in self.bed.hosts]:
            reset_repo(self.repo(name), self.seed)

    def arm(self, name: str, faults: dict[str, dict[str, str]]) -> None:
        """Fault points for the agent's next commit/rollback on this host (it deletes the file when it reads it)."""
        state = self.repo(name) / ".ddops"
        state.mkdir(mode=0o700, exist_ok=True)
        (state / "faults.json").write_text(json.dumps(faults))

    def cli(self, *args: str, inventory: Path | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """The real CLI in a subprocess, against this testbed's inventory unless told otherwise."""
        return run_ddops(*args, inventory=inventory or self.bed.inventory_path, **kwargs)

    # -- the invariant -------------------------------------------------------------------------------------------

    def file_states(self, name: str, files: Sequence[str] = FILES) -> dict[str, str]:
        """'old' or 'new' per target file; anything else (a torn or mixed file) fails the test."""
        states = {}
        for f in files:
            data = (self.repo(name) / f).read_bytes()
            if data == (self.seed / f).read_bytes():
                states[f] = "old"
            elif data == self.patched[f]:
                states[f] = "new"
            else:
                raise AssertionError(f"{name}:{f} is neither the original nor the patched file ({len(data)} bytes)")
        return states

    def assert_nothing_lost(self, *names: str, hosts: Sequence[Any] | None = None) -> dict[str, dict[str, str]]:
        """On each host: every file fully old or fully new; the journal (as the agent reports it) agrees with the
        files; each patched file's original is backed up intact; `status` tells the truth. Returns file states."""
        from ddops.fleet import TaskOutcome
        from ddops.tasks.patch import status_host

        def look(host: Any, session: Any) -> Any:
            journal = session.call_agent("journal", {"repo": host.repo})
            status = status_host(host, session, self.books, planner=self.planner)
            return TaskOutcome("ok", status.message, Seen(journal, status.report))

        hosts = list(hosts or self.hosts(*names))
        seen = self.run(look, hosts)
        return {h.name: self._check(h.name, seen[h.name]) for h in hosts}

    @property
    def patches_in(self) -> dict[str, set[str]]:
        """file -> ids of the built-in patches that touch it."""
        return {f: {p.id for b in self.books for p in b.patches if f in p.files} for f in PATCHED_FILES}

    def _check(self, name: str, seen: Any) -> dict[str, str]:
        from ddops.patching import journal as jr

        assert seen.status == "ok" and isinstance(seen.report, Seen), f"{name}: {seen.status}: {seen.message}"
        states = self.file_states(name, PATCHED_FILES)
        journal, status = seen.report.journal, seen.report.status
        assert journal["corrupt"] == [], journal["corrupt"]
        entries = journal["entries"]
        actives = jr.active_applications(entries)
        for f, state in states.items():
            mine = {a.patch for a in actives if a.file == f}
            if state == "old":
                assert mine == set(), f"{name}:{f} holds the original but the journal says {sorted(mine)} applied"
            else:
                assert mine == self.patches_in[f], f"{name}:{f} is patched but the journal has {sorted(mine)}"
                assert jr.last_written(entries, f) == sha(self.patched[f])
                original = (self.seed / f).read_bytes()
                backup = self.repo(name) / ".ddops" / "backups" / sha(original)
                assert backup.read_bytes() == original, f"{name}:{f}: the backup of the original is not intact"
        want = {p.id: "applied" if all(states[f] == "new" for f in p.files) else "pending"
                for b in self.books for p in b.patches}
        assert status.patches == want, (name, seen.message, status.patches, states)
        return {f: states[f] for f in FILES}

    def assert_clean(self, name: str) -> None:
        """No temp file or pending note left behind (after a later run has tidied up)."""
        repo = self.repo(name)
        left = [str(p.relative_to(repo)) for p in repo.rglob("*.ddops-tmp")]
        left += [str(p.relative_to(repo)) for p in (repo / ".ddops").glob("pending/*")]
        assert left == [], left

    def assert_original(self, name: str) -> None:
        for f in FILES:
            assert (self.repo(name) / f).read_bytes() == (self.seed / f).read_bytes(), f"{name}:{f} not restored"


def reset_repo(repo: Path, seed: Path) -> None:
    """Empty `repo` (keeping the directory: it is a bind-mount source) and copy the seed into it."""
    os.chown(repo, 0, 0)
    os.chmod(repo, 0o755)
    for child in repo.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for child in seed.iterdir():
        if child.is_dir():
            shutil.copytree(child, repo / child.name, symlinks=True)
        else:
            shutil.copy2(child, repo / child.name)


@pytest.fixture(scope="module")
def make_fleet(tmp_path_factory: pytest.TempPathFactory, seed: Path, books: list[Any], planner: Any,
               patched: dict[str, bytes]) -> Iterator[Callable[..., Fleet]]:
    """Factory for testbeds that live as long as the test module: make_fleet(n, **testbed options) -> Fleet."""
    with testbeds(tmp_path_factory) as start:
        yield lambda count=3, **kwargs: Fleet(start(count, seed=seed, patches=PLAYBOOKS, **kwargs), seed, books,
                                              planner, patched, {})


@pytest.fixture
def clean(fleet: Fleet) -> Fleet:
    """The test module's own `fleet` fixture, every host's repo reset to the seed first."""
    fleet.reset()
    return fleet


def with_inventory(fleet: Fleet, path: Path, extra_hosts: str = "", **replacements: str) -> Path:
    """A copy of the testbed inventory with text replaced and host lines appended."""
    text = fleet.bed.inventory_path.read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text + extra_hosts)
    return path


def session_pids(fleet: Fleet, name: str) -> list[int]:
    """The processes under a host's sshd listener: its SSH sessions and what they run."""
    from ddops.testbed import _descendants

    pid = fleet.bed.host(name).pid()
    assert pid is not None, f"{name}: sshd is not running"
    return _descendants(pid)


def quiet(fleet: Fleet, name: str) -> bool:
    """Nothing runs on the host but its sshd listener and its idle resident agent (an agent whose connection was
    cut may still be finishing)."""
    residents = set(resident_agents(fleet.bed, name))
    return all(pid in residents for pid in host_processes(fleet.bed, name))


def all_output(*procs: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(p.stdout + p.stderr for p in procs)


def host_statuses(results: dict[str, Any]) -> dict[str, str]:
    return {name: r.status for name, r in results.items()}


def messages(results: dict[str, Any]) -> str:
    return "\n".join(f"{name}: {r.status}: {r.message}" for name, r in results.items())


def as_host(host: Any, **changes: Any) -> Any:
    return replace(host, **changes)


def iter_files(root: Path) -> Iterable[Path]:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            yield path
