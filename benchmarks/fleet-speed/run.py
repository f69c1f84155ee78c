#!/usr/bin/env python3
"""Fleet speed: how fast ddops reaches a fleet, against Ansible, pyinfra, Fabric and raw OpenSSH on local sshd testbed hosts.

    python benchmarks/fleet-speed/run.py [--sizes 1,8,32,64] [--repeats 5] [--only ddops,fabric,...]

Brings up testbed hosts (one sshd per host, own mount namespace, host keys checked), seeds every host with
examples/mini-ddtree's ddtree.py and dflash.py, then times whole processes side by side, interleaved per repeat:
ddops patch (first apply, plan cache cold and warm), its idempotent rerun, --check and rollback; the same edit done
by a Fabric one-liner, raw OpenSSH, pyinfra and ansible-playbook (when installed, see setup-anchors.sh); and
`ssh host true` as the floor. Files are reset between runs. Writes RESULTS.md (and RESULTS.json, the raw samples).
Also: `ddops --help` startup and its imports, `ddops ping`'s shell rc overhead, and the transform cache at 1000
files on 8 hosts (playbook scaling-1000.yaml).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ddops import testbed  # noqa: E402

SEED_FILES = ("ddtree.py", "dflash.py", "model/dflash.py")  # the files playbooks/hybrid-cache.yaml patches
OLD = "past_key_values_target = DynamicCache()"
NEW = 'past_key_values_target = DynamicCache(config=target.config if hasattr(target, "config") else None)'
PLAYBOOK = "hybrid-cache"
SCALING_PLAYBOOK = HERE / "scaling-1000.yaml"
SCALING_FILES = 1000
SCALING_HOSTS = 8
KEX = "curve25519-sha256"
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOTES_BEGIN, NOTES_END = "<!-- notes: kept when RESULTS.md is rewritten -->", "<!-- end of notes -->"
FLEET_BEGIN, FLEET_END = "<!-- fleet: written by fleet_mode.py report -->", "<!-- end of fleet -->"


# --- measuring one process ------------------------------------------------------------------------------------

@dataclass
class Sample:
    """One timed whole-process run."""

    wall: float
    cpu: float            # user + system seconds of the process and every child it reaped (the controller side)
    host_cpu: float       # user + system seconds spent under the testbed's sshd listeners (the hosts' side)
    maxrss_mb: float      # peak RSS of the largest process in the controller's tree
    ok: bool
    round_trips: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _proc_table() -> dict[int, tuple[int, int, bool]]:
    """pid -> (ppid, clock ticks: utime + stime + cutime + cstime, ended: a zombie not yet reaped)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        table[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]), fields[0] == b"Z")
    return table


def _mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _is_resident_agent(pid: int, parent_inside: bool) -> bool:
    """ddops' resident agent server: started to linger, and no longer under the session that started it."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return not parent_inside and any(word.startswith(b"--linger=") for word in command)


class HostMeter:
    """CPU spent on the hosts' side: every process in a testbed host's mount namespace (its sshd listener, the
    sessions, ddops' resident agent and the sessions it forks), live, ended or reaped by one of them."""

    def __init__(self, listeners: list[int]) -> None:
        self.listeners = set(listeners)
        self.namespaces = {ns for ns in map(_mount_namespace, listeners) if ns}

    def read(self) -> tuple[float, set[int]]:
        """(CPU seconds so far, the pids still at work: neither a listener, an idle resident, nor ended)."""
        table = _proc_table()
        members = {pid for pid in table if _mount_namespace(pid) in self.namespaces}
        ticks = sum(table[pid][1] for pid in members)
        working = {pid for pid in members - self.listeners
                   if not table[pid][2] and not _is_resident_agent(pid, table[pid][0] in members)}
        return ticks / CLK_TCK, working

    def settle(self, baseline: set[int], timeout: float = 3.0) -> float:
        """Wait until the processes a run started have ended (their CPU is then counted), then read."""
        deadline = time.monotonic() + timeout
        while True:
            cpu, working = self.read()
            if working <= baseline or time.monotonic() > deadline:
                return cpu
            time.sleep(0.02)


def timed(argv: list[str], *, env: dict[str, str], meter: HostMeter, log_dir: Path, tag: str,
          cwd: Path | None = None) -> tuple[Sample, str]:
    """Run argv to completion; whole-process wall time, rusage of its tree, host-side CPU. Returns stdout too."""
    out_path, err_path = log_dir / f"{tag}.out", log_dir / f"{tag}.err"
    host_before, baseline = meter.read()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    host_after = meter.settle(baseline)
    sample = Sample(wall=wall, cpu=usage.ru_utime + usage.ru_stime, host_cpu=max(0.0, host_after - host_before),
                    maxrss_mb=usage.ru_maxrss / 1024, ok=proc.returncode == 0)
    out = out_path.read_text(errors="replace")
    if not sample.ok:
        tail = err_path.read_text(errors="replace").strip().splitlines()[-3:]
        try:  # ddops --json: the first failing host says why
            tail += [next(h["message"] for h in json.loads(out)["hosts"] if h["status"] not in ("ok", "changed"))]
        except (ValueError, KeyError, StopIteration, TypeError):
            pass
        sample.extra["error"] = f"exit {proc.returncode}: " + " | ".join(tail)
    return sample, out


# --- the hosts ------------------------------------------------------------------------------------------------

@dataclass
class Bed:
    """The testbed, plus what every tool needs to reach its first n hosts."""

    tb: Any
    work: Path
    host_python: str
    originals: dict[str, bytes]

    @property
    def hosts(self) -> tuple[Any, ...]:
        return self.tb.hosts

    def listeners(self) -> list[int]:
        return [pid for pid in (h.pid() for h in self.hosts) if pid is not None]

    def reset(self, n: int) -> None:
        """Every host back to the two original files and nothing else: no backups, no .ddops state."""
        for host in self.hosts[:n]:
            repo = host.repo_dir
            for entry in repo.iterdir():
                if entry.name in self.originals or entry.name == "sim":
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)  # model/ too: written again below, without a one-liner's .bak
                else:
                    entry.unlink()
            for name, data in self.originals.items():
                (repo / name).parent.mkdir(exist_ok=True)
                (repo / name).write_bytes(data)

    def patched(self, n: int) -> bool:
        return all((h.repo_dir / name).read_text().count(NEW) == 1 and OLD not in (h.repo_dir / name).read_text()
                   for h in self.hosts[:n] for name in SEED_FILES)

    def pristine(self, n: int) -> bool:
        return all((h.repo_dir / name).read_bytes() == self.originals[name]
                   for h in self.hosts[:n] for name in SEED_FILES)

    # inventories and specs, one per size
    def ddops_inventory(self, n: int, *, resident: bool = True) -> Path:
        """ddops' inventory for the first n hosts; resident=False: `agent_linger: 0` (an agent started per run)."""
        path = self.work / f"inventory-{n}{'' if resident else '-no-resident'}.yaml"
        if not path.exists():
            lines = ["defaults:", "  user: root", f"  repo: {json.dumps(self.tb.repo_path)}",
                     f"  identity_file: {json.dumps(str(self.tb.client_key))}",
                     f"  python: {json.dumps(self.host_python)}", "  connect_timeout: 20", "  command_timeout: 600",
                     f"  agent_linger: {300 if resident else 0}",
                     f"known_hosts: {json.dumps(str(self.tb.known_hosts))}", "ssh_config: /dev/null",
                     f"patches: [{PLAYBOOK}]", "hosts:"]
            lines += [f"  {h.name}: {{address: {h.address}, port: {h.port}}}" for h in self.hosts[:n]]
            path.write_text("\n".join(lines) + "\n")
        return path

    def ssh_argv(self, host: Any) -> list[str]:
        return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.tb.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", f"KexAlgorithms={KEX}", "-o", "IdentitiesOnly=yes", "-o", "ControlMaster=no",
                "-i", str(self.tb.client_key), "-p", str(host.port), "-l", "root", host.address]

    def parallel_ssh_script(self, n: int, command: str, name: str) -> Path:
        """A bash script: one `ssh host COMMAND &` per host, then wait for each; exit 1 if any failed."""
        path = self.work / f"{name}-{n}.sh"
        if not path.exists():
            lines = ["#!/bin/bash", "pids=()"]
            for host in self.hosts[:n]:
                lines.append(" ".join(shlex.quote(w) for w in self.ssh_argv(host) + [command]) + " &")
                lines.append("pids+=($!)")
            lines += ["rc=0", 'for p in "${pids[@]}"; do wait "$p" || rc=1; done', "exit $rc"]
            path.write_text("\n".join(lines) + "\n")
        return path

    def spec(self, n: int) -> Path:
        path = self.work / f"spec-{n}.json"
        if not path.exists():
            repo = self.tb.repo_path
            spec = {"user": "root", "key": str(self.tb.client_key), "known_hosts": str(self.tb.known_hosts),
                    "repo": repo, "files": list(SEED_FILES), "command": one_liner(repo),
                    "sed_old": OLD, "sed_new": NEW, "grep_command": grep_command(repo),
                    "hosts": [{"address": h.address, "port": h.port} for h in self.hosts[:n]]}
            path.write_text(json.dumps(spec, indent=1))
        return path


def write_seed(seed: Path) -> dict[str, bytes]:
    """The seed folder every host's repo starts as: SEED_FILES from examples/mini-ddtree; their bytes by name."""
    originals = {}
    for name in SEED_FILES:
        originals[name] = (REPO / "examples" / "mini-ddtree" / name).read_bytes()
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_bytes(originals[name])
    return originals


def one_liner(repo: str) -> str:
    """What a hand-written fan-out does: copy aside, sed, grep. (Run twice, it overwrites its own backup.)"""
    q = shlex.quote
    sed = f"s|{OLD}|{NEW}|"  # BRE: the parentheses are literal
    grep = " && ".join(f"grep -qF {q(NEW)} {q(f)}" for f in SEED_FILES)
    copies = " && ".join(f"cp -p {q(f)} {q(f + '.bak')}" for f in SEED_FILES)
    return f"cd {q(repo)} && {copies} && sed -i {q(sed)} {' '.join(map(q, SEED_FILES))} && {grep}"


def grep_command(repo: str) -> str:
    return " && ".join(f"grep -qF {shlex.quote(NEW)} {shlex.quote(repo + '/' + f)}" for f in SEED_FILES)


# --- the tools ------------------------------------------------------------------------------------------------

# The first-apply rows that the targets are checked on, and the ratio table's cells, in this order.
MAIN_ROWS = ("ddops-cold", "ddops", "ddops-fresh")

@dataclass
class Tool:
    """One row of the table: how to prepare the hosts, what to run, how to check it worked."""

    key: str
    label: str
    group: str                                  # ddops | anchor | floor
    argv: Callable[[int], list[str]]
    env: Callable[[int], dict[str, str]]
    needs: str = "pristine"                     # pristine | applied (by ddops) | any
    leaves: str = "dirty"                       # pristine | applied | dirty | same
    verify: Callable[[int, Sample, str], bool] | None = None
    slow: bool = False                          # fewer repeats (--slow-repeats)
    warm_each_size: bool = False                # an untimed run before the first timed one at every size
    cwd: Path | None = None


def states_after(states: dict[int, str], n: int, state: str) -> dict[int, str]:
    """The bed's state per size once its first n hosts are in `state`. The sizes share their first hosts: a smaller
    size is wholly in that state, and a larger one is mixed unless its other hosts were in it already (a 32-host
    rollback leaves a 200-host bed neither applied nor pristine)."""
    out = {m: state if m < n else s if m == n or s == state else "mixed" for m, s in states.items()}
    out[n] = state
    return out


class Runner:
    def __init__(self, args: argparse.Namespace, bed: Bed) -> None:
        self.args, self.bed = args, bed
        self.state: dict[int, str] = {}
        self.meter = HostMeter(bed.listeners())
        self.logs = bed.work / "logs"
        self.logs.mkdir(exist_ok=True)
        # Bytecode as an installed package has it (this sandbox sets PYTHONDONTWRITEBYTECODE): see precompile().
        self.base_env = {k: v for k, v in os.environ.items()
                         if not k.startswith(("DDOPS_", "ANSIBLE_", "PYINFRA_")) and k != "PYTHONDONTWRITEBYTECODE"}
        self.cache_dir = bed.work / "plan-cache"
        # With a baseline checkout, both slots launch alike (`python -m ddops` from their checkout, on PYTHONPATH):
        # the installed script against `python -m` alone put the two slots 10-14% apart with identical code.
        self.ddops = [sys.executable, "-m", "ddops"] if args.baseline_repo else ddops_command()
        self.ddops_cwd = Path(getattr(args, "this_repo", None) or REPO).resolve() if args.baseline_repo else None
        self.anchors_bin = find_anchor_bin(args.anchors_venv)
        self.tools = self._tools()
        self.counter = 0

    # -- tool table ----------------------------------------------------------------------------------------------
    def _ddops_env(self, cold: bool) -> Callable[[int], dict[str, str]]:
        def env(n: int) -> dict[str, str]:
            e = {**self.base_env, "DDOPS_CACHE_DIR": str(self.cache_dir), "COLUMNS": "200"}
            if self.ddops_cwd:
                e["PYTHONPATH"] = str(self.ddops_cwd)
            if cold:
                e["DDOPS_PLAN_CACHE"] = "0"
            return e
        return env

    def _tools(self) -> list[Tool]:
        bed, d = self.bed, self.ddops
        inv = bed.ddops_inventory

        def expect(status: str) -> Callable[[int, Sample, str], bool]:
            def check(n: int, sample: Sample, out: str) -> bool:
                doc = json.loads(out)
                sample.round_trips = [h["round_trips"] for h in doc["hosts"]]
                sample.extra["connect_s"] = statistics.median(h["connect_s"] or 0 for h in doc["hosts"])
                if "transforms" in doc:
                    sample.extra["transforms"] = doc["transforms"]
                return doc["summary"] == {status: n}
            return check

        def patched(n: int, sample: Sample, out: str) -> bool:
            return bed.patched(n)

        tools = [
            Tool("ddops-cold", "ddops patch, first apply (plan cache off)", "ddops",
                 lambda n: d + ["-i", str(inv(n)), "patch", PLAYBOOK, "--all", "--json"], self._ddops_env(True),
                 leaves="applied", verify=expect("changed")),
            Tool("ddops", "ddops patch, first apply (plan cache warm)", "ddops",
                 lambda n: d + ["-i", str(inv(n)), "patch", PLAYBOOK, "--all", "--json"], self._ddops_env(False),
                 leaves="applied", verify=expect("changed")),
            Tool("ddops-fresh", "ddops patch, first apply (plan cache warm, no resident agent: agent_linger 0)",
                 "ddops", lambda n: d + ["-i", str(inv(n, resident=False)), "patch", PLAYBOOK, "--all", "--json"],
                 self._ddops_env(False), leaves="applied", verify=expect("changed")),
            Tool("ddops-rerun", "ddops patch, idempotent rerun", "ddops",
                 lambda n: d + ["-i", str(inv(n)), "patch", PLAYBOOK, "--all", "--json"], self._ddops_env(False),
                 needs="applied", leaves="same", verify=expect("ok")),
            Tool("ddops-rollback", "ddops rollback", "ddops",
                 lambda n: d + ["-i", str(inv(n)), "rollback", "--all", "--yes", "--json"], self._ddops_env(False),
                 needs="applied", leaves="dirty", verify=expect("changed")),
            Tool("ddops-check", "ddops patch --check", "ddops",
                 lambda n: d + ["-i", str(inv(n)), "patch", PLAYBOOK, "--all", "--check", "--json"],
                 self._ddops_env(False), leaves="same", verify=expect("changed")),
        ]
        tools = [replace(t, cwd=self.ddops_cwd) for t in tools]
        if self.args.baseline_repo:
            # The same ddops rows run from another checkout (e.g. the commit before a change), in the same run.
            base = self.ddops  # `python -m ddops`, as this checkout's rows
            repo = str(Path(self.args.baseline_repo).resolve())

            def base_env(cold: bool) -> Callable[[int], dict[str, str]]:
                # its own cache: the two versions' residents and plan caches must not replace each other's
                return lambda n: {**self._ddops_env(cold)(n), "PYTHONPATH": repo,
                                  "DDOPS_CACHE_DIR": str(self.cache_dir / "baseline")}

            for key, label, argv, cold, needs, leaves, status in (
                    ("cold", "first apply (plan cache off)", ["patch", PLAYBOOK], True, "pristine", "applied",
                     "changed"),
                    ("warm", "first apply (plan cache warm)", ["patch", PLAYBOOK], False, "pristine", "applied",
                     "changed"),
                    ("rerun", "idempotent rerun", ["patch", PLAYBOOK], False, "applied", "same", "ok"),
                    ("rollback", "rollback", ["rollback", "--yes"], False, "applied", "dirty", "changed"),
                    ("check", "--check", ["patch", PLAYBOOK, "--check"], False, "pristine", "same", "changed")):
                tools.append(Tool(
                    f"baseline-{key}", f"baseline ddops ({Path(repo).name}): {label}", "baseline",
                    (lambda a: lambda n: base + ["-i", str(inv(n)), a[0], *a[1:], "--all", "--json"])(argv),
                    base_env(cold), needs=needs, leaves=leaves, verify=expect(status),
                    cwd=Path(repo)))  # `python -m` puts the cwd first on sys.path, before PYTHONPATH
        fabric_python = sys.executable if _has_module(sys.executable, "fabric") else (
            str(self.anchors_bin / "python") if self.anchors_bin else None)
        if fabric_python:
            tools.append(Tool("fabric", "Fabric 3 ThreadingGroup one-liner (cp && sed && grep)", "anchor",
                              lambda n: [fabric_python, str(HERE / "anchors" / "fabric_patch.py"), str(bed.spec(n))],
                              lambda n: dict(self.base_env), verify=patched))
        tools.append(Tool("openssh", "raw OpenSSH, one `ssh host 'cp && sed && grep' &` per host", "anchor",
                          lambda n: ["bash", str(bed.parallel_ssh_script(n, one_liner(bed.tb.repo_path), "oneliner"))],
                          lambda n: dict(self.base_env), verify=patched))
        pyinfra = self.anchors_bin / "pyinfra" if self.anchors_bin else None
        if pyinfra and pyinfra.exists():
            tools.append(Tool("pyinfra", "pyinfra files.replace(backup=True) + grep", "anchor",
                              lambda n: [str(pyinfra), "-y", "--parallel", str(n), "--no-wait",
                                         str(HERE / "anchors" / "pyinfra_inventory.py"),
                                         str(HERE / "anchors" / "pyinfra_deploy.py")],
                              lambda n: {**self.base_env, "FANOUT_SPEC": str(bed.spec(n))}, verify=patched,
                              cwd=bed.work))
        ansible = self.anchors_bin / "ansible-playbook" if self.anchors_bin else None
        if ansible and ansible.exists():
            for warm in (False, True):
                tools.append(Tool(
                    "ansible-warm" if warm else "ansible",
                    "ansible-playbook replace(backup) + grep, " + (
                        "warm: ControlPersist + pipelining" if warm else "cold: no ControlPersist"), "anchor",
                    (lambda w: lambda n: [str(ansible), "-i", str(self.ansible_inventory(n)), "-f", str(n),
                                          "-e", f"@{self.ansible_vars()}",
                                          str(HERE / "anchors" / "ansible_patch.yml")])(warm),
                    (lambda w: lambda n: {**self.base_env, **self.ansible_env(w)})(warm),
                    verify=patched, slow=True, warm_each_size=warm, cwd=bed.work))
        tools.append(Tool("floor", f"floor: `ssh host true` in parallel (OpenSSH, {KEX})", "floor",
                          lambda n: ["bash", str(bed.parallel_ssh_script(n, "true", "floor"))],
                          lambda n: dict(self.base_env), needs="any", leaves="same"))
        if self.args.only:
            wanted = set(self.args.only.split(","))
            tools = [t for t in tools if t.key in wanted or t.group in wanted]
        return tools

    # -- ansible files -------------------------------------------------------------------------------------------
    def ansible_inventory(self, n: int) -> Path:
        path = self.bed.work / f"ansible-{n}.ini"
        if not path.exists():
            lines = ["[fleet]"] + [f"{h.name} ansible_host={h.address} ansible_port={h.port}"
                                   for h in self.bed.hosts[:n]]
            lines += ["[all:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={self.bed.tb.client_key}",
                      f"ansible_python_interpreter={self.bed.host_python}"]
            path.write_text("\n".join(lines) + "\n")
        return path

    def ansible_vars(self) -> Path:
        path = self.bed.work / "ansible-vars.json"
        if not path.exists():
            path.write_text(json.dumps({"repo": self.bed.tb.repo_path, "files": list(SEED_FILES),
                                        "regexp": re.escape(OLD), "replacement": NEW,
                                        "grep_command": grep_command(self.bed.tb.repo_path)}))
        return path

    def ansible_env(self, warm: bool) -> dict[str, str]:
        name = "warm" if warm else "cold"
        home = self.bed.work / f"ansible-{name}"
        (home / "cp").mkdir(parents=True, exist_ok=True)
        cfg = home / "ansible.cfg"
        if not cfg.exists():
            ssh_args = (f"-F /dev/null -o UserKnownHostsFile={self.bed.tb.known_hosts} "
                        f"-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o KexAlgorithms={KEX} "
                        "-o IdentitiesOnly=yes " + ("-o ControlMaster=auto -o ControlPersist=1800s" if warm
                                                    else "-o ControlMaster=no"))
            cfg.write_text("\n".join([
                "[defaults]", "host_key_checking = True", "retry_files_enabled = False",
                f"local_tmp = {home}/tmp", "remote_tmp = /tmp/ddops-fleet-speed-ansible", "deprecation_warnings = False",
                "[ssh_connection]", f"ssh_args = {ssh_args}", f"pipelining = {warm}", f"control_path_dir = {home}/cp",
            ]) + "\n")
        return {"ANSIBLE_CONFIG": str(cfg), "ANSIBLE_HOME": str(home), "ANSIBLE_NOCOLOR": "1"}

    def stop_ansible_masters(self) -> None:
        """End the ControlPersist masters the warm runs left, through their control sockets."""
        for sock in (self.bed.work / "ansible-warm" / "cp").glob("*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "fleet-speed"], capture_output=True,
                           timeout=10)

    # -- running -------------------------------------------------------------------------------------------------
    def prepare(self, tool: Tool, n: int) -> None:
        state = self.state.get(n, "unknown")
        if tool.needs == "pristine" and state != "pristine":
            self.bed.reset(n)
            state = "pristine"
        elif tool.needs == "applied" and state != "applied":
            self.bed.reset(n)
            _, out = self.run_once(self.tools_by_key("ddops", n), n, tag="prep")
            state = "applied"
        self.record_state(n, state)

    def record_state(self, n: int, state: str) -> None:
        self.state = states_after(self.state, n, state)

    def tools_by_key(self, key: str, n: int) -> Tool:
        for t in self.tools:
            if t.key == key:
                return t
        return Tool("ddops", "", "ddops", lambda m: self.ddops + ["-i", str(self.bed.ddops_inventory(m)), "patch",
                                                                  PLAYBOOK, "--all", "--json"],
                    self._ddops_env(False))

    def run_once(self, tool: Tool, n: int, tag: str) -> tuple[Sample, str]:
        self.counter += 1
        sample, out = timed(tool.argv(n), env=tool.env(n), meter=self.meter, log_dir=self.logs,
                            tag=f"{self.counter:04d}-{tool.key}-{n}-{tag}", cwd=tool.cwd)
        return sample, out

    def measure(self, tool: Tool, n: int, rep: int) -> Sample:
        self.prepare(tool, n)
        sample, out = self.run_once(tool, n, tag=f"r{rep}")
        if sample.ok and tool.verify is not None:
            try:
                sample.ok = bool(tool.verify(n, sample, out))
            except (ValueError, KeyError, OSError) as exc:
                sample.ok = False
                sample.extra["error"] = f"verify: {type(exc).__name__}: {exc}"
            if not sample.ok and "error" not in sample.extra:
                sample.extra["error"] = "verify failed: " + out[-300:]
        if tool.leaves != "same":
            self.record_state(n, tool.leaves)
        return sample

    def repeats_for(self, tool: Tool) -> int:
        return min(self.args.repeats, self.args.slow_repeats) if tool.slow else self.args.repeats

    def run_matrix(self) -> dict[str, dict[int, list[Sample]]]:
        results: dict[str, dict[int, list[Sample]]] = {t.key: {} for t in self.tools}
        warmed: set[str] = set()
        for n in self.args.sizes:
            log(f"== {n} host{'s' if n != 1 else ''}: load {load_text()}")
            for tool in self.tools:
                if tool.key not in warmed or tool.warm_each_size:
                    self.prepare(tool, n)
                    sample, _ = self.run_once(tool, n, tag="warmup")  # page cache, plan cache, ControlPersist
                    warmed.add(tool.key)
                    if tool.leaves != "same":
                        self.record_state(n, tool.leaves)
            for rep in range(self.args.repeats):
                for tool in self.tools:
                    if rep >= self.repeats_for(tool):
                        continue
                    sample = self.measure(tool, n, rep)
                    results[tool.key].setdefault(n, []).append(sample)
                    flag = "" if sample.ok else f"  FAILED {sample.extra.get('error', '')}"
                    rt = f" rt={sorted(set(sample.round_trips))}" if sample.round_trips else ""
                    log(f"  n={n} rep={rep} {tool.key:15s} {sample.wall:7.3f}s cpu={sample.cpu:6.2f}s "
                        f"host={sample.host_cpu:6.2f}s rss={sample.maxrss_mb:6.1f}MB{rt}{flag}")
        self.stop_ansible_masters()
        return results


def _has_module(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def precompile(*checkouts: str | Path | None) -> None:
    """Bytecode for ddops (and the other checkouts' given), as a pip install leaves it (the anchors' packages have
    theirs). Without it, under PYTHONDONTWRITEBYTECODE, every run would compile every module it imports."""
    for repo in [REPO] + [Path(c) for c in checkouts if c]:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "ddops")], capture_output=True)


def ddops_command() -> list[str]:
    script = Path(sys.executable).parent / "ddops"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ddops"]


def find_anchor_bin(venv: str | None) -> Path | None:
    for candidate in ([Path(venv) / "bin"] if venv else []) + [HERE / ".venv" / "bin", Path(sys.executable).parent]:
        if (candidate / "ansible-playbook").exists() or (candidate / "pyinfra").exists():
            return candidate
    return None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- startup, ping, scaling -----------------------------------------------------------------------------------

FORBIDDEN_AT_STARTUP = ("paramiko", "cryptography", "libcst", "torch", "transformers", "fabric", "numpy")


def measure_startup(repeats: int) -> dict[str, Any]:
    """`ddops --help` wall time, and which heavy modules its import path loads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDOPS_") and k != "PYTHONDONTWRITEBYTECODE"}
    walls = []
    argv = ddops_command() + ["--help"]
    subprocess.run(argv, capture_output=True, env=env)  # page cache
    for _ in range(max(repeats, 5) * 2):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, check=True)
        walls.append(time.perf_counter() - started)
    trace = subprocess.run([sys.executable, "-X", "importtime", "-m", "ddops", "--help"], capture_output=True,
                           text=True, env=env)
    modules = set()
    for line in trace.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            modules.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    cum = [int(line.split("|")[1]) for line in trace.stderr.splitlines()
           if line.startswith("import time:") and line.rsplit("|", 1)[1].strip() == "ddops.cli.app"]
    return {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls), "runs": len(walls),
            "heavy_modules_loaded": sorted(m for m in FORBIDDEN_AT_STARTUP if m in modules),
            "import_ddops_cli_app_ms": cum[0] / 1000 if cum else None, "modules": len(modules)}


def measure_ping(runner: Runner, n: int) -> dict[str, Any]:
    """`ddops ping` on n hosts; host1's rc file then gets a 150 ms sleep, and ping must report it."""
    bed = runner.bed
    n = min(n, len(bed.hosts))
    env = runner._ddops_env(False)(n)
    argv = runner.ddops + ["-i", str(bed.ddops_inventory(n)), "ping", "--all", "--json"]
    plain = json.loads(subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout)
    rc_file = Path(bed.hosts[0].dir) / "bashrc"  # bind-mounted over ~/.bashrc inside host1's namespace
    original = rc_file.read_text()
    try:
        with open(rc_file, "w") as fh:  # in place: the bind mount follows the inode, not the name
            fh.write(original + "sleep 0.15  # fleet-speed benchmark: a slow rc file\n")
        slow = json.loads(subprocess.run(argv, capture_output=True, text=True, env=env).stdout)
    finally:
        with open(rc_file, "w") as fh:
            fh.write(original)

    def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"host": h["host"], "status": h["status"], "rtt_s": h["data"].get("rtt_s"),
                 "shell_rc_overhead_s": h["data"].get("shell_rc_overhead_s"), "message": h["message"],
                 "round_trips": h["round_trips"]} for h in doc["hosts"]]

    return {"hosts": n, "plain": rows(plain), "slow_rc_host1": rows(slow)}


def scaling_files(variant: str) -> dict[str, bytes]:
    """The simulated repo: SCALING_FILES Python files of mixed sizes, each with one cache line to patch.

    Variant "b" is the same tree one upstream commit later: every tenth file gained a function.
    """
    files = {}
    for i in range(SCALING_FILES):
        rng = random.Random(i)
        functions = max(1, int(round(2 ** rng.uniform(0, 7))))  # 1..128 small functions: ~0.3 KB .. ~25 KB
        parts = [f'"""simulated module {i}"""\nimport torch\nfrom transformers import DynamicCache\n\n']
        for k in range(functions):
            parts.append(f"def helper_{i}_{k}(x, y):\n    z = x * {k + 1} + y\n    if z > {k}:\n"
                         f"        return [a + z for a in range(3)]\n    return {{'k': z, 'i': {i}}}\n\n\n")
        if variant == "b" and i % 10 == 3:
            parts.append(f"def upstream_change_{i}(x):\n    return x - {i}\n\n\n")
        parts.append("def generate(target, draft):\n    past_key_values_target = DynamicCache()\n"
                     "    past_key_values_draft = DynamicCache()\n    return past_key_values_target\n")
        files[f"sim/m{i:04d}.py"] = "".join(parts).encode()
    return files


def write_scaling_playbook() -> None:
    names = sorted(scaling_files("a"))
    listing = "".join(f"      - {name}\n" for name in names)
    SCALING_PLAYBOOK.write_text(f"""name: fleet-speed-scaling
description: >-
  The fleet-speed measurement's scaling case: the hybrid-cache edit on {len(names)} simulated Python files of mixed sizes
  (written by benchmarks/fleet-speed/run.py into sim/ on each host). Hosts on the same commit share contents, so the
  planner transforms each distinct content once.
patches:
  - id: sim-hybrid-cache
    description: "past_key_values_target = DynamicCache() -> DynamicCache(config=target.config ...), {len(names)} files"
    files:
{listing}    transform:
      kind: set_call_kwarg
      callee: DynamicCache
      assigned_to: past_key_values_target
      keyword: config
      value: 'target.config if hasattr(target, "config") else None'
    checks:
      - kind: contains
        text: 'past_key_values_target = DynamicCache(config=target.config'
      - kind: absent
        text: "past_key_values_target = DynamicCache()"
      - compiles
""")


def measure_scaling(runner: Runner, repeats: int) -> dict[str, Any]:
    """ddops patch --check over 1000 files: 1 host, then 8 hosts on two commits; plan cache cold and warm."""
    bed = runner.bed
    if not SCALING_PLAYBOOK.exists():
        write_scaling_playbook()
    hosts = min(SCALING_HOSTS, len(bed.hosts))
    trees = {"a": scaling_files("a"), "b": scaling_files("b")}
    for index, host in enumerate(bed.hosts[:hosts]):
        tree = trees["a" if index < (hosts + 1) // 2 else "b"]
        sim = host.repo_dir / "sim"
        if sim.exists():
            shutil.rmtree(sim)
        sim.mkdir()
        for name, data in tree.items():
            (host.repo_dir / name).write_bytes(data)
    distinct = {(p, d) for i in range(hosts) for p, d in trees["a" if i < (hosts + 1) // 2 else "b"].items()}
    sizes = [len(d) for d in trees["a"].values()]
    out: dict[str, Any] = {
        "files": SCALING_FILES, "hosts": hosts, "bytes_per_host": sum(sizes),
        "file_sizes": {"min": min(sizes), "median": int(statistics.median(sizes)), "max": max(sizes)},
        "distinct_contents": len(distinct), "host_files": hosts * SCALING_FILES, "runs": {}}
    warm_cache = bed.work / "scaling-cache"
    for n in sorted({min(h, hosts) for h in runner.args.scaling_hosts}):
        for mode in runner.args.scaling_modes:
            env = {**runner.base_env, "DDOPS_CACHE_DIR": str(warm_cache), "COLUMNS": "200"}
            if mode == "cold":
                env["DDOPS_PLAN_CACHE"] = "0"
            argv = runner.ddops + ["-i", str(bed.ddops_inventory(n)), "patch", str(SCALING_PLAYBOOK), "--all",
                                   "--check", "--json"]
            tool = Tool(f"scaling-{mode}", "", "ddops", lambda m, a=argv: a, lambda m, e=env: e)
            if mode == "warm":
                runner.run_once(tool, n, tag="warmup")
            samples = []
            for rep in range(repeats):
                sample, text = runner.run_once(tool, n, tag=f"r{rep}")
                try:
                    doc = json.loads(text)
                    sample.extra["transforms"] = doc.get("transforms")
                    sample.extra["summary"] = doc.get("summary")
                    sample.round_trips = [h["round_trips"] for h in doc["hosts"]]
                    sample.ok = sample.ok and doc.get("summary") == {"changed": n}
                except ValueError:
                    sample.ok = False
                samples.append(sample)
                log(f"  scaling n={n} {mode} rep={rep} {sample.wall:7.2f}s cpu={sample.cpu:6.2f}s "
                    f"rss={sample.maxrss_mb:.0f}MB {sample.extra.get('transforms')} {sample.extra.get('summary')}")
            out["runs"][f"{n}-{mode}"] = [asdict(s) for s in samples]
    for host in bed.hosts[:hosts]:
        shutil.rmtree(host.repo_dir / "sim", ignore_errors=True)
    return out


# --- report ---------------------------------------------------------------------------------------------------

def describe_machine(bed_hosts: int, host_python: str) -> dict[str, Any]:
    def first(path: str, key: str) -> str | None:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip() if ":" in line else line.split("=", 1)[1].strip('"')
        except OSError:
            pass
        return None

    def version(argv: list[str]) -> str | None:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else None

    def py_version(python: str, module: str) -> str | None:
        p = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({module!r}))"],
                           capture_output=True, text=True)
        return p.stdout.strip() or None

    mem_kb = int((first("/proc/meminfo", "MemTotal") or "0 kB").split()[0])
    anchors = find_anchor_bin(None)
    anchor_py = str(anchors / "python") if anchors and (anchors / "python").exists() else sys.executable
    return {
        "cpu": first("/proc/cpuinfo", "model name"), "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(), "os": first("/etc/os-release", "PRETTY_NAME="),
        "python": platform.python_version(), "host_python": version([host_python, "-V"]),
        "openssh": version(["ssh", "-V"]), "paramiko": py_version(sys.executable, "paramiko"),
        "fabric": py_version(sys.executable, "fabric"), "ansible_core": py_version(anchor_py, "ansible-core"),
        "pyinfra": py_version(anchor_py, "pyinfra"), "anchors_paramiko": py_version(anchor_py, "paramiko"),
        "testbed_hosts": bed_hosts,
    }


def summarize(samples: list[Sample]) -> dict[str, Any]:
    good = [s for s in samples if s.ok]
    if not good:
        return {"runs": len(samples), "ok": 0}
    walls = [s.wall for s in good]
    rts = sorted({r for s in good for r in (s.round_trips or [])})
    return {"runs": len(samples), "ok": len(good), "median": statistics.median(walls), "min": min(walls),
            "max": max(walls), "cpu": statistics.median(s.cpu for s in good),
            "host_cpu": statistics.median(s.host_cpu for s in good), "rss": max(s.maxrss_mb for s in good),
            "round_trips": rts}


def fmt_rt(rts: list[int]) -> str:
    if not rts:
        return "–"
    return str(rts[0]) if len(rts) == 1 else f"{rts[0]}–{rts[-1]}"


def render(meta: dict[str, Any], tools: list[Tool], results: dict[str, dict[int, list[Sample]]],
           startup: dict[str, Any] | None, ping: dict[str, Any] | None, scaling: dict[str, Any] | None,
           notes: str, previous: str = "") -> str:
    sizes = meta["sizes"]
    stats = {t.key: {n: summarize(results.get(t.key, {}).get(n, [])) for n in sizes if results.get(t.key, {}).get(n)}
             for t in tools}
    m = meta["machine"]
    out = ["# Fleet speed: ddops vs Ansible, pyinfra, Fabric and raw OpenSSH", "",
           f"Generated by `python benchmarks/fleet-speed/run.py {meta['argv']}` on {meta['date']} "
           f"({meta['duration_s'] / 60:.0f} min). Anchors: `bash benchmarks/fleet-speed/setup-anchors.sh` (ansible-core and "
           "pyinfra in benchmarks/fleet-speed/.venv; pyinfra 3 needs paramiko < 5). Raw samples: RESULTS.json.", "",
           "## Machine", "",
           f"- {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; {m['os']}, Linux {m['kernel']}",
           f"- controller Python {m['python']}, paramiko {m['paramiko']}, Fabric {m['fabric']}; "
           f"{m['openssh']}; ansible-core {m['ansible_core'] or 'not installed'}, "
           f"pyinfra {m['pyinfra'] or 'not installed'} (their own venv, paramiko {m['anchors_paramiko']})",
           f"- hosts: {m['testbed_hosts']} testbed sshd's on 127.x.y.N, each in its own mount namespace, host keys "
           f"checked by every tool; host python {m['host_python']} (ddops' agent, Ansible's modules)",
           f"- load average (1/5/15 min) at start {meta['load_start']}, at end {meta['load_end']}: this machine is "
           "shared; the tools are interleaved per repeat so that they see the same load", "",
           "## What is timed", "",
           "Whole processes, as a user runs them: wall time from spawn to exit; **CPU** = user+system seconds of the "
           "controller process and every child it reaped (ssh clients, Ansible forks); **host CPU** = user+system "
           "seconds of every process in the hosts' mount namespaces (sshd, the login shell, the agent or module, sed, "
           "ddops' resident agents and their sessions); **RSS** = "
           "peak resident set of the largest process in the controller's tree (ru_maxrss), max over the runs. "
           "Every tool makes the same edit (`past_key_values_target = DynamicCache()` → "
           "`DynamicCache(config=target.config if hasattr(target, \"config\") else None)`) in ddtree.py and "
           "dflash.py with a backup, then greps for it; the files are reset between runs. ddops also plans (the "
           "stdlib `ast` fast path, libcst where a kind needs it), diffs, journals, takes a content-addressed backup and runs the playbook's checks (contains, "
           "absent, unchanged, compiles). OpenSSH-based tools (raw ssh, Ansible, the floor) get "
           f"`-o KexAlgorithms={KEX}` (OpenSSH 9's default post-quantum exchange costs ~2x more). "
           f"Repeats: {meta['repeats']} per tool and size (Ansible: {meta['slow_repeats']}), after one untimed "
           "warm-up per tool; the warm Ansible row reuses ControlPersist masters opened by an untimed run.", "",
           "## Results: median wall seconds (min–max)", ""]
    header = "| tool | " + " | ".join(f"N={n}" for n in sizes) + " |"
    out += [header, "|" + "---|" * (len(sizes) + 1)]
    for t in tools:
        cells = []
        for n in sizes:
            s = stats[t.key].get(n)
            if not s:
                cells.append("–")
            elif not s.get("ok"):
                cells.append(f"failed ({s['runs']} runs)")
            else:
                fails = f", {s['runs'] - s['ok']} failed" if s["ok"] < s["runs"] else ""
                cells.append(f"**{s['median']:.2f}** ({s['min']:.2f}–{s['max']:.2f}{fails})")
        out.append(f"| {t.label} | " + " | ".join(cells) + " |")
    out += ["", "## CPU, memory and round trips (medians; RSS is the peak)", "",
            "| tool | N | CPU s (controller) | host CPU s | peak RSS MB | SSH exec round trips per host |",
            "|---|---|---|---|---|---|"]
    for t in tools:
        for n in sizes:
            s = stats[t.key].get(n)
            if s and s.get("ok"):
                out.append(f"| {t.label} | {n} | {s['cpu']:.2f} | {s['host_cpu']:.2f} | {s['rss']:.0f} | "
                           f"{fmt_rt(s['round_trips']) if t.group == 'ddops' else '–'} |")
    out += ["", "Round trips are ddops' own counter (`round_trips` in `--json`), after connecting: one per request "
            "and answer, i.e. per agent call; a session's agent calls share one exec channel (see the notes).", ""]
    # ratios
    anchors = [t for t in tools if t.group in ("anchor", "floor")]
    mains = [t for t in tools if t.key in MAIN_ROWS]
    if anchors and mains:
        out += ["## Ratios: ddops patch (first apply) / anchor, median wall", "",
                "Each cell: plan cache off / plan cache warm / plan cache warm without a resident agent "
                "(`agent_linger: 0`: Python started on every host by every command). Below 1: ddops is faster.", "",
                "| anchor | " + " | ".join(f"N={n}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for a in anchors:
            cells = []
            for n in sizes:
                y = stats[a.key].get(n)
                parts = []
                for main in mains:
                    x = stats[main.key].get(n)
                    parts.append(f"{x['median'] / y['median']:.2f}" if x and y and x.get("ok") and y.get("ok")
                                 else "–")
                cells.append(" / ".join(parts))
            out.append(f"| {a.label} | " + " | ".join(cells) + " |")
        out += [""]
    if any(t.group == "ddops" for t in tools) and any(stats.values()):
        out += targets_section(stats, tools)
    if startup:
        heavy = ", ".join(startup["heavy_modules_loaded"]) or "none"
        verdict = "met" if startup["median_s"] < 0.3 and not startup["heavy_modules_loaded"] else "NOT met"
        out += ["## Startup", "",
                f"`ddops --help`: median **{startup['median_s']:.3f} s** (min {startup['min_s']:.3f}, max "
                f"{startup['max_s']:.3f}, {startup['runs']} runs); target < 0.3 s: {verdict}. "
                f"`python -X importtime -m ddops --help` imports {startup['modules']} top-level packages; of "
                f"{', '.join(FORBIDDEN_AT_STARTUP)}: {heavy}. `import ddops.cli.app` cumulative: "
                f"{startup['import_ddops_cli_app_ms']:.0f} ms.", ""]
    if ping:
        out += ["## `ddops ping`: the login shell's rc overhead", "",
                f"On {ping['hosts']} hosts (the testbed's minimal ~/.bashrc), then again after appending "
                "`sleep 0.15` to host1's rc file:", "",
                "| run | host | rtt ms | shell rc overhead ms | round trips | message |", "|---|---|---|---|---|---|"]
        for label, rows in (("plain", ping["plain"]), ("slow rc on host1", ping["slow_rc_host1"][:2])):
            for r in rows[:2]:
                rc = r["shell_rc_overhead_s"]
                out.append(f"| {label} | {r['host']} | {(r['rtt_s'] or 0) * 1000:.1f} | "
                           f"{'–' if rc is None else f'{rc * 1000:.0f}'} | {r['round_trips']} | {r['message']} |")
        out += [""]
    if scaling:
        out += scaling_section(scaling)
    if FLEET_BEGIN in previous and FLEET_END in previous:  # fleet_mode.py's section stays as it was
        out += [FLEET_BEGIN + previous.split(FLEET_BEGIN, 1)[1].split(FLEET_END, 1)[0] + FLEET_END, ""]
    out += ["## Notes", "", NOTES_BEGIN, notes.strip("\n"), NOTES_END, ""]
    return "\n".join(out)


def targets_section(stats: dict[str, dict[int, dict[str, Any]]], tools: list[Tool]) -> list[str]:
    sizes = sorted({size for by_n in stats.values() for size in by_n})
    n = 32 if 32 in sizes else max(sizes)
    keys = {t.key for t in tools}
    lines = [f"### Targets at N={n} (same run{'' if n == 32 else '; the targets are set for N=32'})", "",
             "| target | measured | met? |", "|---|---|---|"]

    def med(key: str, size: int = n) -> float | None:
        s = stats.get(key, {}).get(size)
        return s["median"] if s and s.get("ok") else None

    for main in MAIN_ROWS:
        if main not in keys or med(main) is None:
            continue
        for anchor, limit in (("fabric", 1.3), ("pyinfra", 0.67), ("ansible", 0.1), ("ansible-warm", 0.1)):
            if med(anchor) is None:
                continue
            ratio = med(main) / med(anchor)
            lines.append(f"| {main} ≤ {limit}× {anchor} | {med(main):.2f} s / {med(anchor):.2f} s = {ratio:.2f}× | "
                         f"{'yes' if ratio <= limit else 'NO'} |")
    # Issue 13: the first plan of a new content (plan cache off) as fast as the warm path.
    if med("ddops-cold") is not None and med("fabric") is not None:
        ratio = med("ddops-cold") / med("fabric")
        lines.append(f"| ddops-cold ≤ 1.0× fabric | {med('ddops-cold'):.2f} s / {med('fabric'):.2f} s = "
                     f"{ratio:.2f}× | {'yes' if ratio <= 1.0 else 'NO'} |")
    if med("ddops-cold") is not None and med("ddops") is not None:
        ratio = med("ddops-cold") / med("ddops")
        lines.append(f"| ddops-cold ≤ 1.3× ddops (warm) | {med('ddops-cold'):.2f} s / {med('ddops'):.2f} s = "
                     f"{ratio:.2f}× | {'yes' if ratio <= 1.3 else 'NO'} |")
    for key, base in (("ddops-cold", "baseline-cold"), ("ddops", "baseline-warm"), ("ddops-rerun", "baseline-rerun"),
                      ("ddops-check", "baseline-check"), ("ddops-rollback", "baseline-rollback")):
        if med(key) is not None and med(base) is not None:
            # "no slower than the baseline checkout", with 10% for this shared machine's noise
            ratio = med(key) / med(base)
            lines.append(f"| {key} ≤ 1.1× {base} | {med(key):.2f} s / {med(base):.2f} s = {ratio:.2f}× | "
                         f"{'yes' if ratio <= 1.1 else 'NO'} |")
    for key, want in (("ddops", 2), ("ddops-cold", 2), ("ddops-fresh", 2), ("ddops-rerun", 1), ("ddops-check", 1),
                      ("ddops-rollback", 2)):
        runs = [s for s in stats.get(key, {}).values() if s.get("ok")]
        if runs:
            seen = sorted({r for s in runs for r in s["round_trips"]})
            lines.append(f"| {key}: {want} round trip{'s' if want > 1 else ''} per host after connecting (every N) | "
                         f"{fmt_rt(seen)} | {'yes' if seen == [want] else 'NO'} |")
    big = max((size for size in stats.get("ddops", {})), default=None)
    rss = None if big is None else max((stats[k][big]["rss"] for k in ("ddops", "ddops-cold", "ddops-fresh",
                                                                          "ddops-rerun", "ddops-check", "ddops-rollback")
                                        if k in stats and big in stats[k] and stats[k][big].get("ok")), default=None)
    if rss is not None:
        lines.append(f"| controller peak RSS < 100 MB at N={big} | {rss:.0f} MB | {'yes' if rss < 100 else 'NO'} |")
    return lines + [""]


def scaling_section(sc: dict[str, Any]) -> list[str]:
    fs = sc["file_sizes"]
    lines = ["## Scaling: the transform cache at 1000 files", "",
             f"`ddops patch benchmarks/fleet-speed/scaling-1000.yaml --check` over {sc['files']} simulated Python files "
             f"({fs['min']} B – {fs['max']} B, median {fs['median']} B, {sc['bytes_per_host'] / 1e6:.1f} MB per "
             f"host), first on 1 host, then on {sc['hosts']} hosts on two commits (half of them one upstream commit "
             f"later, where every tenth file changed): {sc['host_files']} host-files but "
             f"{sc['distinct_contents']} distinct contents. Cold = `DDOPS_PLAN_CACHE=0` (every distinct content "
             "planned in this process: the stdlib fast path since issue 13, libcst before); warm = the on-disk plan "
             "cache filled by an earlier run. Targets (issue 13): cold under 10 s on 1 host and under 15 s on "
             f"{sc['hosts']}.", "",
             "| hosts | plan cache | median wall s (min–max) | CPU s | peak RSS MB | transforms computed | "
             "shared in memory | from disk cache | round trips/host |", "|---|---|---|---|---|---|---|---|---|"]
    for key, runs in sc["runs"].items():
        n, mode = key.split("-")
        good = [r for r in runs if r["ok"]]
        if not good:
            lines.append(f"| {n} | {mode} | failed | | | | | | |")
            continue
        walls = [r["wall"] for r in good]
        tr = good[-1]["extra"].get("transforms") or {}
        rts = sorted({x for r in good for x in (r["round_trips"] or [])})
        lines.append(f"| {n} | {mode} | **{statistics.median(walls):.2f}** ({min(walls):.2f}–{max(walls):.2f}) | "
                     f"{statistics.median(r['cpu'] for r in good):.2f} | {max(r['maxrss_mb'] for r in good):.0f} | "
                     f"{tr.get('cache_misses')} | {tr.get('cache_hits')} | {tr.get('disk_hits')} | "
                     f"{fmt_rt(rts)} |")
    return lines + ["", "The work done with libcst follows the distinct (path, content) pairs, not hosts × files: "
                    "`transforms computed` is 1000 on one host and "
                    f"{sc['distinct_contents']} on {sc['hosts']}, and every other host-file is served from memory.", ""]


def previous_notes(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError:
        return "(none yet)"
    if NOTES_BEGIN in text and NOTES_END in text:
        return text.split(NOTES_BEGIN, 1)[1].split(NOTES_END, 1)[0]
    return "(none yet)"


# --- main -----------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,8,32,64", help="Host counts, comma-separated (default 1,8,32,64).")
    p.add_argument("--repeats", type=int, default=5, help="Timed runs per tool and size (default 5).")
    p.add_argument("--slow-repeats", type=int, default=3, help="At most this many for Ansible (default 3).")
    p.add_argument("--only", help="Tools or groups, comma-separated: ddops, anchor, floor, ddops-cold, ddops, "
                                  "ddops-fresh, ddops-rerun, ddops-check, ddops-rollback, fabric, openssh, pyinfra, "
                                  "ansible, ansible-warm, baseline (with --baseline-repo).")
    p.add_argument("--baseline-repo", help="Another ddops checkout (e.g. `git worktree add /tmp/before REV`): its "
                                           "patch/rerun/check/rollback rows run in the same run (group baseline).")
    p.add_argument("--no-scaling", action="store_true", help="Skip the 1000-file transform-cache case.")
    p.add_argument("--scaling-repeats", type=int, default=2, help="Runs per scaling case (default 2).")
    p.add_argument("--scaling-hosts", default="1,8", help="Host counts of the scaling case (default 1,8).")
    p.add_argument("--scaling-modes", default="cold,warm", help="Plan cache modes of the scaling case: cold, warm.")
    p.add_argument("--no-matrix", action="store_true",
                   help="Skip the tools x sizes matrix (e.g. to run only the scaling case).")
    p.add_argument("--no-startup", action="store_true", help="Skip `ddops --help` and `ddops ping`.")
    p.add_argument("--host-python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists()
                   else sys.executable, help="Python on the hosts (ddops' agent, Ansible's modules).")
    p.add_argument("--anchors-venv", help="Venv with ansible-core and pyinfra (default benchmarks/fleet-speed/.venv).")
    p.add_argument("--output", default=str(HERE / "RESULTS.md"), help="Markdown report (default RESULTS.md here).")
    p.add_argument("--keep", action="store_true", help="Leave the testbed and work dir in place (debugging).")
    args = p.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    args.scaling_hosts = [int(x) for x in args.scaling_hosts.split(",") if x.strip()]
    args.scaling_modes = [x for x in args.scaling_modes.split(",") if x.strip()]
    if not args.scaling_hosts or min(args.scaling_hosts) < 1 or set(args.scaling_modes) - {"cold", "warm"}:
        p.error("--scaling-hosts: host counts >= 1; --scaling-modes: cold and/or warm")
    if not args.sizes or min(args.sizes) < 1 or max(args.sizes) > 250:
        p.error("--sizes: 1..250 hosts")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    load_start = load_text()
    work = Path(tempfile.mkdtemp(prefix="ddops-fleet-speed-"))
    seed = work / "seed"
    originals = write_seed(seed)
    count = max(([] if args.no_matrix else args.sizes)
                + ([min(SCALING_HOSTS, max(args.scaling_hosts))] if not args.no_scaling else []) + [1])
    prefix = f"127.{random.randint(60, 99)}.{random.randint(1, 250)}."  # the tests use 127.100-250.x
    log(f"fleet-speed: {count} testbed hosts on {prefix}2.., work dir {work}")
    tb = testbed.up(count, root=work / "testbed", seed=seed, address_prefix=prefix, python=args.host_python)
    bed = Bed(tb, work, args.host_python, originals)
    runner = Runner(args, bed)
    precompile(args.baseline_repo)
    try:
        log(f"tools: {', '.join(t.key for t in runner.tools)}")
        startup = None if args.no_startup else measure_startup(args.repeats)
        if startup:
            log(f"startup: ddops --help median {startup['median_s']:.3f}s, heavy: {startup['heavy_modules_loaded']}")
        results = {} if args.no_matrix else runner.run_matrix()
        ping = None if args.no_startup else measure_ping(runner, 8)
        scaling = None if args.no_scaling else measure_scaling(runner, args.scaling_repeats)
        meta = {"argv": " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "duration_s": time.monotonic() - started,
                "sizes": args.sizes, "repeats": args.repeats, "slow_repeats": min(args.repeats, args.slow_repeats),
                "load_start": load_start, "load_end": load_text(),
                "machine": describe_machine(count, args.host_python)}
        output = Path(args.output)
        report = render(meta, runner.tools, results, startup, ping, scaling, previous_notes(output),
                        output.read_text() if output.exists() else "")
        output.write_text(report)
        raw = {"meta": meta, "startup": startup, "ping": ping, "scaling": scaling,
               "results": {k: {str(n): [asdict(s) for s in v] for n, v in by_n.items()}
                           for k, by_n in results.items()}}
        output.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
        log(f"wrote {output} and {output.with_suffix('.json')}")
        failed = [k for k, by_n in results.items() for v in by_n.values() for s in v if not s.ok]
        if failed:
            log(f"some runs failed: {sorted(set(failed))} (logs in {work / 'logs'})")
            return 1
        return 0
    finally:
        if not args.keep:
            runner.stop_ansible_masters()
            testbed.down(tb.root)
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept: {work}")


if __name__ == "__main__":
    sys.exit(main())
