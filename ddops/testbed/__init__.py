"""Local container-like hosts: one real sshd per host on 127.x.y.N, each in its own mount namespace.

Inside a host's namespace the repo path (e.g. /root/ddtree) is a bind mount of that host's own directory, so every
host has the same paths and a separate filesystem. Used by the tests, the demo and CI dry-runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from ddops.errors import TestbedError

STATE_FILE = "testbed.json"
DEFAULT_ROOT = Path(os.environ.get("DDOPS_TESTBED_ROOT", "/tmp/ddops-testbed"))
MINIMAL_BASHRC = "# ddops testbed: a minimal rc file, so that no pyenv init runs before every ssh command\n"
# sshd runs the user's shell, which sources ~/.bashrc over ssh; bind-mounted so only the host namespace sees it.
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd", "/usr/local/sbin/sshd")


@dataclass(frozen=True, slots=True)
class TestbedHost:
    __test__ = False

    name: str
    address: str
    port: int
    dir: str

    @property
    def repo_dir(self) -> Path:
        """This host's view of the repo path, seen from outside its namespace."""
        return Path(self.dir) / "repo"

    @property
    def pid_file(self) -> Path:
        return Path(self.dir) / "sshd.pid"

    @property
    def config(self) -> Path:
        return Path(self.dir) / "sshd_config"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _is_our_sshd(pid, self.config) else None

    def running(self) -> bool:
        return self.pid() is not None


@dataclass(frozen=True, slots=True)
class Testbed:
    """A set of testbed hosts and the client-side files (key, known_hosts, inventory) made for them."""

    __test__ = False

    root: str
    hosts: tuple[TestbedHost, ...]
    repo_path: str
    user_home: str

    @property
    def inventory_path(self) -> Path:
        return Path(self.root) / "inventory.yaml"

    @property
    def known_hosts(self) -> Path:
        return Path(self.root) / "known_hosts"

    @property
    def client_key(self) -> Path:
        return Path(self.root) / "client_key"

    def host(self, name: str) -> TestbedHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def save(self) -> None:
        state = {"root": self.root, "repo_path": self.repo_path, "user_home": self.user_home,
                 "hosts": [asdict(h) for h in self.hosts]}
        (Path(self.root) / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    def stop_host(self, name: str) -> None:
        """Stop one host's sshd and its sessions (by the PID it wrote), as when sshd dies: detached processes live on."""
        _stop(self.host(name), whole_namespace=False)

    def start_host(self, name: str) -> None:
        _start(self.host(name), self.repo_path, self.user_home)


def load_testbed(root: str | os.PathLike[str] = DEFAULT_ROOT) -> Testbed:
    path = Path(root) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise TestbedError(f"no testbed at {root} (start one with: ddops testbed up)") from None
    except ValueError as exc:
        raise TestbedError(f"{path}: unreadable testbed state: {exc}") from None
    hosts = tuple(TestbedHost(**h) for h in state["hosts"])
    return Testbed(root=state["root"], hosts=hosts, repo_path=state["repo_path"], user_home=state["user_home"])


def preflight() -> str:
    """The sshd binary to use; TestbedError when this machine cannot run a testbed."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (it starts sshd in private mount namespaces); run it as root")
    sshd = next((p for p in SSHD_CANDIDATES if os.access(p, os.X_OK)), None) or shutil.which("sshd")
    if sshd is None:
        raise TestbedError("sshd not found: install it with `apt-get install -y openssh-server`")
    for tool in ("unshare", "mount", "ssh-keygen"):
        if shutil.which(tool) is None:
            package = "openssh-client" if tool == "ssh-keygen" else "util-linux"
            raise TestbedError(f"{tool} not found: install it with `apt-get install -y {package}`")
    return sshd


def up(count: int, *, root: str | os.PathLike[str] = DEFAULT_ROOT, seed: str | os.PathLike[str] | None = None,
       repo_path: str = "/root/ddtree", address_prefix: str = "127.0.0.", first: int = 2, port: int = 2222,
       python: str | None = None, patches: Iterable[str] = (), name_prefix: str = "host") -> Testbed:
    """Start `count` hosts and write their inventory; a half-started testbed is torn down again."""
    if count < 1:
        raise TestbedError("a testbed needs at least one host")
    if first + count - 1 > 254:
        raise TestbedError(f"{address_prefix}{first}+{count} runs past .254")
    sshd = preflight()
    root_path = Path(root).resolve()
    if (root_path / STATE_FILE).exists():
        raise TestbedError(f"a testbed is already up at {root_path} (run `ddops testbed down` first)")
    if seed is not None and not Path(seed).is_dir():
        raise TestbedError(f"--seed {seed}: not a directory")
    root_path.mkdir(parents=True, exist_ok=True)
    os.chmod(root_path, 0o700)
    user_home = os.path.expanduser("~root")
    _make_client_key(root_path)
    hosts = tuple(
        TestbedHost(name=f"{name_prefix}{i + 1}", address=f"{address_prefix}{first + i}", port=port,
                    dir=str(root_path / "hosts" / f"{name_prefix}{i + 1}"))
        for i in range(count)
    )
    testbed = Testbed(root=str(root_path), hosts=hosts, repo_path=repo_path, user_home=user_home)
    testbed.save()
    try:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
        Path(repo_path).mkdir(parents=True, exist_ok=True)  # the mount point, in the outer namespace
        for host in hosts:
            _prepare_host(host, root_path, seed, sshd)
        for host in hosts:
            _start(host, repo_path, user_home, sshd)
        _write_known_hosts(testbed)
        _write_inventory(testbed, python or sys.executable, list(patches))
    except BaseException:
        down(root_path)
        raise
    return testbed


def down(root: str | os.PathLike[str] = DEFAULT_ROOT) -> list[str]:
    """Stop exactly the sshd processes this testbed started and remove what it made; the names stopped."""
    root_path = Path(root)
    if not (root_path / STATE_FILE).exists():
        raise TestbedError(f"no testbed at {root_path}")
    testbed = load_testbed(root_path)
    stopped = []
    for host in testbed.hosts:
        if _stop(host):
            stopped.append(host.name)
    shutil.rmtree(root_path, ignore_errors=True)
    return stopped


def status(root: str | os.PathLike[str] = DEFAULT_ROOT) -> list[dict[str, object]]:
    testbed = load_testbed(root)
    return [{"name": h.name, "address": h.address, "port": h.port, "pid": h.pid(),
             "running": h.running(), "accepting": _accepting(h.address, h.port), "dir": h.dir}
            for h in testbed.hosts]


# --- internals ----------------------------------------------------------------------------------------------

def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TestbedError(f"{what} failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")


def _make_client_key(root: Path) -> None:
    key = root / "client_key"
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddops-testbed-client", "-f", str(key)],
             "ssh-keygen (client key)")


def _prepare_host(host: TestbedHost, root: Path, seed: str | os.PathLike[str] | None, sshd: str) -> None:
    hdir = Path(host.dir)
    hdir.mkdir(parents=True, exist_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ddops-testbed-{host.name}",
          "-f", str(hdir / "ssh_host_ed25519_key")], f"ssh-keygen ({host.name})")
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
    config = f"""# ddops testbed host {host.name}
ListenAddress {host.address}:{host.port}
HostKey {hdir / 'ssh_host_ed25519_key'}
PidFile {host.pid_file}
AuthorizedKeysFile {root / 'client_key.pub'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
MaxStartups 200:30:400
MaxSessions 64
LogLevel ERROR
Subsystem sftp internal-sftp
"""
    host.config.write_text(config)
    check = subprocess.run([sshd, "-t", "-f", str(host.config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise TestbedError(f"{host.name}: sshd rejects its config: {check.stderr.strip()}")


def _start(host: TestbedHost, repo_path: str, user_home: str, sshd: str | None = None) -> None:
    sshd = sshd or preflight()
    bashrc_target = Path(user_home) / ".bashrc"
    # Paths go in as positional arguments, never spliced into the script text.
    # The agent's own files (its compiled-code cache, its resident's socket) live in ~/.cache/ddops: each host
    # gets its own, as separate machines would have, so that one host's resident never answers for another.
    agent_cache_target = Path(user_home) / ".cache" / "ddops"
    agent_cache_target.mkdir(parents=True, exist_ok=True)  # the mount point, in the outer namespace
    host_agent_cache = Path(host.dir) / "agent-cache"
    host_agent_cache.mkdir(mode=0o700, exist_ok=True)
    script = 'mount --bind "$1" "$2" || exit 1; ' \
             'if [ -e "$4" ]; then mount --bind "$3" "$4" || exit 1; fi; ' \
             'mount --bind "$8" /etc/hosts || exit 1; ' \
             'mount --bind "$9" "${10}" || exit 1; ' \
             'hostname "$7" 2>/dev/null; exec "$5" -f "$6"'
    # A private UTS namespace too, so that each host reports its own hostname; its own /etc/hosts resolves that
    # name, as a real host's does (torchrun's rendezvous, for one, connects back to it).
    argv = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script, "ddops-testbed",
            str(host.repo_dir), repo_path, str(Path(host.dir) / "bashrc"), str(bashrc_target), sshd, str(host.config),
            host.name, str(Path(host.dir) / "etc-hosts"), str(host_agent_cache), str(agent_cache_target)]
    try:
        host.pid_file.unlink()
    except FileNotFoundError:
        pass
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TestbedError(f"{host.name}: sshd did not start: {proc.stderr.strip() or proc.returncode}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if host.running() and _accepting(host.address, host.port):
            return
        time.sleep(0.02)
    raise TestbedError(f"{host.name}: sshd did not start listening on {host.address}:{host.port} within 10s")


def _stop(host: TestbedHost, whole_namespace: bool = True) -> bool:
    pid = host.pid()
    if pid is None:
        return False
    # Sessions forked by this sshd ("sshd: root@notty" and what they run) outlive the listener, and so do detached
    # processes (bench runs) that left its process tree: taking the host down ends everything in its namespace.
    sessions = set(_descendants(pid)) | (set(_in_mount_namespace(pid)) if whole_namespace else set())
    sessions.discard(pid)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    for child in sessions:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.02)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    # SIGKILL is delivered asynchronously: return only once every process we ended is really gone.
    while time.monotonic() < deadline and any(_alive(p) for p in sessions):
        time.sleep(0.02)
    try:
        host.pid_file.unlink()
    except FileNotFoundError:
        pass
    return True


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _is_our_sshd(pid: int, config: Path) -> bool:
    """Only a live sshd started with this host's config counts: never signal a recycled PID."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # sshd rewrites its process title ("sshd: /usr/sbin/sshd -f CFG [listener] ..."): match the path inside it.
    return str(config).encode() in cmdline and _alive(pid)


def _accepting(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _write_known_hosts(testbed: Testbed) -> None:
    lines = []
    for host in testbed.hosts:
        key = (Path(host.dir) / "ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"[{host.address}]:{host.port} {key[0]} {key[1]}\n")
    testbed.known_hosts.write_text("".join(lines))


def _write_inventory(testbed: Testbed, python: str, patches: list[str]) -> None:
    lines = [
        "# Written by `ddops testbed up`: local sshd hosts, each in its own mount namespace.",
        "defaults:",
        "  user: root",
        f"  repo: {json.dumps(testbed.repo_path)}",
        f"  identity_file: {json.dumps(str(testbed.client_key))}",
        f"  python: {json.dumps(python)}",
        "  connect_timeout: 5",
        f"known_hosts: {json.dumps(str(testbed.known_hosts))}",
        "ssh_config: /dev/null  # the testbed must not pick up the user's ~/.ssh/config",
        f"patches: {json.dumps(patches)}",
        "hosts:",
    ]
    for host in testbed.hosts:
        lines.append(f"  {host.name}: {{address: {host.address}, port: {host.port}, groups: [testbed]}}")
    testbed.inventory_path.write_text("\n".join(lines) + "\n")
