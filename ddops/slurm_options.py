"""A host's `executor` and `slurm:` inventory settings: their values and validation (the inventory reads them;
ddops/bench/slurm.py builds a job array from them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

EXECUTORS = ("bare", "slurm")
# Keys of an inventory `slurm:` mapping and their types.
SLURM_KEYS: dict[str, type | tuple[type, ...]] = {
    "partition": str,
    "gres": str,
    "time": (str, int),
    "account": str,
    "qos": str,
    "constraint": str,
    "nodes": (str, int),
    "extra": list,
    "conf": str,
}
# sbatch options ddops sets itself for every run: an `extra` that set them would break the run's bookkeeping.
MANAGED_OPTIONS = ("--array", "-a", "--output", "-o", "--error", "-e", "--job-name", "-J", "--chdir", "-D",
                   "--wrap", "--parsable", "--open-mode", "--export")
_TIME = re.compile(r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2}"
                   r"|UNLIMITED|INFINITE)\Z")
_GRES = re.compile(r"[A-Za-z][A-Za-z0-9_]*(:[A-Za-z0-9_.-]+)*(,[A-Za-z][A-Za-z0-9_]*(:[A-Za-z0-9_.-]+)*)*\Z")
_WORD = re.compile(r"[A-Za-z0-9_.,:@+=/&|!()\[\]*-]+\Z")


@dataclass(frozen=True, slots=True)
class SlurmOptions:
    """A host's `slurm:` settings, resolved (host > groups > defaults, key by key)."""

    partition: str | None = None
    gres: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    nodes: str | None = None
    extra: tuple[str, ...] = ()
    conf: str | None = None  # a slurm.conf other than the cluster's default (SLURM_CONF for every Slurm command)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SlurmOptions":
        def text(key: str) -> str | None:
            value = values.get(key)
            return None if value is None else str(value)

        return cls(partition=text("partition"), gres=text("gres"), time=text("time"), account=text("account"),
                   qos=text("qos"), constraint=text("constraint"), nodes=text("nodes"),
                   extra=tuple(values.get("extra") or ()), conf=text("conf"))


def slurm_option_problems(values: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """(sub-keypath, message) for every bad value of a `slurm:` mapping (types are checked by the caller)."""
    problems: list[tuple[tuple[Any, ...], str]] = []
    for key in ("partition", "account", "qos", "constraint", "nodes"):
        value = values.get(key)
        if value is not None and not _WORD.match(str(value)):
            problems.append(((key,), f"{str(value)!r} is not a plain Slurm value (no spaces, quotes or newlines)"))
    if values.get("nodes") is not None and isinstance(values["nodes"], int) and values["nodes"] < 1:
        problems.append((("nodes",), "must be at least 1"))
    gres = values.get("gres")
    if gres is not None and not _GRES.match(gres):
        problems.append((("gres",), f"{gres!r} is not a Slurm gres (like gpu:1 or gpu:h200:2)"))
    time = values.get("time")
    if time is not None:
        if isinstance(time, int):
            if time < 1:
                problems.append((("time",), "must be at least 1 minute"))
        elif not _TIME.match(time):
            problems.append((("time",), f"{time!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, "
                                        "D-HH:MM or D-HH:MM:SS)"))
    conf = values.get("conf")
    if conf is not None and (not conf.startswith(("/", "~")) or any(c in conf for c in "\n\0")):
        problems.append((("conf",), "must be an absolute path to a slurm.conf"))
    for i, option in enumerate(values.get("extra") or ()):
        if not isinstance(option, str) or not option.startswith("-") or any(c in option for c in "\n\0"):
            problems.append((("extra", i), "must be an sbatch option, like --mem=64G"))
            continue
        name = option.split("=", 1)[0]
        short = None if option.startswith("--") else option[:2]  # -a0-3, -o out: a short option and its value
        if name in MANAGED_OPTIONS or short in MANAGED_OPTIONS:
            name = name if name in MANAGED_OPTIONS else short
            problems.append((("extra", i), f"{name} is set by ddops for every run (one array task per run)"))
    return problems
