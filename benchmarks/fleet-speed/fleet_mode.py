#!/usr/bin/env python3
"""Fleet-like mode: what a real fleet's wall time is made of, measured apart on one small machine.

    python benchmarks/fleet-speed/fleet_mode.py latency --rtts 0,5,20 [--repeats 5]
    python benchmarks/fleet-speed/fleet_mode.py cpu --sizes 32,200 [--repeats 3]
    python benchmarks/fleet-speed/fleet_mode.py check --rtt 20 --hosts 32 [--repeats 3]

On a real fleet every host has CPUs of its own and is a round trip away; here the hosts share the controller's two
cores and are microseconds away, so a fleet's time is modelled from two figures measured apart:
- latency: 1 and 4 hosts worked on one after the other (`--forks 1`, Fabric's connections one by one, one ssh after
  another) through a delaying TCP proxy per host (delay_proxy.py; every chunk forwarded RTT/2 later each way), where
  nothing queues on host CPU. Per-host latency: each host's time as the tool itself timed it (ddops' `elapsed_s`,
  from connect to last answer); startup: the rest of the run's wall time.
- cpu: the controller's own CPU seconds (rusage of its process tree) at N=32 and N=200 hosts, no proxies.
- model: T(N, forks) = max(startup + ceil(N / forks) x per-host latency, controller CPU at N / usable cores), one
  core for a Python process (the GIL), every core for a fan-out of ssh processes.
`check` runs N hosts at once through the proxies to hold the model against a real run. Each mode writes its JSON to
.cache/fleet-speed/fleet-<mode>.json (raw samples, not kept in the tree); `report` turns them into the fleet
section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
from delay_proxy import DelayProxies  # noqa: E402
from run import PLAYBOOK, Bed, Runner, Sample, Tool, log  # noqa: E402

PROXY_PREFIX = "127.0.0."  # the proxies listen on loopback, one address per host
FLEET_N, FLEET_FORKS = 200, 32
BASELINE_ROWS = {"baseline-cold": "ddops-cold", "baseline-warm": "ddops", "baseline-rerun": "ddops-rerun",
                 "baseline-check": "ddops-check", "baseline-rollback": "ddops-rollback"}
BEGIN, END = run.FLEET_BEGIN, run.FLEET_END


# --- the hosts through proxies ----------------------------------------------------------------------------------

def proxied_bed(bed: Bed, work: Path, port: int) -> tuple[Bed, list[tuple[tuple[str, int], tuple[str, int]]]]:
    """A view of the testbed whose hosts are the proxies (127.0.0.x:port), with their host keys in known_hosts."""
    hosts, pairs, lines = [], [], []
    for i, host in enumerate(bed.hosts):
        address = f"{PROXY_PREFIX}{10 + i}"
        hosts.append(dataclasses.replace(host, address=address, port=port))
        pairs.append(((address, port), (host.address, host.port)))
        key = run.testbed.common.host_key_path(host).with_suffix(".pub").read_text().split()
        lines.append(f"[{address}]:{port} {key[0]} {key[1]}\n")
    with open(bed.tb.known_hosts, "a") as fh:
        fh.writelines(lines)
    work.mkdir(parents=True, exist_ok=True)
    return Bed(dataclasses.replace(bed.tb, hosts=tuple(hosts)), work, bed.host_python, bed.originals), pairs


def serial_ssh_script(bed: Bed, n: int) -> Path:
    """`ssh host true` on each of the first n hosts, one after the other."""
    path = bed.work / f"floor-serial-{n}.sh"
    if not path.exists():
        lines = ["#!/bin/bash", "set -e"]
        for h in bed.hosts[:n]:  # each host's start and end on stdout
            lines.append("s=$(date +%s.%N); " + " ".join(shlex.quote(w) for w in bed.ssh_argv(h) + ["true"])
                         + '; echo "$s $(date +%s.%N)"')
        path.write_text("\n".join(lines) + "\n")
    return path


def fleet_tools(runner: Runner, *, forks: int | None, serial: bool, only: set[str] | None = None) -> list[Tool]:
    """The rows: the ssh-true floor, the Fabric one-liner, and ddops' five commands with and without a resident."""
    bed, d = runner.bed, runner.ddops
    by_key = {t.key: t for t in runner.tools}
    fork_words = ["--forks", str(forks)] if forks else []
    tools = []
    floor = by_key["floor"]
    if serial:
        floor = dataclasses.replace(floor, argv=lambda n: ["bash", str(serial_ssh_script(bed, n))],
                                    verify=per_host_from(None, lambda out: [float(e) - float(s) for s, e in
                                                                             map(str.split, out.splitlines())]))
    tools.append(floor)
    if "fabric" in by_key:
        fabric = by_key["fabric"]
        if serial:
            fabric = dataclasses.replace(fabric, argv=(lambda a: lambda n: a(n) + ["--serial"])(fabric.argv),
                                         verify=per_host_from(fabric.verify,
                                                              lambda out: json.loads(out)["per_host_s"]))
        tools.append(fabric)
    commands = {"ddops-cold": ["patch", PLAYBOOK], "ddops": ["patch", PLAYBOOK], "ddops-rerun": ["patch", PLAYBOOK],
                "ddops-check": ["patch", PLAYBOOK, "--check"], "ddops-rollback": ["rollback", "--yes"]}
    for resident in (True, False):
        for key, words in commands.items():
            base = by_key[key]

            def argv(n: int, words: list[str] = words, resident: bool = resident) -> list[str]:
                return d + ["-i", str(bed.ddops_inventory(n, resident=resident)), *fork_words, *words, "--all",
                            "--json"]

            tools.append(dataclasses.replace(base, key=key if resident else f"{key}-fresh", argv=argv,
                                             verify=per_host_from(base.verify, lambda out: [
                                                 h["elapsed_s"] for h in json.loads(out)["hosts"]]),
                                             label=base.label if resident else base.label + " (no resident)"))
    if only:
        tools = [t for t in tools if t.key in only]
    return tools


def per_host_from(verify: Callable[[int, Sample, str], bool] | None,
                  parse: Callable[[str], list[float]]) -> Callable[[int, Sample, str], bool]:
    """The tool's own check, plus each host's time as the tool saw it (connect to last answer) into the sample."""
    def check(n: int, sample: Sample, out: str) -> bool:
        sample.extra["per_host_s"] = parse(out)
        return len(sample.extra["per_host_s"]) == n and (verify is None or verify(n, sample, out))
    return check


def make_runner(bed: Bed, args: argparse.Namespace) -> Runner:
    ns = argparse.Namespace(anchors_venv=None, only=None, baseline_repo=args.baseline_repo, this_repo=args.this_repo,
                            repeats=args.repeats, slow_repeats=1)
    return Runner(ns, bed)


# --- measuring ------------------------------------------------------------------------------------------------

def measure_rows(runner: Runner, tools: list[Tool], sizes: list[int], repeats: int,
                 proxies: DelayProxies | None) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Every tool at every size, interleaved per repeat (one warm-up each first); samples with bytes per host."""
    results: dict[str, dict[int, list[dict[str, Any]]]] = {t.key: {} for t in tools}
    top = max(sizes)  # every host warmed: page cache, plan cache, and each host's resident started
    for tool in tools:
        runner.prepare(tool, top)
        runner.run_once(tool, top, tag="warmup")
        if tool.leaves != "same":
            runner.record_state(top, tool.leaves)
    for rep in range(repeats):
        order = tools[:] if rep % 2 == 0 else tools[::-1]  # A/B order alternates: load drifts hit both alike
        for n in sizes:
            for tool in order:
                runner.prepare(tool, n)
                before = proxies.counters() if proxies else (0, 0, 0, 0)
                sample = runner.measure(tool, n, rep)
                after = proxies.counters() if proxies else (0, 0, 0, 0)
                if proxies:
                    sample.extra["bytes_up_per_host"] = (after[0] - before[0]) / n
                    sample.extra["bytes_down_per_host"] = (after[1] - before[1]) / n
                    sample.extra["connections_per_host"] = (after[2] - before[2]) / n
                    sample.extra["turns_per_host"] = (after[3] - before[3]) / n
                results[tool.key].setdefault(n, []).append(dataclasses.asdict(sample))
                flag = "" if sample.ok else f"  FAILED {sample.extra.get('error', '')}"
                log(f"  rep={rep} n={n} {tool.key:20s} {sample.wall:7.3f}s cpu={sample.cpu:6.2f}s{flag}")
    return results


def start_bed(count: int, host_python: str) -> tuple[Bed, Path]:
    work = Path(tempfile.mkdtemp(prefix="ddops-fleet-speed-"))
    seed = work / "seed"
    originals = run.write_seed(seed)
    prefix = f"127.{random.randint(60, 99)}.{random.randint(1, 250)}."
    log(f"fleet mode: {count} testbed hosts on {prefix}2.., work dir {work}")
    tb = run.testbed.up(count, root=work / "testbed", seed=seed, address_prefix=prefix, python=host_python)
    run.precompile()
    return Bed(tb, work, host_python, originals), work


def stop_bed(bed: Bed, work: Path) -> None:
    run.testbed.down(bed.tb.root)
    shutil.rmtree(work, ignore_errors=True)


def mode_latency(args: argparse.Namespace) -> dict[str, Any]:
    bed, work = start_bed(4, args.host_python)
    out: dict[str, Any] = {"rtts_ms": args.rtts, "sizes": [1, 4], "repeats": args.repeats,
                           "load_start": run.load_text()}
    try:
        port = random.randint(20000, 40000)
        for rtt in args.rtts:
            view, pairs = proxied_bed(bed, work / f"rtt{rtt:g}", port)
            with DelayProxies(pairs, rtt / 1000, lifetime=1800) as proxies:
                runner = make_runner(view, args)
                tools = fleet_tools(runner, forks=1, serial=True, only=args.only)
                log(f"== RTT {rtt:g} ms, load {run.load_text()}")
                out[f"{rtt:g}"] = measure_rows(runner, tools, [1, 4], args.repeats, proxies)
            port += 1
    finally:
        stop_bed(bed, work)
    out["load_end"] = run.load_text()
    return out


def split_cores(bed: Bed, tools: list[Tool]) -> tuple[list[Tool], dict[str, list[int]] | None]:
    """The controller on a core of its own, every testbed host on the others, as on a fleet where each host has its
    own CPUs: sharing them, the controller's CPU seconds grew with the hosts' load (its 32 threads then contend
    for the GIL while descheduled) and did not repeat (RESULTS.md's history, issue 23). New sessions and residents
    inherit their listener's affinity."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return tools, None
    controller, hosts = cores[:1], cores[1:]
    for pid in bed.listeners():
        os.sched_setaffinity(pid, hosts)
    prefix = ["taskset", "-c", ",".join(map(str, controller))]
    return [dataclasses.replace(t, argv=lambda n, argv=t.argv: prefix + argv(n)) for t in tools], \
        {"controller": controller, "hosts": hosts}


def mode_cpu(args: argparse.Namespace) -> dict[str, Any]:
    bed, work = start_bed(max(args.sizes), args.host_python)
    out: dict[str, Any] = {"sizes": args.sizes, "repeats": args.repeats, "load_start": run.load_text()}
    try:
        runner = make_runner(bed, args)
        tools = fleet_tools(runner, forks=FLEET_FORKS, serial=False, only=args.only)
        if args.baseline_repo:  # the same commands from an earlier checkout (resident on, --forks 32 by default)
            out["baseline"] = {"repo": str(args.baseline_repo), "playbook": str(run.PLAYBOOK),
                               "this": str(args.this_repo or run.REPO)}
            run.precompile(args.baseline_repo, args.this_repo)
            tools += [t for t in runner.tools if BASELINE_ROWS.get(t.key) in (args.only or BASELINE_ROWS.values())]
        tools, out["cores"] = split_cores(bed, tools)
        out["rows"] = measure_rows(runner, tools, args.sizes, args.repeats, None)
    finally:
        stop_bed(bed, work)
    out["load_end"] = run.load_text()
    return out


def mode_check(args: argparse.Namespace) -> dict[str, Any]:
    bed, work = start_bed(args.hosts, args.host_python)
    out: dict[str, Any] = {"rtt_ms": args.rtt, "hosts": args.hosts, "repeats": args.repeats,
                           "load_start": run.load_text()}
    try:
        view, pairs = proxied_bed(bed, work / "check", random.randint(20000, 40000))
        with DelayProxies(pairs, args.rtt / 1000, lifetime=1800) as proxies:
            runner = make_runner(view, args)
            tools = fleet_tools(runner, forks=FLEET_FORKS, serial=False, only=args.only)
            out["rows"] = measure_rows(runner, tools, [args.hosts], args.repeats, proxies)
    finally:
        stop_bed(bed, work)
    out["load_end"] = run.load_text()
    return out


# --- the model and the report ---------------------------------------------------------------------------------

def median_of(samples: list[dict[str, Any]], field: Callable[[dict[str, Any]], float]) -> float | None:
    good = [field(s) for s in samples if s["ok"]]
    return statistics.median(good) if good else None


def fit(rows: dict[str, list[dict[str, Any]]]) -> tuple[float, float] | None:
    """(startup, per-host latency): the median of every host's own time (connect to last answer, as the tool timed
    it) over the runs at 1 and 4 hosts one after the other, and the median of what each run spent beyond that many
    typical hosts. A cost paid once inside the first host's time (a cold plan: libcst loaded, each file content
    planned) is startup so, as it is on a fleet: once, not once per wave."""
    samples = [s for n in ("1", "4") for s in rows.get(n, []) if s["ok"] and s["extra"].get("per_host_s")]
    if not samples:
        return None
    per_host = statistics.median(t for s in samples for t in s["extra"]["per_host_s"])
    startup = statistics.median(s["wall"] - len(s["extra"]["per_host_s"]) * per_host for s in samples)
    return startup, per_host


def idle_estimate(rows: dict[str, list[dict[str, Any]]], rtt_ms: float,
                  cpu_per_host: float | None) -> tuple[float, float, float] | None:
    """(startup, per-host latency, round trips waited per host) as they would be on idle CPUs: round trips x RTT
    + the controller's and the host's CPU per host; startup: the controller's CPU less one host's. On this shared
    machine the measured latency also holds the time every process waited for a core (load), which a fleet's hosts
    do not wait; CPU seconds barely change with load."""
    one = [s for s in rows.get("1", []) if s["ok"]]
    four = [s for s in rows.get("4", []) if s["ok"]]
    if not one or not four or any("turns_per_host" not in s["extra"] for s in one + four):
        return None
    waited = statistics.median(s["extra"]["turns_per_host"] for s in one + four) / 2
    host_cpu = statistics.median(s["host_cpu"] / n for n, group in ((1, one), (4, four)) for s in group)
    if cpu_per_host is None:  # the serial runs' own marginal CPU, noisier than the cpu mode's
        cpu_per_host = max(0.0, (statistics.median(s["cpu"] for s in four)
                                 - statistics.median(s["cpu"] for s in one)) / 3)
    startup = max(0.0, statistics.median(s["cpu"] for s in one) - cpu_per_host)
    return startup, waited * rtt_ms / 1000 + cpu_per_host + host_cpu, waited


def usable_cores(key: str) -> int:
    return (os.cpu_count() or 1) if key == "floor" else 1


def model(startup: float, per_host: float, cpu: float | None, key: str, n: int = FLEET_N,
          forks: int = FLEET_FORKS) -> tuple[float, str]:
    """The modelled fleet time and what bounds it (latency or the controller's CPU)."""
    latency = startup + math.ceil(n / forks) * per_host
    if cpu is not None and cpu / usable_cores(key) > latency:
        return cpu / usable_cores(key), "controller CPU"
    return latency, "latency"


def load(name: str) -> dict[str, Any] | None:
    path = run.SAMPLES / f"fleet-{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


LABELS = {"floor": "`ssh host true` (floor)", "fabric": "Fabric one-liner", "ddops-cold": "first apply, cold plan",
          "ddops": "first apply, warm plan", "ddops-rerun": "rerun", "ddops-check": "--check",
          "ddops-rollback": "rollback"}


def label(key: str) -> str:
    fresh = key.endswith("-fresh")
    base = key[:-len("-fresh")] if fresh else key
    return LABELS.get(base, base) + (" (no resident)" if fresh else " (resident)" if base.startswith("ddops") else "")


def cpu_figures(doc: dict[str, Any] | None) -> tuple[dict[tuple[str, int], float], dict[str, float]]:
    """From a cpu run: each row's median CPU seconds at each size, and its CPU per host between the two sizes."""
    cpu_at: dict[tuple[str, int], float] = {}
    cpu_per_host: dict[str, float] = {}
    if doc is None:
        return cpu_at, cpu_per_host
    lo, hi = min(doc["sizes"]), max(doc["sizes"])
    for key, by_n in doc["rows"].items():
        for n in doc["sizes"]:
            c = median_of(by_n.get(str(n), []), lambda s: s["cpu"])
            if c is not None:
                cpu_at[(key, n)] = c
        if (key, lo) in cpu_at and (key, hi) in cpu_at and hi > lo:
            cpu_per_host[key] = (cpu_at[(key, hi)] - cpu_at[(key, lo)]) / (hi - lo)
    return cpu_at, cpu_per_host


def cpu_at_equal_wall(doc: dict[str, Any], ours: str, theirs: str) -> tuple[float, float] | None:
    """Two rows' controller CPU per host (seconds) as if each of their runs had taken the same wall time.

    On this machine a run's controller CPU grows with its wall (within a row, about 0.25-0.4 CPU s per wall s): the
    hosts share one core, so a run whose hosts work longer, or one that met a slow stretch of the machine, keeps the
    controller's threads waking for longer. On a fleet neither stretches the controller's run. So, at each size, each
    sample's CPU is moved along the slope of CPU on wall (fitted within every row of the run, pooled) to the two
    rows' mean wall, and the per-host figure is the slope of those means between the two sizes (which still holds
    the controller's cost of the walls' growth with N, alike for both rows)."""
    lo, hi = min(doc["sizes"]), max(doc["sizes"])
    adjusted: dict[tuple[str, int], float] = {}
    for n in (lo, hi):
        groups = [good for by_n in doc["rows"].values() for good in [[s for s in by_n.get(str(n), []) if s["ok"]]]
                  if len(good) > 1]
        # each sample's wall and CPU less its row's means
        deviations = [(s["wall"] - wall, s["cpu"] - cpu) for g in groups
                      for wall, cpu in [(statistics.mean(x["wall"] for x in g), statistics.mean(x["cpu"] for x in g))]
                      for s in g]
        pair = [[s for s in doc["rows"].get(k, {}).get(str(n), []) if s["ok"]] for k in (ours, theirs)]
        if not all(pair):
            return None
        spread = sum(w * w for w, _ in deviations)
        slope = sum(w * c for w, c in deviations) / spread if spread else 0.0
        common = statistics.mean(s["wall"] for samples in pair for s in samples)
        for key, samples in zip((ours, theirs), pair):
            adjusted[(key, n)] = statistics.mean(s["cpu"] - slope * (s["wall"] - common) for s in samples)
    per_host = [(adjusted[(k, hi)] - adjusted[(k, lo)]) / (hi - lo) for k in (ours, theirs)]
    return per_host[0], per_host[1]


def baseline_pair(doc: dict[str, Any]) -> list[str]:
    """The table of a cpu run with --baseline-repo: each command from this checkout and from the earlier one."""
    cpu_at, cpu_per_host = cpu_figures(doc)
    base, sizes = doc["baseline"], doc["sizes"]
    lines = [f"Against an earlier checkout ({Path(base['repo']).name}): the same hosts, both on "
             f"`{Path(base['playbook']).name}`, interleaved, resident on, cores split as above; median (min–max) of "
             f"{doc['repeats']}, {doc.get('date')}:", "",
             "| command | " + " | ".join(f"N={n}: CPU s, this / earlier" for n in sizes)
             + " | CPU per host ms, this / earlier | at equal wall | "
             + " | ".join(f"N={n}: wall s, this / earlier" for n in sizes) + " |",
             "|---|" + "---|" * (2 * len(sizes) + 2)]
    for theirs, ours in BASELINE_ROWS.items():
        cells, walls = [], []
        for n in sizes:
            spread = [f"{cpu_at[(k, n)]:.2f} ({min(v):.2f}–{max(v):.2f})" for k in (ours, theirs) if (k, n) in cpu_at
                      for v in [[s["cpu"] for s in doc["rows"][k][str(n)] if s["ok"]]]]
            cells.append(" / ".join(spread) if len(spread) == 2 else "–")
            wall = [median_of(doc["rows"].get(k, {}).get(str(n), []), lambda s: s["wall"]) for k in (ours, theirs)]
            walls.append(f"{wall[0]:.2f} / {wall[1]:.2f}" if None not in wall else "–")
        per = (cpu_per_host.get(ours), cpu_per_host.get(theirs))
        even = cpu_at_equal_wall(doc, ours, theirs)
        lines.append(f"| {LABELS[ours]} | " + " | ".join(cells) + " | "
                     + (f"{per[0] * 1000:.1f} / {per[1] * 1000:.1f}" if None not in per else "–") + " | "
                     + (f"{even[0] * 1000:.1f} / {even[1] * 1000:.1f}" if even else "–") + " | "
                     + " | ".join(walls) + " |")
    return lines + [""]


def report() -> str:
    lat, cpu, check = load("latency"), load("cpu"), load("check")
    lines = [BEGIN, "## Fleet-like mode (`fleet_mode.py`)", ""]
    if lat is None:
        return "\n".join(lines + ["(not run yet)", END])
    rtts = lat["rtts_ms"]
    keys = list(lat[f"{rtts[-1]:g}"])
    cpu_at, cpu_per_host = cpu_figures(cpu)
    runs = lat.get("runs") or [lat]
    lines += ["Per-host latency: 1 and 4 hosts worked on one after the other through the delaying proxies, each "
              "host's time as the tool timed it (connect to last answer; median over hosts and runs); startup: the "
              "rest of each run. *Idle*: the same on idle CPUs, estimated as round trips waited (the proxy counts "
              "the turns of each connection's data) × RTT + controller CPU per host + host CPU per host. "
              "Runs: " + "; ".join(f"RTT {', '.join(f'{r:g}' for r in run['rtts_ms'])} ms, {run['repeats']} "
                                    f"repeats, {run.get('date')}, load {run['load_start']} → {run['load_end']}"
                                    for run in runs) + ".", "",
              "| row | " + " | ".join(f"RTT {r:g}: startup / per host ms (idle)" for r in rtts)
              + " | round trips waited per host | agent round trips | bytes up / down per host |",
              "|---|" + "---|" * (len(rtts) + 3)]
    fits: dict[tuple[str, float], tuple[float, float]] = {}
    idle: dict[tuple[str, float], tuple[float, float, float]] = {}
    for key in keys:
        cells = []
        for r in rtts:
            rows = lat[f"{r:g}"].get(key, {})
            f, e = fit(rows), idle_estimate(rows, r, cpu_per_host.get(key))
            if f:
                fits[(key, r)] = f
            if e:
                idle[(key, r)] = e
            cells.append((f"{f[0] * 1000:.0f} / **{f[1] * 1000:.0f}**" if f else "failed")
                         + (f" ({e[1] * 1000:.0f})" if e else ""))
        top = lat[f"{rtts[-1]:g}"].get(key, {}).get("4", [])
        rts = sorted({x for s in top if s["ok"] for x in (s["round_trips"] or [])})
        up = median_of(top, lambda s: s["extra"].get("bytes_up_per_host", 0))
        down = median_of(top, lambda s: s["extra"].get("bytes_down_per_host", 0))
        waited = idle.get((key, rtts[-1]), (0, 0, None))[2]
        lines.append(f"| {label(key)} | " + " | ".join(cells) + f" | {'–' if waited is None else f'{waited:.1f}'} | "
                     f"{run.fmt_rt(rts) if rts else '–'} | {(up or 0) / 1000:.1f} kB / {(down or 0) / 1000:.1f} kB |")
    lines.append("")
    if cpu is not None:
        sizes = cpu["sizes"]
        cores = cpu.get("cores")
        where = (f"the command on core {','.join(map(str, cores['controller']))}, every host on core "
                 f"{','.join(map(str, cores['hosts']))}" if cores else "the command and the hosts sharing every core")
        lines += [f"Controller CPU (user+system seconds of the command's process tree; no proxies, `--forks "
                  f"{FLEET_FORKS}`, {where}; median (min–max) of {cpu['repeats']}, {cpu.get('date')}; load "
                  f"{cpu['load_start']} → {cpu['load_end']}):", "",
                  "| row | " + " | ".join(f"N={n}: CPU s (min–max); wall s" for n in sizes) + " | CPU per host ms |",
                  "|---|" + "---|" * (len(sizes) + 1)]
        for key in keys:
            by_n = cpu["rows"].get(key, {})
            cells = []
            for n in sizes:
                good = [s for s in by_n.get(str(n), []) if s["ok"]]
                w = median_of(good, lambda s: s["wall"])
                cells.append(f"{cpu_at[(key, n)]:.2f} ({min(s['cpu'] for s in good):.2f}–"
                             f"{max(s['cpu'] for s in good):.2f}); {w:.2f}" if (key, n) in cpu_at else "–")
            per = cpu_per_host.get(key)
            lines.append(f"| {label(key)} | " + " | ".join(cells)
                         + f" | {'–' if per is None else f'{per * 1000:.1f}'} |")
        lines.append("")
        if (pair := load("cpu-baseline")) is not None:
            lines += baseline_pair(pair)
    top_rtt = max(rtts)
    waves = math.ceil(FLEET_N / FLEET_FORKS)
    lines += [f"Modelled N={FLEET_N}, `--forks {FLEET_FORKS}`, RTT {top_rtt:g} ms: max(startup + {waves} waves × "
              f"per-host latency, controller CPU at N={FLEET_N} / usable cores: 1 for a Python process, "
              f"{os.cpu_count()} for the ssh fan-out), from the measured latency and from the idle estimate.", "",
              "| row | measured: s (bound) | / floor | idle: s (bound) | / floor |", "|---|---|---|---|---|"]
    models: dict[str, tuple[float, float | None]] = {}
    for key in keys:
        f, e = fits.get((key, top_rtt)), idle.get((key, top_rtt))
        if not f:
            continue
        c = cpu_at.get((key, FLEET_N))
        t, bound = model(f[0], f[1], c, key)
        te, bound_e = model(e[0], e[1], c, key) if e else (None, None)
        models[key] = (t, te)
    floor_t, floor_e = models.get("floor", (None, None))
    for key, (t, te) in models.items():
        f, e = fits[(key, top_rtt)], idle.get((key, top_rtt))
        bound = model(f[0], f[1], cpu_at.get((key, FLEET_N)), key)[1]
        bound_e = model(e[0], e[1], cpu_at.get((key, FLEET_N)), key)[1] if e else ""
        lines.append(f"| {label(key)} | **{t:.2f}** ({bound}) | {f'{t / floor_t:.2f}×' if floor_t else '–'} | "
                     + (f"**{te:.2f}** ({bound_e}) | {f'{te / floor_e:.2f}×' if floor_e else '–'} |"
                        if te else "– | – |"))
    lines.append("")
    for key in ("ddops", "ddops-rerun"):
        if key in models and f"{key}-fresh" in models:
            with_, without = models[key], models[f"{key}-fresh"]
            parts = [f"{name}: {abs(1 - a / b) * 100:.0f}% {'shorter' if a <= b else 'longer'}" for name, a, b in
                     (("measured", with_[0], without[0]), ("idle", with_[1], without[1])) if a and b]
            lines.append(f"- The resident makes the modelled N={FLEET_N} {LABELS[key]} " + ", ".join(parts) + ".")
    lines.append("")
    if check is not None:
        n = check["hosts"]
        lines += [f"The model against a real run: N={n} hosts at once through the proxies at RTT {check['rtt_ms']:g} "
                  f"ms (`--forks {FLEET_FORKS}`, median of {check['repeats']}, {check.get('date')}, load "
                  f"{check['load_start']} → {check['load_end']}). Here the {n} hosts share the controller's "
                  f"{os.cpu_count()} cores, as no fleet's do; the model takes the controller CPU of this run:", "",
                  "| row | measured wall s | host CPU s | modelled s (measured / idle latency) | measured / modelled |",
                  "|---|---|---|---|---|"]
        for key in keys:
            samples = check["rows"].get(key, {}).get(str(n), [])
            w, c = median_of(samples, lambda s: s["wall"]), median_of(samples, lambda s: s["cpu"])
            h = median_of(samples, lambda s: s["host_cpu"])
            f, e = fits.get((key, check["rtt_ms"])), idle.get((key, check["rtt_ms"]))
            if w is None or not f:
                continue
            t = model(f[0], f[1], c, key, n=n)[0]
            te = model(e[0], e[1], c, key, n=n)[0] if e else None
            lines.append(f"| {label(key)} | {w:.2f} | {h:.2f} | {t:.2f} / {'–' if te is None else f'{te:.2f}'} | "
                         f"{w / t:.2f}× / {'–' if te is None else f'{w / te:.2f}×'} |")
        lines.append("")
    return "\n".join(lines + [END])


def write_report() -> None:
    path = HERE / "RESULTS.md"
    text = path.read_text()
    section = report()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        marker = "## Notes"
        head, tail = text.split(marker, 1) if marker in text else (text, "")
        text = head + section + "\n\n" + (marker + tail if tail else "")
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["latency", "cpu", "check", "report"])
    p.add_argument("--rtts", default="0,5,20", help="latency: round trips in ms (default 0,5,20).")
    p.add_argument("--rtt", type=float, default=20.0, help="check: the round trip in ms (default 20).")
    p.add_argument("--sizes", default=f"32,{FLEET_N}", help=f"cpu: host counts (default 32,{FLEET_N}).")
    p.add_argument("--hosts", type=int, default=32, help="check: hosts at once (default 32).")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--only", help="rows, comma-separated (default all).")
    p.add_argument("--baseline-repo", type=Path, help="cpu: also time first apply (cold and warm), rerun, --check "
                   "and rollback from this checkout (e.g. a git worktree of an earlier commit).")
    p.add_argument("--this-repo", type=Path, help="cpu, with --baseline-repo: the pair's first slot from this "
                   "checkout, not the harness's own (what a commit bought: the commit here, its parent as baseline).")
    p.add_argument("--playbook", help=f"the playbook every ddops row applies (default {PLAYBOOK}); a file, for a pair "
                   "of checkouts whose built-in playbooks differ.")
    p.add_argument("--host-python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists()
                   else sys.executable)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still takes its testbed down
    args.rtts = [float(x) for x in args.rtts.split(",")]
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.only = set(args.only.split(",")) if args.only else None
    if args.this_repo and not args.baseline_repo:
        p.error("--this-repo: a pair's first slot, so it needs --baseline-repo")
    if args.playbook:
        use_playbook(str(Path(args.playbook).resolve()))
    if args.mode == "report":
        write_report()
        return 0
    started = time.monotonic()
    result = {"latency": mode_latency, "cpu": mode_cpu, "check": mode_check}[args.mode](args)
    result["duration_s"] = time.monotonic() - started
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.mode == "latency" and (earlier := load("latency")) is not None:
        # RTTs measured in an earlier run are kept unless measured again (each run stays a few minutes)
        kept = [r for r in earlier["rtts_ms"] if r not in args.rtts]
        result = {**{f"{r:g}": earlier[f"{r:g}"] for r in kept}, **result,
                  "rtts_ms": sorted(kept + args.rtts), "runs": earlier.get("runs", [earlier_meta(earlier)])
                  + [earlier_meta(result)]}
    name = "cpu-baseline" if args.mode == "cpu" and args.baseline_repo else args.mode  # the pair: a file of its own
    run.SAMPLES.mkdir(parents=True, exist_ok=True)
    (run.SAMPLES / f"fleet-{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    write_report()
    failed = [k for k, v in result.items() if isinstance(v, dict) for s in _samples(v) if not s["ok"]]
    log(f"wrote fleet-{name}.json and RESULTS.md's fleet section in {result['duration_s']:.0f}s"
        + (f"; failures: {sorted(set(failed))}" if failed else ""))
    return 1 if failed else 0


def use_playbook(path: str) -> None:
    global PLAYBOOK
    PLAYBOOK = run.PLAYBOOK = path


def earlier_meta(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc.get(k) for k in ("rtts_ms", "repeats", "date", "load_start", "load_end")}


def _samples(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, list):
        return [s for s in doc if isinstance(s, dict) and "ok" in s]
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in _samples(v)]
    return []


if __name__ == "__main__":
    sys.exit(main())
