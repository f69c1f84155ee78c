"""The namespace engine: one real sshd per host on 127.x.y.N, each in its own mount and UTS namespace.

Inside a host's namespace the repo path (e.g. /root/ddtree) is a bind mount of that host's own directory, so every
host has the same paths and a separate filesystem. Each host also gets its own ~/.cache/ddops, as separate machines
would have; with shared_home every host instead sees one common directory as the user's home (its own repo still),
as containers with a common home volume do. Fast (no image), needs root."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from ddops.errors import TestbedError
from ddops.testbed.common import Testbed, TestbedHost, accepting, alive, host_key_path, make_key, sshd_config

MINIMAL_BASHRC = "# ddops testbed: a minimal rc file, so that no pyenv init runs before every ssh command\n"
# sshd runs the user's shell, which sources ~/.bashrc over ssh; bind-mounted so only the host namespace sees it.
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd", "/usr/local/sbin/sshd")


def preflight(candidates: tuple[str, ...] = SSHD_CANDIDATES) -> str:
    """The sshd binary to use; TestbedError when this machine cannot run a namespace testbed."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (it starts sshd in private mount namespaces); run it as root")
    sshd = next((p for p in candidates if os.access(p, os.X_OK)), None) or shutil.which("sshd")
    if sshd is None:
        raise TestbedError("sshd not found: install it with `apt-get install -y openssh-server`")
    for tool in ("unshare", "mount", "ssh-keygen"):
        if shutil.which(tool) is None:
            package = "openssh-client" if tool == "ssh-keygen" else "util-linux"
            raise TestbedError(f"{tool} not found: install it with `apt-get install -y {package}`")
    return sshd


class NamespaceEngine:
    name = "namespace"

    def __init__(self, sshd: str | None = None) -> None:
        self.sshd = sshd

    def start(self, testbed: Testbed, seed: str | os.PathLike[str] | None) -> None:
        sshd = self.sshd or preflight()
        root = Path(testbed.root)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
        if testbed.shared_home:
            testbed.home_dir.mkdir(mode=0o700, exist_ok=True)
            (testbed.home_dir / ".bashrc").write_text(MINIMAL_BASHRC)
            _mount_point(testbed, testbed.repo_path).mkdir(parents=True, exist_ok=True)
        else:
            Path(testbed.repo_path).mkdir(parents=True, exist_ok=True)  # the mount point, in the outer namespace
        for host in testbed.hosts:
            _prepare_host(host, root, seed, sshd)
        for host in testbed.hosts:
            _start(host, testbed, sshd)

    def stop(self, testbed: Testbed) -> list[str]:
        return [host.name for host in testbed.hosts if _stop(host)]

    def status(self, testbed: Testbed) -> list[dict[str, object]]:
        return [{"name": h.name, "address": h.address, "port": h.port, "pid": h.pid(), "running": h.running(),
                 "accepting": accepting(h.address, h.port), "dir": h.dir} for h in testbed.hosts]

    def stop_host(self, testbed: Testbed, host: TestbedHost) -> None:
        """Stop the host's sshd and its sessions (by the PID it wrote), as when sshd dies: detached ones live on."""
        _stop(host, whole_namespace=False)

    def start_host(self, testbed: Testbed, host: TestbedHost) -> None:
        _start(host, testbed, self.sshd or preflight())


def _mount_point(testbed: Testbed, path: str) -> Path:
    """Where a mount point under the user's home must exist: in the shared home when there is one."""
    home = Path(testbed.user_home)
    target = Path(path)
    if testbed.shared_home and (target == home or home in target.parents):
        return testbed.home_dir / target.relative_to(home)
    return target


def _prepare_host(host: TestbedHost, root: Path, seed: str | os.PathLike[str] | None, sshd: str) -> None:
    hdir = Path(host.dir)
    hdir.mkdir(parents=True, exist_ok=True)
    make_key(host_key_path(host), f"ddops-testbed-{host.name}")
    if seed is not None:
        shutil.copytree(seed, host.repo_dir, symlinks=True)
    else:
        host.repo_dir.mkdir()
    (hdir / "bashrc").write_text(MINIMAL_BASHRC)
    try:
        system_hosts = Path("/etc/hosts").read_text()
    except OSError:
        system_hosts = "127.0.0.1 localhost\n"
    (hdir / "etc-hosts").write_text(system_hosts.rstrip("\n") + f"\n127.0.1.1 {host.name}\n")
    config = sshd_config(host.name, "namespace", listen=f"ListenAddress {host.address}:{host.port}",
                         host_key=str(hdir / "ssh_host_ed25519_key"), authorized_keys=str(root / "client_key.pub"),
                         pid_file=str(host.pid_file))
    host.config.write_text(config)
    check = subprocess.run([sshd, "-t", "-f", str(host.config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise TestbedError(f"{host.name}: sshd rejects its config: {check.stderr.strip()}")


def _start(host: TestbedHost, testbed: Testbed, sshd: str) -> None:
    home = Path(testbed.user_home)
    mounts: list[tuple[Path, Path]] = []
    if testbed.shared_home:
        # One directory is every host's home, rc files, ~/.cache/ddops and all: the fleets where a host's agent
        # files are seen by its neighbours. The repo is mounted on top of it, so each host still has its own.
        mounts.append((testbed.home_dir, home))
        mounts.append((host.repo_dir, Path(testbed.repo_path)))
    else:
        mounts.append((host.repo_dir, Path(testbed.repo_path)))
        if (home / ".bashrc").exists():
            mounts.append((Path(host.dir) / "bashrc", home / ".bashrc"))
        # The agent's own files (its compiled-code cache, its resident's socket) live in ~/.cache/ddops: each host
        # gets its own, as separate machines would have, so that one host's resident never answers for another.
        agent_cache_target = home / ".cache" / "ddops"
        agent_cache_target.mkdir(parents=True, exist_ok=True)  # the mount point, in the outer namespace
        host_agent_cache = Path(host.dir) / "agent-cache"
        host_agent_cache.mkdir(mode=0o700, exist_ok=True)
        mounts.append((host_agent_cache, agent_cache_target))
    mounts.append((Path(host.dir) / "etc-hosts", Path("/etc/hosts")))
    # Paths go in as positional arguments, never spliced into the script text.
    script = 'name=$1 sshd=$2 config=$3; shift 3; ' \
             'while [ $# -gt 0 ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; ' \
             'hostname "$name" 2>/dev/null; exec "$sshd" -f "$config"'
    # A private UTS namespace too, so that each host reports its own hostname; its own /etc/hosts resolves that
    # name, as a real host's does (torchrun's rendezvous, for one, connects back to it).
    argv = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script, "ddops-testbed",
            host.name, sshd, str(host.config)] + [str(p) for pair in mounts for p in pair]
    host.pid_file.unlink(missing_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TestbedError(f"{host.name}: sshd did not start: {proc.stderr.strip() or proc.returncode}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if host.running() and accepting(host.address, host.port):
            return
        time.sleep(0.02)
    raise TestbedError(f"{host.name}: sshd did not start listening on {host.address}:{host.port} within 10s")


def _stop(host: TestbedHost, whole_namespace: bool = True) -> bool:
    pid = host.pid()
    # What an earlier stop of the sshd alone left running ends with the host, whether or not it was started again.
    left = _left_behind(host) if whole_namespace else set()
    if pid is None:
        _kill_and_wait(left)
        return False
    # Sessions forked by this sshd ("sshd: root@notty" and what they run) outlive the listener, and so do detached
    # processes (bench runs, residents) that left its process tree: taking the host down ends everything in its
    # namespace. Stopping the sshd alone leaves those, as on a real host: they are remembered for the host's end.
    namespace = set(_in_mount_namespace(pid))
    sessions = set(_descendants(pid))
    if not whole_namespace:
        _remember_left_behind(host, namespace - sessions - {pid})
    sessions = (sessions | (namespace if whole_namespace else set()) | left) - {pid}
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        _kill_and_wait(left)
        return False
    for child in sessions:
        with suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.02)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    # SIGKILL is delivered asynchronously: return only once every process we ended is really gone.
    while time.monotonic() < deadline and any(alive(p) for p in sessions):
        time.sleep(0.02)
    host.pid_file.unlink(missing_ok=True)
    return True


def _kill_and_wait(pids: set[int]) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)


def _start_time(pid: int) -> str | None:
    """The process's start time (in clock ticks since boot): with the PID, what tells it from a recycled PID."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _left_file(host: TestbedHost) -> Path:
    return Path(host.dir) / "left-behind.json"


def _remember_left_behind(host: TestbedHost, pids: set[int]) -> None:
    known = json.loads(_left_file(host).read_text()) if _left_file(host).is_file() else []
    known += [[pid, started] for pid in sorted(pids) if (started := _start_time(pid)) is not None]
    _left_file(host).write_text(json.dumps(known))


def _left_behind(host: TestbedHost) -> set[int]:
    """The processes an earlier stop of the host's sshd left running that still live, with everything in their
    namespaces (a namespace one of them still holds cannot have been recycled); forgotten once read."""
    path = _left_file(host)
    if not path.is_file():
        return set()
    found: set[int] = set()
    for pid, started in json.loads(path.read_text()):
        if _start_time(pid) == started:
            found |= {pid, *_in_mount_namespace(pid), *_descendants(pid)}
    path.unlink()
    return found


def _in_mount_namespace(pid: int) -> list[int]:
    """Every process sharing pid's mount namespace (a testbed host's namespace is its own, never ours)."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/mnt")
        if namespace == os.readlink("/proc/self/ns/mnt"):
            return []
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "mnt") == namespace:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _descendants(pid: int) -> list[int]:
    """Every live process below pid, found through /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
