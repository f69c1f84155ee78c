"""A host's GPUs as its facts describe them (ddops_agent/gpus.py parses nvidia-smi), and what makes one unfit for
a benchmark: busy, uncorrected ECC errors, Xid events, throttled, or unlike its siblings. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ddops.strenum import StrEnum

# Memory in use with no process listed (another container's, say) or compute in use: past these a GPU is busy.
BUSY_MEMORY_MIB = 1024
BUSY_UTILIZATION_PCT = 10
# The clock-event reasons (NVML's bitmask) that slow a GPU down; idle, application clocks, sync boost and display
# clocks are no fault.
SLOWDOWNS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
             0x40: "hardware thermal slowdown", 0x80: "power brake"}


class Issue(StrEnum):
    BUSY = "busy"
    ECC = "ecc"
    XID = "xid"
    THROTTLED = "throttled"
    UNLIKE = "unlike siblings"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU's state, as nvidia-smi reported it (None: not reported)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    driver_version: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    clocks_sm_mhz: int | None = None
    clocks_mem_mhz: int | None = None
    clocks_max_sm_mhz: int | None = None
    pstate: str | None = None
    ecc_uncorrected: int | None = None
    clock_event_reasons: int | None = None

    @classmethod
    def from_fact(cls, position: int, fact: Mapping[str, Any]) -> Gpu:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in fact.items() if k in known and v is not None}
        return cls(**{**values, "index": values.get("index", position)})

    @property
    def kind(self) -> tuple[Any, ...]:
        """What siblings should share: model, memory and driver."""
        return (self.name, self.memory_total_mib, self.driver_version)

    @property
    def slowdowns(self) -> list[str]:
        reasons = self.clock_event_reasons or 0
        return [what for bit, what in SLOWDOWNS.items() if reasons & bit]

    def state(self) -> dict[str, Any]:
        """What a benchmark's numbers depend on, for the manifest: clocks, temperature, power, memory, driver."""
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "driver": self.driver_version,
                "memory_total_mib": self.memory_total_mib, "memory_used_mib": self.memory_used_mib,
                "clocks_sm_mhz": self.clocks_sm_mhz, "clocks_max_sm_mhz": self.clocks_max_sm_mhz,
                "clocks_mem_mhz": self.clocks_mem_mhz, "temperature_c": self.temperature_c,
                "power_draw_w": self.power_draw_w, "power_limit_w": self.power_limit_w, "pstate": self.pstate,
                "slowdowns": self.slowdowns}


@dataclass(frozen=True, slots=True)
class GpuIssue:
    """One thing wrong with one GPU (gpu None: the host's GPUs as a whole)."""

    gpu: int | None
    issue: Issue
    detail: str

    def __str__(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else "GPUs"
        return f"{where} {self.issue}: {self.detail}"


def gpus_of(facts: Mapping[str, Any]) -> list[Gpu]:
    return [Gpu.from_fact(i, g) for i, g in enumerate(facts.get("gpus") or []) if isinstance(g, Mapping)]


def _mib(value: int) -> str:
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value} MiB"


def _busy(gpu: Gpu, processes: Sequence[Mapping[str, Any]]) -> str | None:
    mine = [p for p in processes if gpu.uuid and p.get("gpu_uuid") == gpu.uuid]
    if mine:
        shown = ", ".join(f"pid {p.get('pid')} {p.get('name') or '?'}"
                          + (f" ({_mib(p['used_memory_mib'])})" if p.get("used_memory_mib") else "") for p in mine[:3])
        return shown + (f" and {len(mine) - 3} more" if len(mine) > 3 else "")
    used, util = gpu.memory_used_mib or 0, gpu.utilization_pct or 0
    if used > BUSY_MEMORY_MIB:
        return f"{_mib(used)} in use by a process nvidia-smi does not list (another container?)"
    if util > BUSY_UTILIZATION_PCT:
        return f"{util}% utilised by a process nvidia-smi does not list"
    return None


def _bus(bus_id: str | None) -> str:
    """`00000000:4E:00.0` and an Xid's `0000:4e:00` as the same key: bus and device, lower case."""
    parts = (bus_id or "").lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else ""


def gpu_issues(facts: Mapping[str, Any]) -> list[GpuIssue]:
    """Every issue of the host's GPUs, GPU by GPU (empty: all fit, or no GPU)."""
    gpus = gpus_of(facts)
    processes = facts.get("gpu_processes") or []
    xids = facts.get("xid_events") or []
    kinds: dict[tuple[Any, ...], list[Gpu]] = {}
    for gpu in gpus:
        kinds.setdefault(gpu.kind, []).append(gpu)
    ranked = sorted(kinds.values(), key=len, reverse=True)
    # The kind most GPUs share, when one does; otherwise the host as a whole is reported.
    common = ranked[0][0] if len(ranked) == 1 or (len(ranked) > 1 and len(ranked[0]) > len(ranked[1])) else None
    issues: list[GpuIssue] = []
    for gpu in gpus:
        busy = _busy(gpu, processes)
        if busy:
            issues.append(GpuIssue(gpu.index, Issue.BUSY, busy))
        if gpu.ecc_uncorrected:
            plural = "s" if gpu.ecc_uncorrected != 1 else ""
            issues.append(GpuIssue(gpu.index, Issue.ECC,
                                   f"{gpu.ecc_uncorrected} uncorrected ECC error{plural} since the driver loaded"))
        mine = [x for x in xids if _bus(x.get("bus_id")) and _bus(x.get("bus_id")) == _bus(gpu.bus_id)]
        if mine:
            last = mine[-1]
            age = f", {_age(last['age_s'])} ago" if last.get("age_s") is not None else ""
            codes = ", ".join(dict.fromkeys(str(x.get("xid")) for x in mine))
            issues.append(GpuIssue(gpu.index, Issue.XID, f"Xid {codes} in the kernel log since boot "
                                                         f"(last{age}: {last.get('detail') or '-'})"))
        if gpu.slowdowns:
            issues.append(GpuIssue(gpu.index, Issue.THROTTLED, ", ".join(gpu.slowdowns)
                                   + (f" at {gpu.temperature_c} C" if gpu.temperature_c is not None else "")))
        if common is not None and gpu.kind != common.kind:
            issues.append(GpuIssue(gpu.index, Issue.UNLIKE, f"{_describe(gpu)}; its siblings: {_describe(common)}"))
    if common is None and len(kinds) > 1:
        issues.append(GpuIssue(None, Issue.UNLIKE, "; ".join(f"{len(v)}x {_describe(v[0])}" for v in ranked)))
    return issues


def _describe(gpu: Gpu) -> str:
    memory = f" {_mib(gpu.memory_total_mib)}" if gpu.memory_total_mib else ""
    return f"{gpu.name or '?'}{memory}, driver {gpu.driver_version or '?'}"


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def gpu_summary(facts: Mapping[str, Any]) -> str:
    """`8x NVIDIA H100 80GB HBM3`, or each model with its count when they differ; `no GPU`."""
    gpus = gpus_of(facts)
    if not gpus:
        return "no GPU"
    counts = Counter(gpu.name or "?" for gpu in gpus)
    return ", ".join(f"{n}x {name}" for name, n in counts.items())


def gpu_state(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The GPUs' state at launch, for the manifest: per GPU clocks, temperature, power, memory; the driver, its
    CUDA and torch's; and what was wrong with them (a launch that --allow-busy-gpus let through)."""
    return {"gpus": [g.state() for g in gpus_of(facts)], "cuda_driver": facts.get("cuda_driver"),
            "torch_cuda": facts.get("torch_cuda"), "issues": [str(i) for i in gpu_issues(facts)]}
