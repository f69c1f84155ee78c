"""Shared fixtures: real sshd testbed hosts on loopback, and small helpers."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# One plan cache for the whole run (subprocesses inherit it): shared by the tests, never the user's ~/.cache;
# removed when the run ends (pytest_sessionfinish) unless the caller chose it.
RUN_CACHE_DIR = None if "DDOPS_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="ddops-test-cache-")
if RUN_CACHE_DIR:
    os.environ["DDOPS_CACHE_DIR"] = RUN_CACHE_DIR
# No test may depend on this machine's /etc/ssh/ssh_known_hosts: those that want a system file pass their own.
os.environ["DDOPS_SYSTEM_KNOWN_HOSTS"] = os.devnull
MINI_DDTREE = REPO_ROOT / "examples" / "mini-ddtree"
# The trained mini models (both targets and their drafts), shared with scripts/demo and kept across sessions:
# make_models.py rebuilds them only when its recipe (code, corpus, settings) changed.
MINI_MODELS = Path(os.environ.get("DDOPS_MINI_MODELS", REPO_ROOT / ".cache" / "mini-ddtree-models"))


def pytest_sessionfinish(session, exitstatus) -> None:
    if RUN_CACHE_DIR:
        shutil.rmtree(RUN_CACHE_DIR, ignore_errors=True)


def agent_program_with_faults():
    """The host agent with fault injection added (tests/reliability/agent_faults.py, as `ddops_agent.faults`): what
    the specs that kill it at an exact stage ship. The production bundle has none."""
    from ddops.transport import agent

    source = (REPO_ROOT / "tests" / "reliability" / "agent_faults.py").read_text(encoding="utf-8")
    return agent.build_program({"ddops_agent.faults": source})


def files_patched_by(playbooks, seed: Path = MINI_DDTREE) -> tuple[str, ...]:
    """The files of seed that these built-in playbooks patch, in playbook order: the playbooks are their one home."""
    from ddops.patching.playbook import load_playbooks

    return tuple(dict.fromkeys(f for book in load_playbooks(list(playbooks)) for f in book.files
                               if (seed / f).is_file()))


def mini_ddtree_models(out: Path = MINI_MODELS) -> Path:
    """examples/mini-ddtree's trained models under out (qwen3.5-hybrid, qwen3-attn, each with -draft), built once
    (under a lock: scripts/test's pytest invocations may ask at once)."""
    from tests.hybrid_matrix import locked

    with locked(out.parent / f".{out.name}.lock"):
        subprocess.run([sys.executable, "make_models.py", "--out", str(out)], cwd=MINI_DDTREE, check=True,
                       capture_output=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    return out


def as_at_a_terminal() -> None:
    """preexec_fn for a ddops process a test sends Ctrl-C (SIGINT) to: SIGINT's default action, as a shell gives a
    command run in the foreground. A suite started in the background (`scripts/test &`, nohup, some CI runners) has
    SIGINT ignored, every child inherits that, and Python then never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    """Poll until condition() is truthy; fail the test with a clear message after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


def testbed_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the sshd testbed needs root"
    if not any(os.access(p, os.X_OK) for p in ("/usr/sbin/sshd", "/usr/bin/sshd")):
        return "openssh-server is not installed (apt-get install -y openssh-server)"
    return None


requires_sshd = pytest.mark.skipif(testbed_unavailable() is not None, reason=testbed_unavailable() or "")

# The container engine the suite runs its container hosts on (podman: it runs without a daemon, as root, here).
CONTAINER_ENGINE = os.environ.get("DDOPS_TEST_CONTAINER_ENGINE", "podman")
# Marks a test to run once per testbed engine: the same test against namespace hosts and against container hosts.
both_engines = pytest.mark.testbed_engines("namespace", CONTAINER_ENGINE)
_engine_checked: dict[str, str | None] = {}


def container_engine_unavailable(engine: str = CONTAINER_ENGINE) -> str | None:
    """Why the suite cannot start container hosts here (asked once per run: the engine is really run)."""
    if engine not in _engine_checked:
        from ddops.errors import TestbedError
        from ddops.testbed.containers import ContainerEngine

        try:
            ContainerEngine.detect(engine)
            _engine_checked[engine] = None
        except TestbedError as exc:
            _engine_checked[engine] = str(exc)
    return _engine_checked[engine]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("testbed_engines")
    if marker is not None and "testbed_engine" in metafunc.fixturenames:
        params = [pytest.param(e, marks=pytest.mark.containers) if e != "namespace" else e for e in marker.args]
        metafunc.parametrize("testbed_engine", params, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The first container test of a fresh machine builds the image (mmdebstrap: minutes on 2 loaded cores).
    for item in items:
        if "containers" in item.keywords:
            item.add_marker(pytest.mark.timeout(900))
    # CI must never skip the real-sshd tests silently: there, a missing sshd is a failure.
    if os.environ.get("CI") and testbed_unavailable():
        for item in items:
            if "sshd" in item.keywords:
                item.add_marker(pytest.mark.xfail(reason=testbed_unavailable(), strict=True, run=False))


_used_prefixes: set[str] = set()


def _fresh_prefix() -> str:
    """A loopback /24 of our own per testbed, so parallel testbeds (and a running demo) never collide."""
    while True:
        prefix = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}."
        if prefix not in _used_prefixes:
            _used_prefixes.add(prefix)
            return prefix


@contextmanager
def testbeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., object]]:
    """start(n, **testbed.up options) -> a running Testbed on a loopback /24 of its own; all taken down on exit."""
    from ddops import testbed as tb

    made = []

    def start(count: int = 3, **kwargs: object):
        engine = str(kwargs.get("engine", "namespace"))
        reason = testbed_unavailable() if engine == "namespace" else container_engine_unavailable(engine)
        if reason:
            if os.environ.get("CI") and engine != "namespace":
                pytest.fail(f"CI must run the container tests: {reason}")  # never skipped silently there
            pytest.skip(reason)
        root = tmp_path_factory.mktemp("testbed")
        shutil.rmtree(root)
        bed = tb.up(count, root=root, address_prefix=_fresh_prefix(), **kwargs)
        made.append(bed)
        return bed

    try:
        yield start
    finally:
        for bed in made:
            try:
                tb.down(bed.root)
            except Exception:  # noqa: BLE001 - a test may already have taken it down
                pass


@pytest.fixture
def testbed_engine(request: pytest.FixtureRequest) -> str:
    """The engine make_testbed starts hosts with: "namespace", or each of `both_engines` for a test marked so."""
    return getattr(request, "param", "namespace")


@pytest.fixture
def make_testbed(tmp_path_factory: pytest.TempPathFactory, testbed_engine: str) -> Iterator[Callable[..., object]]:
    """Factory: make_testbed(n, seed=None, patches=()) -> a running Testbed, torn down after the test.

    Its hosts run on `testbed_engine`: namespace hosts, or container hosts for the container run of a test marked
    `both_engines`."""
    with testbeds(tmp_path_factory) as start:
        yield lambda count=3, seed=None, patches=(), **kwargs: start(
            count, seed=seed, patches=patches, **{"engine": testbed_engine, **kwargs})


def inventory_with_host2_behind_host1(bed) -> Path:
    """The testbed's inventory, with host2 reached through host1 (proxy_jump)."""
    path = Path(bed.root) / "jump.yaml"
    host2 = bed.hosts[1]
    line = f"host2: {{address: {host2.address}, port: {host2.port}, groups: [testbed]}}"
    text = bed.inventory_path.read_text()
    assert line in text, "the testbed's inventory no longer lists host2 as expected"
    path.write_text(text.replace(line, line[:-1] + ", proxy_jump: host1}"))
    return path


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(cwd: Path, *args: str) -> str:
    """`git ARGS` in cwd, which must succeed (its stderr is the assertion message); its stdout, stripped."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def git_seed(source: Path, dest: Path) -> Path:
    """A copy of `source` as a git repo with one commit (what a host's research checkout looks like)."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "models", "results"))
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "seed"]):
        subprocess.run(argv, cwd=dest, check=True, env={**os.environ, **GIT_ENV})
    return dest


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mini-DDTree as a one-commit git checkout, one per module: what a seeded host's repo is a copy of, and the
    original bytes tests compare a host's files against. (tests/reliability/conftest.py has a session-wide one.)"""
    return git_seed(MINI_DDTREE, tmp_path_factory.mktemp("seed") / "mini-ddtree")


def exited(pid: int) -> bool:
    """Gone, or a zombie: past closing its files and sockets (a dying process loses its environ before that)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def host_processes(bed, name: str) -> dict[int, int]:
    """pid -> parent pid of every process in a testbed host's mount namespace, but its sshd listener."""
    from ddops.testbed import _in_mount_namespace

    listener = bed.host(name).pid()
    assert listener is not None, f"{name}: sshd is not running"
    found = {}
    for pid in _in_mount_namespace(listener):
        if pid != listener:
            try:
                found[pid] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # ended since it was listed
    return found


def resident_agents(bed, name: str) -> list[int]:
    """The host's resident agent servers: agents started to linger, no longer under the session that started them
    (their session processes are their children, so they are not listed)."""
    members = host_processes(bed, name)
    found = []
    for pid, parent in members.items():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if parent not in members and any(word.startswith(b"--linger=") for word in command):
            found.append(pid)
    return found


def run_ddops(*args: str, inventory: Path | str | None = None, input: str | None = None,
              env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    argv = [sys.executable, "-m", "ddops"]
    if inventory is not None:
        argv += ["-i", str(inventory)]
    return subprocess.run(argv + list(args), capture_output=True, text=True, input=input, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, cwd=REPO_ROOT)


def one_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON document a --json command printed; an AssertionError showing both outputs when it is not."""
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"not one JSON document (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def run_ddops_json(*args: str, inventory: Path | str | None = None,
                   env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """The real CLI with --json: its exit code and its one document."""
    proc = run_ddops("--json", *args, inventory=inventory, env=env)
    return proc.returncode, one_json(proc)
