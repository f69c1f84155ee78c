"""Local hosts for tests, demos and CI dry-runs: real sshd servers on 127.x.y.N, each with its own filesystem view.

Two engines: `namespace` (the default: one sshd per host in its own mount namespace; fast, needs root) and the
container engines `podman` / `docker` (a real container per host from an image with sshd and python3, its port
published on loopback). Either way every host has the same paths (the repo path, e.g. /root/ddtree) over a
directory of its own, and `shared_home` gives them all one home directory.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterable

from ddops.errors import TestbedError, UsageError
from ddops.testbed.common import (
    DEFAULT_ROOT, ENGINES, STATE_FILE, Testbed, TestbedHost, check_loopback, load_testbed, make_key, write_inventory,
    write_known_hosts,
)
from ddops.testbed.containers import ContainerEngine
from ddops.testbed.namespace import SSHD_CANDIDATES, NamespaceEngine, _descendants, _in_mount_namespace
from ddops.testbed import namespace as _namespace

__all__ = ["DEFAULT_ROOT", "ENGINES", "Testbed", "TestbedHost", "down", "load_testbed", "preflight", "start_host", "status",
           "stop_host", "up"]
_ = (_descendants, _in_mount_namespace, STATE_FILE)  # re-exported for the tests


def preflight() -> str:
    """The sshd binary the namespace engine would use; TestbedError when this machine cannot run it."""
    return _namespace.preflight(SSHD_CANDIDATES)


def engine_for(testbed: Testbed):
    """The engine that runs this testbed's hosts."""
    if testbed.engine == "namespace":
        return NamespaceEngine()
    return ContainerEngine.named(testbed.engine)


def stop_host(testbed: Testbed, name: str) -> None:
    """Stop one host's sshd and its sessions, as when sshd dies (a container host stops as a whole)."""
    engine_for(testbed).stop_host(testbed, testbed.host(name))


def start_host(testbed: Testbed, name: str) -> None:
    engine_for(testbed).start_host(testbed, testbed.host(name))


def up(count: int, *, root: str | os.PathLike[str] = DEFAULT_ROOT, seed: str | os.PathLike[str] | None = None,
       repo_path: str = "/root/ddtree", address_prefix: str = "127.0.0.", first: int = 2, port: int = 2222,
       python: str | None = None, patches: Iterable[str] = (), name_prefix: str = "host",
       engine: str = "namespace", shared_home: bool = False, image: str | None = None) -> Testbed:
    """Start `count` hosts and write their inventory; a half-started testbed is torn down again."""
    check_loopback(address_prefix, first, count)
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine}: not one of {', '.join(ENGINES)}")
    if image is not None and engine == "namespace":
        raise UsageError("--image needs a container engine (--engine podman|docker|auto)")
    runner: NamespaceEngine | ContainerEngine
    if engine == "namespace":
        runner = NamespaceEngine(preflight())
    else:
        runner = ContainerEngine.detect(engine)  # auto: the first engine that really runs here
    root_path = Path(root).resolve()
    if (root_path / STATE_FILE).exists():
        raise TestbedError(f"a testbed is already up at {root_path} (run `ddops testbed down` first)")
    if seed is not None and not Path(seed).is_dir():
        raise UsageError(f"--seed {seed}: not a directory")
    if not repo_path.startswith("/"):
        raise UsageError(f"--repo-path {repo_path}: must be an absolute path")
    root_path.mkdir(parents=True, exist_ok=True)
    os.chmod(root_path, 0o700)
    make_key(root_path / "client_key", "ddops-testbed-client")
    names = [f"{name_prefix}{i + 1}" for i in range(count)]
    hosts = tuple(
        TestbedHost(name=name, address=f"{address_prefix}{first + i}", port=port, dir=str(root_path / "hosts" / name),
                    container=runner.container_name(root_path, name) if isinstance(runner, ContainerEngine) else "")
        for i, name in enumerate(names)
    )
    testbed = Testbed(root=str(root_path), hosts=hosts, repo_path=repo_path,
                      user_home="/root" if engine != "namespace" else os.path.expanduser("~root"),
                      engine=runner.name, shared_home=shared_home)
    if isinstance(runner, ContainerEngine):
        testbed = runner.plan(testbed, image)
    testbed.save()
    try:
        runner.start(testbed, seed)
        write_known_hosts(testbed)
        host_python = python or (sys.executable if testbed.engine == "namespace" else "python3")
        write_inventory(testbed, host_python, list(patches))
    except BaseException:
        down(root_path)
        raise
    return testbed


def down(root: str | os.PathLike[str] = DEFAULT_ROOT) -> list[str]:
    """Stop exactly the hosts this testbed started and remove what it (and its engine) made; the names stopped."""
    root_path = Path(root)
    if not (root_path / STATE_FILE).exists():
        raise TestbedError(f"no testbed at {root_path}")
    testbed = load_testbed(root_path)
    stopped = engine_for(testbed).stop(testbed)
    shutil.rmtree(root_path, ignore_errors=True)
    return stopped


def status(root: str | os.PathLike[str] = DEFAULT_ROOT) -> list[dict[str, object]]:
    testbed = load_testbed(root)
    return engine_for(testbed).status(testbed)
