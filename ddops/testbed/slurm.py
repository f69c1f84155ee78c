"""A real single-node Slurm for tests and the demo: munged + slurmctld + slurmd on 127.0.0.1 with two fake GPUs.

Everything lives in one private directory (config, state, logs, PID files, munge key and socket); nothing is written
to /etc, and the two daemon ports are picked free at start. Needs root and the Debian packages slurmctld, slurmd,
slurm-client and munge (`install_hint`). Measured facts behind the configuration: ../shared/facts/slurm.md.

    python -m ddops.testbed.slurm up --root DIR      # prints the SLURM_CONF path
    python -m ddops.testbed.slurm down --root DIR"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddops.errors import TestbedError
from ddops.testbed import rootdir
from ddops.testbed.common import alive

DAEMONS = ("slurmctld", "slurmd")
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
STATE_FILE = "slurm.json"
NODE = "localhost"
PARTITION = "debug"


@dataclass(frozen=True, slots=True)
class SlurmCluster:
    """A running private Slurm: its directory and the slurm.conf every client command needs (SLURM_CONF)."""

    root: str

    @property
    def conf(self) -> str:
        return str(Path(self.root) / "slurm.conf")

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.conf}

    def pid(self, daemon: str) -> int | None:
        try:
            pid = int((Path(self.root) / f"{daemon}.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _is_ours(pid, daemon, self.root) else None


def missing_tools() -> list[str]:
    """The Slurm/munge programs this machine lacks."""
    tools = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sacct")
    return [t for t in tools if shutil.which(t) is None and not os.access(f"/usr/sbin/{t}", os.X_OK)]


def install_hint() -> str:
    return "apt-get install -y --no-install-recommends " + " ".join(PACKAGES)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int, cpus: int) -> str:
    """The cluster's slurm.conf: one node (`localhost`) with two fake GPUs, one partition, no accounting database."""
    return f"""# ddops testbed Slurm (private: every path below is under {root})
ClusterName=ddops
SlurmctldHost={NODE}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
MpiDefault=none
MailProg=/bin/true
KillWait=5
MinJobAge=300
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# The node may say it has more CPUs than the machine: tests run a GPU job array and a CPU-only job side by side.
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
SchedulerParameters=sched_interval=1
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:fake:2 State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


GRES_CONF = "AutoDetect=off\nName=gpu Type=fake File=/dev/null\nName=gpu Type=fake File=/dev/zero\n"


def up(root: str | os.PathLike[str], *, cpus: int = 4, timeout: float = 30.0) -> SlurmCluster:
    """Start munged, slurmctld and slurmd in `root`; returns once the node accepts jobs. Stopped again on failure."""
    if os.geteuid() != 0:
        raise TestbedError("the Slurm testbed needs root (munged runs as its own user, slurmd as root)")
    missing = missing_tools()
    if missing:
        raise TestbedError(f"{', '.join(missing)} not found: install them with `{install_hint()}`")
    # Its files name what root runs and, at `down`, signals: a folder of root's that no one else may write.
    root_path = rootdir.claim(root, closed=rootdir.NOT_WRITABLE, what="Slurm testbed root")
    if (root_path / STATE_FILE).exists():
        raise TestbedError(f"a Slurm testbed is already up at {root_path} (stop it first)")
    for sub in ("state", "spool"):
        (root_path / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root_path, 0o755)  # munged (its own user) must reach its directory below
    cluster = SlurmCluster(str(root_path))
    (root_path / STATE_FILE).write_text(json.dumps({"root": str(root_path)}) + "\n")
    try:
        _start_munged(root_path)
        conf = slurm_conf(root_path, _free_port(), _free_port(), cpus)
        (root_path / "slurm.conf").write_text(conf)
        (root_path / "gres.conf").write_text(GRES_CONF)
        env = {**os.environ, **cluster.env}
        for argv in ([_tool("slurmctld")], [_tool("slurmd"), "-N", NODE]):
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise TestbedError(f"{argv[0]} did not start: {(proc.stderr or proc.stdout).strip()[-400:]}")
        _wait_idle(cluster, timeout)
    except BaseException:
        down(root_path)
        raise
    return cluster


def _start_munged(root: Path) -> None:
    munge_dir = root / "munge"
    munge_dir.mkdir(exist_ok=True)
    os.chmod(munge_dir, 0o755)  # munged insists that everyone may reach its socket (it checks the peer itself)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    entry = pwd.getpwnam("munge")
    for path in (munge_dir, key):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    argv = ["runuser", "-u", "munge", "--", _tool("munged"), f"--socket={munge_dir}/munge.socket",
            f"--key-file={key}", f"--pid-file={munge_dir}/munged.pid", f"--seed-file={munge_dir}/munged.seed",
            f"--log-file={munge_dir}/munged.log"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise TestbedError(f"munged did not start: {(proc.stderr or proc.stdout).strip()[-400:]}")


def _wait_idle(cluster: SlurmCluster, timeout: float) -> None:
    env = {**os.environ, **cluster.env}
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc = subprocess.run([_tool("sinfo"), "-h", "-n", NODE, "-o", "%t"], env=env, capture_output=True,
                              text=True, timeout=10)
        last = (proc.stdout + proc.stderr).strip()
        if proc.returncode == 0 and last in ("idle", "mix", "alloc"):
            return
        time.sleep(0.2)
    raise TestbedError(f"the Slurm node did not become idle within {timeout:.0f}s (sinfo: {last!r}); "
                       f"logs in {cluster.root}")


def down(root: str | os.PathLike[str]) -> list[str]:
    """Stop exactly the daemons started in `root` (by their PID files) and remove the directory; the names stopped."""
    root_path = rootdir.trusted(root, closed=rootdir.NOT_WRITABLE, what="Slurm testbed root")
    if not (root_path / STATE_FILE).exists():
        raise TestbedError(f"no Slurm testbed at {root_path}")
    cluster = SlurmCluster(str(root_path))
    stopped = []
    # slurmd first: its job steps (slurmstepd and the tasks) end with it; then the controller, then munge.
    for daemon in DAEMONS[::-1]:
        pid = cluster.pid(daemon)
        if pid is not None and _stop(pid):
            stopped.append(daemon)
    for pid in _stepds(root_path):
        _stop(pid)
    munged = _munged_pid(root_path)
    if munged is not None and _stop(munged):
        stopped.append("munged")
    shutil.rmtree(root_path, ignore_errors=True)
    return stopped


def _munged_pid(root: Path) -> int | None:
    try:
        pid = int((root / "munge" / "munged.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_ours(pid, "munged", str(root)) else None


def _stepds(root: Path) -> list[int]:
    """slurmstepd processes of this cluster (their environment names our slurm.conf), left after slurmd ended."""
    found = []
    wanted = f"SLURM_CONF={root}/slurm.conf".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"slurmstepd" in (entry / "cmdline").read_bytes() and wanted in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _is_ours(pid: int, daemon: str, root: str) -> bool:
    """A live `daemon` whose command line or environment names our directory: never signal a recycled PID."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return daemon.encode() in cmdline and (root.encode() in cmdline or root.encode() in environ)


def _stop(pid: int, grace: float = 10.0) -> bool:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        while alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("up", "down") or argv[1] != "--root":
        print("usage: python -m ddops.testbed.slurm up|down --root DIR", file=sys.stderr)
        return 2
    try:
        if argv[0] == "up":
            print(up(argv[2]).conf)
        else:
            print("stopped: " + ", ".join(down(argv[2])))
    except TestbedError as exc:
        print(f"ddops: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
