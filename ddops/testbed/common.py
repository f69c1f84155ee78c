"""What every testbed engine shares: the host and testbed values, their state file, and the client-side files
(client key, known_hosts, inventory) written for them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ddops.errors import TestbedError, UsageError
from ddops.testbed.rootdir import trusted

STATE_FILE = "testbed.json"
ENGINES = ("namespace", "podman", "docker", "auto")
# The inventory's second line: which testbed it describes, for `ddops -i FILE testbed down` (a copy made with
# --inventory-out lives elsewhere).
TESTBED_ROOT_LINE = "# testbed root: "


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def is_our_sshd(pid: int, config: Path) -> bool:
    """Only a live sshd started with this host's config counts: never signal a recycled PID."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # sshd rewrites its process title ("sshd: /usr/sbin/sshd -f CFG [listener] ..."): match the path inside it.
    return str(config).encode() in cmdline and alive(pid)


@dataclass(frozen=True, slots=True)
class TestbedHost:
    __test__ = False

    name: str
    address: str
    port: int
    dir: str
    container: str = ""  # the container's name on a container engine; empty for a namespace host

    @property
    def repo_dir(self) -> Path:
        """This host's view of the repo path, seen from outside its namespace or container."""
        return Path(self.dir) / "repo"

    @property
    def pid_file(self) -> Path:
        return Path(self.dir) / "sshd.pid"

    @property
    def config(self) -> Path:
        return Path(self.dir) / "sshd_config"

    def pid(self) -> int | None:
        """The namespace host's sshd listener (None on a container host: its sshd is the container's)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if is_our_sshd(pid, self.config) else None

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
    engine: str = "namespace"
    shared_home: bool = False  # every host sees one home directory (`home_dir`), each its own repo
    image: str = ""  # container engines: the image every host runs
    network: str = ""  # container engines: the network this testbed created

    @property
    def inventory_path(self) -> Path:
        return Path(self.root) / "inventory.yaml"

    @property
    def known_hosts(self) -> Path:
        return Path(self.root) / "known_hosts"

    @property
    def client_key(self) -> Path:
        return Path(self.root) / "client_key"

    @property
    def home_dir(self) -> Path:
        """With shared_home: the one directory every host has as its home."""
        return Path(self.root) / "home"

    def host(self, name: str) -> TestbedHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def save(self) -> None:
        state = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hosts"}
        state["hosts"] = [asdict(h) for h in self.hosts]
        (Path(self.root) / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")


def load_testbed(root: str | os.PathLike[str]) -> Testbed:
    """The testbed `testbed up` left at root, read only from a folder no other user can change (its files decide
    what root signals and removes) and only when every path it names lies in that folder."""
    if not os.path.lexists(root):
        raise TestbedError(f"no testbed at {root} (start one with: ddops testbed up)")
    root_path = trusted(root)
    path = root_path / STATE_FILE
    try:
        state = json.loads(path.read_text())
        known = {f.name for f in fields(Testbed)} - {"hosts"}
        hosts = tuple(TestbedHost(**h) for h in state["hosts"])
        testbed = Testbed(hosts=hosts, **{k: v for k, v in state.items() if k in known})
    except FileNotFoundError:
        raise TestbedError(f"no testbed at {root} (start one with: ddops testbed up)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TestbedError(f"{path}: unreadable testbed state: {exc}") from None
    strays = [h.dir for h in hosts if Path(h.dir) != Path(testbed.root, "hosts", h.name)
              or h.name in ("", ".", "..") or "/" in h.name]
    if os.path.realpath(testbed.root) != str(root_path) or strays:
        raise TestbedError(f"{path}: names {(strays or [testbed.root])[0]}, which is not this testbed's: not state "
                           "`testbed up` wrote, nothing stopped")
    return testbed


def run_tool(argv: list[str], what: str, env: dict[str, str] | None = None, timeout: float | None = None) -> str:
    """Run a tool; its stdout, or a TestbedError with the last line it printed."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{what} did not finish within {timeout:.0f}s") from None
    except FileNotFoundError:
        raise TestbedError(f"{what}: {argv[0]} not found") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise TestbedError(f"{what} failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def make_key(path: Path, comment: str) -> None:
    if not path.exists():
        run_tool(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                 f"ssh-keygen ({comment})")


def accepting(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def answering_ssh(address: str, port: int) -> bool:
    """An SSH server's banner comes back (a published port may accept before the sshd behind it is there)."""
    try:
        with socket.create_connection((address, port), timeout=1) as sock:
            sock.settimeout(1)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def wait_for_ssh(host: TestbedHost, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answering_ssh(host.address, host.port):
            return
        time.sleep(0.05)
    raise TestbedError(f"{host.name}: no sshd answering on {host.address}:{host.port} within {timeout:.0f}s")


def host_key_path(host: TestbedHost) -> Path:
    return Path(host.dir) / "ssh_host_ed25519_key"


def write_known_hosts(testbed: Testbed) -> None:
    lines = []
    for host in testbed.hosts:
        key = host_key_path(host).with_suffix(".pub").read_text().split()
        lines.append(f"[{host.address}]:{host.port} {key[0]} {key[1]}\n")
    testbed.known_hosts.write_text("".join(lines))


def write_inventory(testbed: Testbed, python: str, patches: list[str]) -> None:
    what = ("local sshd hosts, each in its own mount namespace" if testbed.engine == "namespace"
            else f"{testbed.engine} containers from {testbed.image}")
    lines = [
        f"# Written by `ddops testbed up`: {what}"
        + (", all with one shared home directory." if testbed.shared_home else "."),
        f"{TESTBED_ROOT_LINE}{json.dumps(testbed.root)}",
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


def check_loopback(address_prefix: str, first: int, count: int) -> None:
    """Testbed hosts live on 127.0.0.0/8 only: a published port never opens on another address."""
    parts = address_prefix.split(".")
    if len(parts) != 4 or parts[0] != "127" or parts[3] != "" or not all(p.isdigit() and int(p) < 256
                                                                         for p in parts[1:3]):
        raise UsageError(f"--address-prefix {address_prefix!r}: must look like 127.X.Y. (loopback only)")
    if count < 1:
        raise UsageError("a testbed needs at least one host")
    if first + count - 1 > 254:
        raise UsageError(f"{address_prefix}{first}+{count} runs past .254")


def sshd_config(host_name: str, engine: str, *, listen: str, host_key: str, authorized_keys: str,
                pid_file: str | None = None) -> str:
    """A testbed host's sshd_config: key login as root only, many sessions at once, quiet; the same on every engine."""
    head = f"# ddops testbed host {host_name} ({engine})\n{listen}\nHostKey {host_key}\n"
    if pid_file:
        head += f"PidFile {pid_file}\n"
    return head + f"""AuthorizedKeysFile {authorized_keys}
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
