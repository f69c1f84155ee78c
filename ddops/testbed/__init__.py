"""Local hosts for tests, demos and CI dry-runs: real sshd servers on 127.x.y.N, each with its own filesystem view.

Two engines: `namespace` (the default: one sshd per host in its own mount namespace; fast, needs root) and the
container engines `podman` / `docker` (a real container per host from an image with sshd and python3, its port
published on loopback). Either way every host has the same paths (the repo path, e.g. /root/ddtree) over a
directory of its own, and `shared_home` gives them all one home directory."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from ddops import settings
from ddops.errors import TestbedError, UsageError
from ddops.testbed import namespace as _namespace
from ddops.testbed import rootdir
from ddops.testbed.common import (ENGINES, STATE_FILE, TESTBED_ROOT_LINE, Testbed, TestbedHost, check_loopback,
                                  load_testbed, make_key, write_inventory, write_known_hosts)
from ddops.testbed.containers import ContainerEngine
from ddops.testbed.namespace import SSHD_CANDIDATES, NamespaceEngine, _descendants, _in_mount_namespace

__all__ = ["ENGINES", "Testbed", "TestbedHost", "default_root", "down", "load_testbed", "preflight", "start_host",
           "status", "stop_host", "up"]
_ = (_descendants, _in_mount_namespace, STATE_FILE)  # re-exported for the tests


def preflight() -> str:
    """The sshd binary the namespace engine would use; TestbedError when this machine cannot run it."""
    return _namespace.preflight(SSHD_CANDIDATES)


def engine_for(testbed: Testbed):
    """The engine that runs this testbed's hosts."""
    return NamespaceEngine() if testbed.engine == "namespace" else ContainerEngine.named(testbed.engine)


def stop_host(testbed: Testbed, name: str) -> None:
    """Stop one host's sshd and its sessions, as when sshd dies (a container host stops as a whole)."""
    engine_for(testbed).stop_host(testbed, testbed.host(name))


def start_host(testbed: Testbed, name: str) -> None:
    engine_for(testbed).start_host(testbed, testbed.host(name))


def default_root() -> Path:
    """$DDOPS_TESTBED_ROOT, else the testbed the last `testbed up` without a root made."""
    explicit = settings.TESTBED_ROOT.value()
    remembered = Path(explicit) if explicit else rootdir.remembered_default()
    if remembered is None:
        raise TestbedError("no testbed (start one with: ddops testbed up)")
    return remembered


def up(count: int, *, root: str | os.PathLike[str] | None = None, seed: str | os.PathLike[str] | None = None,
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
    seed = resolve_seed(seed)
    if not repo_path.startswith("/"):
        raise UsageError(f"--repo-path {repo_path}: must be an absolute path")
    root_path = _claim_root(root)
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
        host_python = python or (host_interpreter(testbed) if testbed.engine == "namespace" else "python3")
        runner.start(testbed, seed)
        write_known_hosts(testbed)
        check_interpreter(testbed, host_python)
        write_inventory(testbed, host_python, list(patches))
    except BaseException:
        down(root_path)
        raise
    return testbed


def _claim_root(root: str | os.PathLike[str] | None) -> Path:
    """The folder a new testbed lives in: the one asked for, made private or refused (rootdir); without one, a
    fresh private folder."""
    if root is None and settings.TESTBED_ROOT.value() is None:
        remembered = rootdir.remembered_default()
        if remembered is not None and (remembered / STATE_FILE).exists():
            raise TestbedError(f"a testbed is already up at {remembered} (run `ddops testbed down` first)")
        return rootdir.fresh_default()
    root_path = rootdir.claim(default_root() if root is None else root)
    if (root_path / STATE_FILE).exists():
        raise TestbedError(f"a testbed is already up at {root_path} (run `ddops testbed down` first)")
    return root_path


def resolve_seed(seed: str | os.PathLike[str] | None) -> Path | None:
    """A directory, or the name of an example shipped with ddops (`mini-ddtree`), as the directory to copy."""
    if seed is None:
        return None
    path = Path(seed).expanduser()
    if path.is_dir():
        return path
    from ddops.resources import example_names, examples_dir

    names = example_names()
    if str(seed) in names:
        return examples_dir() / str(seed)
    raise UsageError(f"--seed {seed}: not a directory, nor an example shipped with ddops ({', '.join(names)})")


def host_interpreter(testbed: Testbed, executable: str | None = None) -> str:
    """A Python the namespace hosts can run: the controller's own, unless the shared home hides it (pyenv under
    /root), then the first python3 on PATH outside the home."""
    executable = executable or sys.executable
    if not testbed.shared_home or not _hidden_by_home(executable, testbed.user_home):
        return executable
    for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/bin", "/usr/bin"]:
        candidate = os.path.join(folder or ".", "python3")
        if os.access(candidate, os.X_OK) and not _hidden_by_home(candidate, testbed.user_home):
            return candidate
    raise TestbedError(f"the shared home {testbed.user_home} hides this Python ({executable}) and no python3 outside "
                       f"it is on PATH: install one (apt-get install -y python3) or pass python=")


def _hidden_by_home(executable: str, home: str) -> bool:
    """Whether the file, or what its symlinks lead to (a venv's python, a pyenv shim), lies under home."""
    home_path = Path(home).resolve()
    for path in (Path(os.path.abspath(executable)), Path(executable).resolve()):
        if path == home_path or home_path in path.parents:
            return True
    return False


def check_interpreter(testbed: Testbed, python: str) -> None:
    """Run the hosts' `python` on the first host, as ddops will: a testbed whose agent cannot start is refused now,
    with the reason, rather than on every command."""
    import subprocess

    host = testbed.hosts[0]
    probe = f"{shlex.quote(python)} -c 'import sys; print(sys.version_info >= (3, 8))'"
    argv = ["ssh", "-F", "/dev/null", "-i", str(testbed.client_key), "-o", f"UserKnownHostsFile={testbed.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", str(host.port),
            f"root@{host.address}", probe]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"{host.name}: could not run its python ({python}): {exc}") from None
    if done.returncode != 0 or done.stdout.strip() != "True":
        why = (done.stderr.strip().splitlines() or [done.stdout.strip() or f"exit {done.returncode}"])[-1]
        raise TestbedError(f"{host.name}: the hosts' python {python} does not run there (a Python >= 3.8 is "
                           f"needed): {why}")


def root_of_inventory(inventory: str | os.PathLike[str]) -> Path:
    """The testbed an inventory written by `testbed up` describes (next to it, or named in its header)."""
    path = Path(inventory)
    if (path.parent / STATE_FILE).exists() and (path.parent / "inventory.yaml").resolve() == path.resolve():
        return path.parent
    try:
        head = path.read_text(encoding="utf-8", errors="replace").splitlines()[:5]
    except OSError as exc:
        raise UsageError(f"{inventory}: cannot read it ({exc.strerror})") from None
    for line in head:
        if line.startswith(TESTBED_ROOT_LINE):
            return Path(json.loads(line[len(TESTBED_ROOT_LINE):].strip()))
    raise UsageError(f"{inventory}: not an inventory written by `ddops testbed up` (no `{TESTBED_ROOT_LINE.strip()}` "
                     f"line): say which testbed with --root")


def down(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Stop exactly the hosts this testbed started and remove what it (and its engine) made; the names stopped.
    Its state is read only from a root no other user can change (load_testbed)."""
    testbed = load_testbed(default_root() if root is None else root)
    stopped = engine_for(testbed).stop(testbed)
    shutil.rmtree(testbed.root, ignore_errors=True)
    rootdir.forget_default(Path(testbed.root))
    return stopped


def status(root: str | os.PathLike[str] | None = None) -> list[dict[str, object]]:
    testbed = load_testbed(default_root() if root is None else root)
    return engine_for(testbed).status(testbed)
