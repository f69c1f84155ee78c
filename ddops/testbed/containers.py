"""The container engines: each testbed host is a real podman or docker container with sshd and python3.

A host's sshd port is published on its own loopback address (127.x.y.N:PORT, never another address); its host key
is made here, per container, and written to the testbed's known_hosts; its repo path is a bind mount of the host's
own directory under the testbed root (so the suite and the user can read every host's files from outside), and its
home is the container's own unless shared_home mounts one directory as the home of all.

The default image is built from the Containerfile shipped next to this module. Where no Debian base image is at hand
(no registry reachable), the base is made from the Debian package archive with mmdebstrap. Both are cached in the
engine's storage under a tag derived from the Containerfile, so a second `testbed up` starts in seconds.

Podman runs with a private configuration and storage (see `containers_dir`), so ddops never changes the machine's
own podman setup; what netavark adds to the machine (NETAVARK_* firewall chains, ip_forward) is removed again when
the last ddops container is gone, unless it was there before ddops started one."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from ddops import settings
from ddops.errors import TestbedError
from ddops.testbed.common import (Testbed, TestbedHost, answering_ssh, host_key_path, make_key, run_tool, sshd_config,
                                  wait_for_ssh)

CONTAINERFILE = Path(__file__).with_name("Containerfile")
DEBIAN_IMAGE = "docker.io/library/debian:bookworm-slim"
ROOTFS_IMAGE = "localhost/ddops-debian-base:bookworm"  # made with mmdebstrap where no base image can be pulled
IMAGE_NAME = "localhost/ddops-testbed"
LABEL = "ddops.testbed"
# What the default image must hold: sshd, python3 for the agent, git for `ddops sync`.
ROOTFS_PACKAGES = "openssh-server,python3,git"
# sshd from the image, with our config (common.sshd_config): works for the user's own images too, whatever their
# sshd_config says.
SSHD_COMMAND = 'mkdir -p /run/sshd && exec "$(command -v sshd || echo /usr/sbin/sshd)" -D -e -f /etc/ddops/sshd_config'
START_TIMEOUT_S = 30.0


def containers_dir() -> Path:
    """Podman's private configuration and storage, and the image cache: kept across runs, unlike a testbed.

    $DDOPS_CONTAINERS_DIR, else $XDG_CACHE_HOME/ddops/containers, else ~/.cache/ddops/containers."""
    explicit = settings.CONTAINERS_DIR.value()
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "ddops" / "containers"


def image_tag() -> str:
    """The default image's name: a new Containerfile is a new image, an unchanged one is found in the cache."""
    digest = hashlib.sha256(CONTAINERFILE.read_bytes() + ROOTFS_PACKAGES.encode()).hexdigest()[:12]
    return f"{IMAGE_NAME}:{digest}"


class ContainerEngine:
    """podman or docker, driven through its CLI (both take the same arguments for what the testbed needs)."""

    def __init__(self, name: str) -> None:
        if name not in ("podman", "docker"):
            raise TestbedError(f"unknown container engine {name!r}")
        self.name = name

    # --- finding an engine ------------------------------------------------------------------------------------

    @classmethod
    def named(cls, name: str) -> ContainerEngine:
        return cls(name)

    @classmethod
    def detect(cls, wanted: str) -> ContainerEngine:
        """The engine asked for, if it really runs here; with "auto", the first of podman and docker that does."""
        names = ("podman", "docker") if wanted == "auto" else (wanted,)
        reasons = []
        for name in names:
            engine = cls(name)
            reason = engine.unusable()
            if reason is None:
                return engine
            reasons.append(f"{name}: {reason}")
        hint = "install one with `apt-get install -y podman runc` (or start a Docker daemon)"
        raise TestbedError(f"no working container engine ({'; '.join(reasons)}); {hint}")

    def unusable(self) -> str | None:
        """Why this engine cannot run containers here, or None. A docker client without a daemon is not enough."""
        if shutil.which(self.name) is None:
            return "not installed"
        try:
            proc = subprocess.run(self.argv("info", "--format", "{{json .}}"), capture_output=True, text=True,
                                  env=self.env(), timeout=60)
        except subprocess.TimeoutExpired:
            return "`info` did not answer within 60s"
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            return lines[-1] if lines else f"`{self.name} info` exited {proc.returncode}"
        return None

    # --- the engine's command line ----------------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        return [self.name, *args]

    def env(self) -> dict[str, str]:
        """Podman reads our private containers.conf and storage.conf (written on first use); docker its own."""
        env = dict(os.environ)
        if self.name == "podman":
            conf, storage = _podman_config()
            env["CONTAINERS_CONF"] = str(conf)
            env["CONTAINERS_STORAGE_CONF"] = str(storage)
        return env

    def run(self, *args: str, what: str, timeout: float | None = 120) -> str:
        return run_tool(self.argv(*args), f"{self.name} {what}", env=self.env(), timeout=timeout)

    def try_run(self, *args: str, timeout: float | None = 60) -> subprocess.CompletedProcess[str] | None:
        """Run, and never raise: for removals, where what is gone already is fine."""
        try:
            return subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env(), timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return None

    def image_exists(self, name: str) -> bool:
        proc = self.try_run("image", "inspect", "--format", "{{.Id}}", name)
        return proc is not None and proc.returncode == 0

    # --- a testbed's life -------------------------------------------------------------------------------------

    def container_name(self, root: Path, host: str) -> str:
        return f"ddops-{_testbed_id(root)}-{host}"

    def plan(self, testbed: Testbed, image: str | None) -> Testbed:
        return replace(testbed, image=image or image_tag(), network=f"ddops-{_testbed_id(Path(testbed.root))}")

    def start(self, testbed: Testbed, seed: str | os.PathLike[str] | None) -> None:
        self._remember_machine_state()  # before a build too: its RUN step goes through netavark as well
        if testbed.image == image_tag():
            self.ensure_default_image()
        elif not self.image_exists(testbed.image) and not self._pulled(testbed.image):
            raise TestbedError(f"--image {testbed.image}: no such image in {self.name}'s storage "
                               f"(build or load it first; it needs sshd and python3)")
        root = Path(testbed.root)
        if testbed.shared_home:
            testbed.home_dir.mkdir(mode=0o700, exist_ok=True)
            home = Path(testbed.user_home)
            repo = Path(testbed.repo_path)
            if home in repo.parents:  # the repo's mount point, inside the shared home
                (testbed.home_dir / repo.relative_to(home)).mkdir(parents=True, exist_ok=True)
        for host in testbed.hosts:
            hdir = Path(host.dir)
            hdir.mkdir(parents=True, exist_ok=True)
            make_key(host_key_path(host), f"ddops-testbed-{host.name}")
            (hdir / "sshd_config").write_text(sshd_config(
                host.name, "container", listen="Port 22", host_key="/etc/ddops/ssh_host_ed25519_key",
                authorized_keys="/etc/ddops/authorized_keys"))
            if seed is not None:
                shutil.copytree(seed, host.repo_dir, symlinks=True)
            else:
                host.repo_dir.mkdir()
        self.run("network", "create", "--label", f"{LABEL}={root}", testbed.network, what="network create")
        self._guard_loopback(testbed)
        for host in testbed.hosts:
            mounts = [(host_key_path(host), "/etc/ddops/ssh_host_ed25519_key", "ro"),
                      (Path(host.dir) / "sshd_config", "/etc/ddops/sshd_config", "ro"),
                      (root / "client_key.pub", "/etc/ddops/authorized_keys", "ro")]
            if testbed.shared_home:
                mounts.append((testbed.home_dir, testbed.user_home, "rw"))
            mounts.append((host.repo_dir, testbed.repo_path, "rw"))
            args = ["run", "-d", "--name", host.container, "--hostname", host.name, "--label", f"{LABEL}={root}",
                    "--network", testbed.network, "--init", "-p", f"{host.address}:{host.port}:22",
                    # No raw sockets: with them a container's root hand-crafts packets to the machine's loopback
                    # services through the bridge (netavark turns route_localnet on there). The firewall rule of
                    # _guard_loopback holds where a user's image or engine gives the capability back.
                    "--cap-drop", "NET_RAW"]
            for source, target, mode in mounts:
                if ":" in f"{source}{target}":  # -v splits at colons
                    raise TestbedError(f"{host.name}: a container engine cannot mount a path with ':' ({source})")
                args += ["-v", f"{source}:{target}:{mode}"]
            self.run(*args, testbed.image, "sh", "-c", SSHD_COMMAND, what=f"run ({host.name})")
        for host in testbed.hosts:
            self._wait(host)

    def stop(self, testbed: Testbed) -> list[str]:
        if os.geteuid() != 0:
            self._give_files_back(testbed)
        names = [h.container for h in testbed.hosts]
        present = [n for n in names if self._state(n)[0] != "missing"]
        if present:
            grace = ["-t", "0"] if self.name == "podman" else []  # sshd holds nothing worth a grace period
            self.try_run("rm", "-f", *grace, *present)
        self._unguard_loopback(testbed)
        if testbed.network:
            self.try_run("network", "rm", testbed.network)
        self._restore_machine_state()
        return [h.name for h in testbed.hosts if h.container in present]

    def status(self, testbed: Testbed) -> list[dict[str, object]]:
        rows = []
        for h in testbed.hosts:
            state, pid = self._state(h.container)
            rows.append({"name": h.name, "address": h.address, "port": h.port, "pid": pid,
                         "running": state == "running", "accepting": answering_ssh(h.address, h.port),
                         "dir": h.dir, "container": h.container, "state": state})
        return rows

    def stop_host(self, testbed: Testbed, host: TestbedHost) -> None:
        """Stop the host's container: unlike a namespace host, everything in it ends with its sshd."""
        self.run("stop", "-t", "1", host.container, what=f"stop ({host.name})")

    def start_host(self, testbed: Testbed, host: TestbedHost) -> None:
        self.run("start", host.container, what=f"start ({host.name})")
        self._wait(host)

    # --- the default image ------------------------------------------------------------------------------------

    def ensure_default_image(self) -> str:
        """Build the default image unless it is cached; one build at a time per cache directory."""
        tag = image_tag()
        if self.image_exists(tag):
            return tag
        with _locked(containers_dir() / "build.lock"):
            if self.image_exists(tag):  # built by whoever held the lock
                return tag
            base = self._base_image()
            with tempfile.TemporaryDirectory(prefix="ddops-image-") as context:
                shutil.copyfile(CONTAINERFILE, Path(context) / "Containerfile")
                pull = ["--pull=never"] if self.name == "podman" else []
                self.run("build", *pull, "--build-arg", f"BASE={base}", "-t", tag, "-f",
                         str(Path(context) / "Containerfile"), context, what="build (the testbed image)", timeout=900)
            self._forget_older_images(tag)
        return tag

    def _forget_older_images(self, tag: str) -> None:
        """Images of earlier Containerfiles take disk for nothing (one in use by a running testbed stays)."""
        proc = self.try_run("images", "--format", "{{.Repository}}:{{.Tag}}")
        for name in (proc.stdout.split() if proc is not None and proc.returncode == 0 else []):
            if name.startswith(f"{IMAGE_NAME}:") and name != tag:
                self.try_run("image", "rm", name)

    def _pulled(self, image: str) -> bool:
        """Docker pulls what it lacks where a registry answers (a CI runner); podman here has none to ask."""
        if self.name != "docker":
            return False
        proc = self.try_run("pull", image, timeout=600)
        return proc is not None and proc.returncode == 0

    def _base_image(self) -> str:
        for name in (DEBIAN_IMAGE, ROOTFS_IMAGE):
            if self.image_exists(name):
                return name
        if self._pulled(DEBIAN_IMAGE):
            return DEBIAN_IMAGE
        self._build_rootfs_image()
        return ROOTFS_IMAGE

    def _build_rootfs_image(self) -> None:
        """A Debian base image from the package archive (this machine's apt sources): no registry needed."""
        if shutil.which("mmdebstrap") is None:
            raise TestbedError("no Debian base image and no registry: install mmdebstrap "
                               "(`apt-get install -y mmdebstrap`) so ddops can build one from the package archive")
        work = containers_dir()
        work.mkdir(parents=True, exist_ok=True)
        tar = work / "rootfs.tar"
        try:
            run_tool(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={ROOTFS_PACKAGES}", "bookworm",
                      str(tar)], "mmdebstrap (the testbed's Debian base image)", timeout=900)
            self.run("import", str(tar), ROOTFS_IMAGE, what="import (the Debian base image)", timeout=300)
        finally:
            tar.unlink(missing_ok=True)

    # --- internals --------------------------------------------------------------------------------------------

    def _wait(self, host: TestbedHost) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if answering_ssh(host.address, host.port):
                return
            state, _ = self._state(host.container)
            if state not in ("running", "created", "configured", "initialized"):
                logs = self.try_run("logs", "--tail", "5", host.container)
                tail = " | ".join(((logs.stdout + logs.stderr) if logs else "").strip().splitlines()[-3:])
                raise TestbedError(f"{host.name}: container {host.container} is {state}: {tail or 'no log'}")
            time.sleep(0.05)
        wait_for_ssh(host, 0.1)

    def _state(self, container: str) -> tuple[str, int | None]:
        proc = self.try_run("inspect", "--format", "{{.State.Status}} {{.State.Pid}}", container)
        if proc is None or proc.returncode != 0:
            return "missing", None
        status, _, pid = proc.stdout.strip().partition(" ")
        return status, (int(pid) if pid.isdigit() and int(pid) > 0 else None)

    def _give_files_back(self, testbed: Testbed) -> None:
        """Files the container's root wrote in our directories become ours again, so that they can be removed."""
        owner = f"{os.geteuid()}:{os.getegid()}"
        for host in testbed.hosts:
            if self._state(host.container)[0] == "running":
                paths = [testbed.repo_path] + ([testbed.user_home] if testbed.shared_home else [])
                self.try_run("exec", host.container, "chown", "-R", owner, *paths)

    def bridge(self, testbed: Testbed) -> str | None:
        """The machine-side interface of the testbed's network (podman1, br-0123456789ab), or None."""
        if not testbed.network:
            return None
        field = "{{.NetworkInterface}}" if self.name == "podman" else "{{.Id}}"
        proc = self.try_run("network", "inspect", "--format", field, testbed.network)
        if proc is None or proc.returncode != 0 or not proc.stdout.strip():
            return None
        name = proc.stdout.strip()
        return name if self.name == "podman" else f"br-{name[:12]}"

    def _guard_loopback(self, testbed: Testbed) -> None:
        """Drop what comes in from the testbed's bridge addressed to 127.0.0.0/8: the machine's loopback-only
        services (a namespace testbed's sshd, a database) stay out of the containers' reach. Removed by stop."""
        if os.geteuid() != 0 or shutil.which("iptables") is None:
            return  # rootless: the engine changes no firewall, and route_localnet stays off
        bridge = self.bridge(testbed)
        if bridge is None:
            raise TestbedError(f"{self.name} network {testbed.network}: no bridge interface to guard")
        run_tool(["iptables", "-I", "INPUT", *_loopback_rule(bridge, testbed)],
                 f"iptables (drop {bridge} -> 127.0.0.0/8)")

    def _unguard_loopback(self, testbed: Testbed) -> None:
        if os.geteuid() != 0 or shutil.which("iptables") is None:
            return
        bridge = self.bridge(testbed)
        for _ in range(8):  # each -D removes one copy (a crashed `up` retried could have left two)
            if bridge is None or subprocess.run(["iptables", "-D", "INPUT", *_loopback_rule(bridge, testbed)],
                                                capture_output=True).returncode != 0:
                break

    def _ours_left(self) -> bool:
        proc = self.try_run("ps", "-a", "-q", "--filter", f"label={LABEL}")
        return proc is None or proc.returncode != 0 or bool(proc.stdout.strip())

    def _remember_machine_state(self) -> None:
        """Before the first container: what netavark will change on this machine, so that down can undo it."""
        if self.name != "podman" or os.geteuid() != 0:
            return  # rootless podman changes no firewall; docker's chains are the daemon's, not ours
        record = containers_dir() / "machine-state.json"
        if record.exists():
            return  # an earlier testbed's record (maybe one that crashed): it holds the state before any of ours
        record.parent.mkdir(parents=True, exist_ok=True)
        state = {"netavark_chains": bool(_netavark_rules()), "ip_forward": _read_ip_forward()}
        record.write_text(json.dumps(state) + "\n")

    def _restore_machine_state(self) -> None:
        record = containers_dir() / "machine-state.json"
        if self.name != "podman" or not record.exists() or self._ours_left():
            return
        try:
            before = json.loads(record.read_text())
        except ValueError:
            before = {}
        if not _netavark_idle():
            return  # containers of another podman storage (or a crashed testbed of ours) still use them: keep all
        if before.get("netavark_chains") is False:
            _remove_netavark_chains()
        forward = before.get("ip_forward")
        if forward in ("0", "1") and _read_ip_forward() != forward:
            Path("/proc/sys/net/ipv4/ip_forward").write_text(forward + "\n")
        record.unlink(missing_ok=True)


def _loopback_rule(bridge: str, testbed: Testbed) -> list[str]:
    """The INPUT rule that keeps the bridge's packets off 127.0.0.0/8, named for its testbed (so down removes ours).

    Only what opens a connection is dropped: the answers of a container's sshd to the machine's own connections to
    its published port come back from the bridge addressed to a loopback address too (conntrack has them as
    ESTABLISHED)."""
    return ["-i", bridge, "-d", "127.0.0.0/8", "-m", "conntrack", "!", "--ctstate", "ESTABLISHED,RELATED",
            "-m", "comment", "--comment", f"ddops-testbed-{_testbed_id(Path(testbed.root))}", "-j", "DROP"]


def _testbed_id(root: Path) -> str:
    return hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:10]


def _podman_config() -> tuple[Path, Path]:
    """Write (once) podman's private containers.conf and storage.conf, with the two settings this kind of machine
    needs: file-descriptor limits a container may set without CAP_SYS_RESOURCE, and runc (crun 1.8 refuses
    cgroups in hybrid mode)."""
    base = containers_dir()
    conf, storage = base / "containers.conf", base / "storage.conf"
    # Run-time state belongs on a tmpfs, so a reboot forgets containers that no longer exist.
    tag = hashlib.sha256(str(base.resolve()).encode()).hexdigest()[:10]
    run_base = Path("/run") if os.geteuid() == 0 else Path(os.environ.get("XDG_RUNTIME_DIR") or base / "run")
    run = run_base / f"ddops-podman-{tag}"
    want_conf = f"""# ddops' private podman configuration (CONTAINERS_CONF), written by ddops testbed.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{run / 'libpod'}"

[network]
network_config_dir = "{base / 'networks'}"
"""
    want_storage = f"""# ddops' private podman storage (CONTAINERS_STORAGE_CONF): the testbed image cache lives here.
[storage]
driver = "overlay"
graphroot = "{base / 'storage'}"
runroot = "{run / 'storage'}"
"""
    for path, text in ((conf, want_conf), (storage, want_storage)):
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return conf, storage


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_ip_forward() -> str | None:
    try:
        return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    except OSError:
        return None


def _netavark_rules() -> dict[str, list[str]]:
    """Per iptables tool and table: the `iptables-save` lines that make or use a NETAVARK chain."""
    found: dict[str, list[str]] = {}
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save") is None:
            continue
        try:
            dump = subprocess.run([f"{tool}-save"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        table = ""
        for line in dump.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif "NETAVARK" in line and (line.startswith(":") or line.startswith("-A")):
                found.setdefault(f"{tool} {table}", []).append(line)
    return found


# The chains netavark keeps once its last container is gone; per-network and per-port chains, and rules in these
# two, exist only while some container (of any podman storage on this machine) is using them.
NETAVARK_BASE_CHAINS = {"NETAVARK_FORWARD", "NETAVARK-HOSTPORT-DNAT", "NETAVARK-HOSTPORT-MASQ",
                        "NETAVARK-HOSTPORT-SETMARK"}


def _netavark_idle() -> bool:
    for lines in _netavark_rules().values():
        for line in lines:
            if line.startswith(":") and line[1:].split()[0] not in NETAVARK_BASE_CHAINS:
                return False
            if line.startswith("-A") and line.split()[1] in ("NETAVARK_FORWARD", "NETAVARK-HOSTPORT-DNAT"):
                return False
    return True


def _remove_netavark_chains() -> None:
    """Undo what netavark left: the jumps into its chains, then the chains themselves."""
    for key, lines in _netavark_rules().items():
        tool, table = key.split()
        chains = [line[1:].split()[0] for line in lines if line.startswith(":")]
        for line in lines:
            if line.startswith("-A"):
                words = shlex.split(line)
                if words[1] not in chains:  # a jump from a built-in chain into ours
                    subprocess.run([tool, "-t", table, "-D", *words[1:]], capture_output=True)
        for chain in chains:
            subprocess.run([tool, "-t", table, "-F", chain], capture_output=True)
        for chain in chains:
            subprocess.run([tool, "-t", table, "-X", chain], capture_output=True)
