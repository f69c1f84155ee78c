"""`ddops ping`'s per-host task: facts (GPU health included), round-trip time, and the login shell's own cost."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ddops.bench.environment import host_versions, torch_cell
from ddops.bench.gpus import gpu_issues, gpu_summary, gpus_of
from ddops.fleet import OK, TaskOutcome
from ddops.inventory import Host

# How long the login shell takes before running a command: with the rc files vs without (bash only).
SHELL_PROBE = (
    's=$(date +%s%N); SHLVL=0 "$SHELL" -c true </dev/null >/dev/null 2>&1; m=$(date +%s%N); '
    'case "$SHELL" in *bash) "$SHELL" --norc --noprofile -c true </dev/null >/dev/null 2>&1;; esac; '
    'e=$(date +%s%N); echo "$((m-s)) $((e-m))"'
)


@dataclass(frozen=True, slots=True)
class PingReport:
    """What ping measured on one host (seconds), and the host's facts (the agent's `facts` verb) beside them."""

    rtt_s: float
    shell_rc_overhead_s: float | None
    facts: Mapping[str, Any]
    gpu_issues: tuple[str, ...] = ()  # each GPU's trouble (ddops/bench/gpus.py), one line each

    def to_json(self) -> dict[str, Any]:
        return {"rtt_s": self.rtt_s, "shell_rc_overhead_s": self.shell_rc_overhead_s, **self.facts,
                "gpu_issues": list(self.gpu_issues)}

    @property
    def hostname(self) -> str:
        return str(self.facts.get("hostname") or "")

    @property
    def disk_free_gib(self) -> float | None:
        disk = self.facts.get("disk_free_bytes")
        return disk / 2**30 if isinstance(disk, (int, float)) else None

    @property
    def environment(self) -> tuple[str, str, str, str, str, str]:
        """What ping shows of the host's software and hardware: OS, python, torch (its CUDA), transformers, GPUs,
        and the GPU driver with the CUDA it supports."""
        versions = host_versions(self.facts)
        gpus = gpus_of(self.facts)
        driver = gpus[0].driver_version if gpus else None
        cuda = self.facts.get("cuda_driver")
        return (str(self.facts.get("os") or ""), str(self.facts.get("python") or ""), torch_cell(versions),
                versions.get("transformers") or "-", gpu_summary(self.facts),
                (f"{driver}" + (f" (CUDA {cuda})" if cuda else "")) if driver else "-")


def ping_task(host: Host, session: Any) -> TaskOutcome:
    """Task: the host's facts, the round-trip time of a command and what its login shell's rc files cost; each GPU's
    health (busy, ECC errors, Xid events, throttled, unlike its siblings) in the message."""
    facts = session.call_agent("facts", {"repo": host.repo, "gpu_health": True})
    # Timed on a channel opened after the first: the first one on a connection pays a one-off setup delay.
    rtt = session.run("true", timeout=host.connect_timeout).duration
    probe = session.run(SHELL_PROBE, timeout=host.connect_timeout)
    overhead = None
    with suppress(ValueError):
        with_rc, without_rc = (int(x) / 1e9 for x in probe.stdout.split())
        overhead = max(0.0, with_rc - without_rc) if without_rc else None
    issues = tuple(str(i) for i in gpu_issues(facts))
    report = PingReport(round(rtt, 4), None if overhead is None else round(overhead, 4), facts, issues)
    # Facts only in the message, never a measure (the rc files' cost has its column): hosts alike must read alike.
    notes = [*issues, *([str(facts["gpu_error"])] if facts.get("gpu_error") else [])]
    return TaskOutcome(OK, "; ".join(notes), report)
