"""A host's Python environment against what a launch needs: the packages a bench plan requires (PEP 440 ranges,
refused when unmet) and the transformers releases the hybrid playbooks were tested with (untested: a warning).
Pure; the versions come from the agent (importlib.metadata on the host, with the plan's Python)."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ddops.errors import PlaybookError
from ddops.resources import playbooks_dir
from ddops.yamlsrc import load_yaml_file

# The playbooks whose patches reach into transformers' hybrid-model internals: what the support matrix is about.
HYBRID_PLAYBOOKS = ("hybrid-cache", "crop-relative", "hybrid-tree-verify")
SUPPORT_FILE = "hybrid-support.yaml"
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?\Z")


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them: `Flash_Linear.Attention` -> `flash-linear-attention`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_error(name: Any, spec: Any) -> str | None:
    """Why `name: spec` is no package requirement (None when it is one): a distribution name and a PEP 440 range
    such as `>=5.16,<5.25`, or nothing for any version."""
    if not isinstance(name, str) or not _NAME.match(name):
        return "must be a distribution name (like transformers)"
    if spec is None:
        return None
    if not isinstance(spec, str):
        return "must be a version range like '>=2.4,<3' (quoted), or nothing for any version"
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        return f"{spec!r} is not a version range (write it as '>=2.4,<3')"
    return None


def unmet(requirements: Iterable[tuple[str, str]], versions: Mapping[str, str | None], python: str) -> list[str]:
    """One line per requirement the host's versions do not meet: `transformers 5.25.0, plan needs >=5.16,<5.25 (with
    python3: python3 -m pip install 'transformers>=5.16,<5.25')`."""
    found = {canonical(k): v for k, v in versions.items()}
    lines = []
    for name, spec in requirements:
        have = found.get(canonical(name))
        wanted = SpecifierSet(spec or "")
        if have is not None and _within(have, wanted):
            continue
        needs = f"plan needs {spec}" if spec else "plan needs it"
        what = f"{name} {have}" if have is not None else f"{name} is not installed"
        lines.append(f"{what}, {needs} (install it for {python}: "
                     f"{shlex.quote(python)} -m pip install {shlex.quote(name + (spec or ''))})")
    return lines


def _within(version: str, wanted: SpecifierSet) -> bool:
    try:
        return wanted.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


@dataclass(frozen=True, slots=True)
class Support:
    """The transformers releases the hybrid playbooks' matrix ran (playbooks/hybrid-support.yaml): those it proved
    supported, oldest first, and those it proved not to be, with why."""

    releases: tuple[str, ...]
    playbooks: tuple[str, ...] = HYBRID_PLAYBOOKS
    unsupported: tuple[tuple[str, str], ...] = ()  # (version, why)

    def verdict(self, version: str | None) -> tuple[bool, str]:
        """(covered, words): `transformers 5.24.0 (tested)`, `5.17.2 (its release line is tested: 5.17.0)`,
        `5.3.0 (not supported by the hybrid playbooks: why)`, `5.26.0 (untested: the hybrid playbooks are tested
        with 5.2.0-5.25.0)`."""
        if version is None:
            return False, "transformers is not installed"
        line = _line(version)
        for known, why in self.unsupported:
            if known == version or (line is not None and _line(known) == line):
                return False, f"transformers {version} (not supported by the hybrid playbooks: {why})"
        if version in self.releases:
            return True, f"transformers {version} (tested)"
        same = [r for r in self.releases if line is not None and _line(r) == line]
        if same:
            return True, f"transformers {version} (its release line is tested: {', '.join(same)})"
        span = f"{self.releases[0]}-{self.releases[-1]}" if self.releases else "no release"
        return False, f"transformers {version} (untested: the hybrid playbooks are tested with {span})"


def _line(version: str) -> tuple[int, ...] | None:
    try:
        return Version(version).release[:2]
    except InvalidVersion:
        return None


@functools.lru_cache(maxsize=1)
def hybrid_support() -> Support | None:
    """The hybrid playbooks' support matrix, from the one file that lists it (`transformers:` entries with
    `version`, `supported` and, where not, `why`); None where no such file ships."""
    path = playbooks_dir() / SUPPORT_FILE
    if not path.is_file():
        return None
    data = load_yaml_file(path, PlaybookError).data or {}
    entries = [e for e in (data.get("transformers") if isinstance(data, dict) else None) or []
               if isinstance(e, dict) and e.get("version")]
    if not entries:
        raise PlaybookError(f"{path}: lists no transformers release under `transformers:`")
    supported = sorted((str(e["version"]) for e in entries if e.get("supported", True)), key=Version)
    refused = tuple((str(e["version"]), " ".join(str(e.get("why") or "the matrix says so").split()))
                    for e in entries if not e.get("supported", True))
    return Support(tuple(supported), tuple(data.get("playbooks") or HYBRID_PLAYBOOKS), refused)


def support_for(playbook_names: Iterable[str], support: Support | None = None) -> Support | None:
    """The support matrix where one of these playbooks is a hybrid playbook it covers; None otherwise."""
    support = support if support is not None else hybrid_support()
    if support is None or not set(playbook_names) & set(support.playbooks):
        return None
    return support


def transformers_verdict(playbook_names: Iterable[str], versions: Mapping[str, str | None],
                         support: Support | None = None) -> tuple[bool, str] | None:
    """(covered, words) about the host's transformers where hybrid playbooks are involved; None where none is, or
    no matrix is known. Not covered is a warning, never a refusal: untested is not known to fail."""
    support = support_for(playbook_names, support)
    return None if support is None else support.verdict(versions.get("transformers"))


def host_versions(facts: Mapping[str, Any] | None) -> dict[str, str | None]:
    """What `ping` and `status -v` show of a host's Python environment: python, torch and its CUDA, transformers."""
    facts = facts or {}
    versions = facts.get("versions") or {}
    return {"python": facts.get("python"), "torch": versions.get("torch"), "torch_cuda": facts.get("torch_cuda"),
            "transformers": versions.get("transformers")}


def torch_cell(versions: Mapping[str, str | None]) -> str:
    """`2.5.1+cu124 (CUDA 12.4)`, `2.13.0+cpu (no CUDA)`, or `-` without torch."""
    torch = versions.get("torch")
    if not torch:
        return "-"
    cuda = versions.get("torch_cuda")
    return f"{torch} (CUDA {cuda})" if cuda else f"{torch} (no CUDA)"
