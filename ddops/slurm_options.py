"""A host's `executor` and `slurm:` inventory settings: their values and validation (the inventory reads them;
ddops/bench/slurm.py builds a job array from them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
MANAGED_LONG = ("array", "output", "error", "job-name", "chdir", "wrap", "parsable", "open-mode", "export")
MANAGED_SHORT = "aoeJD"
# sbatch's short options that take a value (sbatch --help, Slurm 22.05): in a cluster like `-Qo/x` the first of
# them takes the rest of the word as its value, so the letters after it are not options.
_SHORT_WITH_VALUE = "aAbcCdDeFGiJLmMnNopqStwxB"
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
    def from_mapping(cls, values: Mapping[str, Any]) -> SlurmOptions:
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
        managed = managed_option(option)
        if managed:
            word = option.split("=", 1)[0]
            said = f"{word} is set" if word == managed else f"{word} means {managed} to sbatch, which is set"
            problems.append((("extra", i), f"{said} by ddops for every run (one array task per run)"))
    return problems


def managed_option(option: str) -> str | None:
    """The ddops-managed sbatch option this word would set, as sbatch parses it, else None.

    sbatch reads options with getopt_long: a long option may be abbreviated to any prefix (`--arr=` is
    `--array=`; an ambiguous prefix is an error, which is refused here too), and short options cluster
    (`-Qo/x` is `-Q -o /x`)."""
    if option == "--":
        return "the end of sbatch's options"
    if option.startswith("--"):
        name = option[2:].split("=", 1)[0]
        hits = [m for m in MANAGED_LONG if m.startswith(name)]
        return " or ".join(f"--{m}" for m in hits) or None
    for letter in option[1:]:
        if letter in MANAGED_SHORT:
            return f"-{letter}"
        if letter in _SHORT_WITH_VALUE:  # the rest of the word is this option's value
            return None
    return None
