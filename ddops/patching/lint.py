"""`ddops playbook lint`: a playbook tried against a sample of the file it patches, without a host.

Pure: the planner's own plan_file and the pure checks on bytes the caller read. A sample passes when every patch
finds its sites (pending, applied or partial), the checks hold on the result, and a second pass changes nothing
(the guard-first contract every transform keeps).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from ddops.errors import UsageError
from ddops.patching.checks import CheckResult, run_checks
from ddops.patching.kinds import APPLIED, PARTIAL, PENDING
from ddops.patching.plan import plan_file
from ddops.patching.playbook import PatchPlaybook
from ddops.yamlsrc import suggest

FINDS_ITS_SITES = (PENDING, APPLIED, PARTIAL)


@dataclass(frozen=True, slots=True)
class PatchFinding:
    """What one patch found in the sample."""

    patch: str
    state: str
    message: str

    @property
    def ok(self) -> bool:
        return self.state in FINDS_ITS_SITES


@dataclass(frozen=True, slots=True)
class SampleReport:
    """A playbook against one sample file: each patch's finding, the checks on the result, the diff, and whether
    applying again would change the result."""

    file: str
    sample: str
    findings: tuple[PatchFinding, ...]
    checks: tuple[CheckResult, ...]
    diff: str
    second_pass_changes: bool

    @property
    def ok(self) -> bool:
        return (all(f.ok for f in self.findings) and all(c.ok for c in self.checks)
                and not self.second_pass_changes)


def sample_target(book: PatchPlaybook, sample: str, explicit: str | None = None) -> str:
    """Which of the playbook's files a sample stands for: `REPO_PATH=FILE` says so, else its file name picks it."""
    if explicit is not None:
        if explicit not in book.files:
            raise UsageError(f"--sample {explicit}={sample}: {book.name} patches no '{explicit}'"
                             f"{suggest(explicit, book.files)} (it patches {', '.join(book.files)})")
        return explicit
    name = PurePosixPath(sample).name
    matches = [f for f in book.files if PurePosixPath(f).name == name]
    if len(matches) != 1:
        why = "none" if not matches else f"{len(matches)} ({', '.join(matches)})"
        raise UsageError(f"--sample {sample}: {why} of the files {book.name} patches is named {name}; say which with "
                         f"--sample REPO_PATH={sample} (it patches {', '.join(book.files)})")
    return matches[0]


def lint_sample(book: PatchPlaybook, file: str, source: bytes, sample: str = "") -> SampleReport:
    """Plan the playbook's patches of `file` over source, check the result, and plan again over it."""
    patches = [p for p in book.patches if file in p.files]
    first = plan_file(file, source, patches)
    after = first.new if first.new is not None else source
    checks = [result for p in patches for result in run_checks(file, source, after, p.checks_for(file))]
    again = plan_file(file, after, patches)
    return SampleReport(file=file, sample=sample or file,
                        findings=tuple(PatchFinding(r.patch_id, r.state, r.message) for r in first.results),
                        checks=tuple(checks), diff=first.diff, second_pass_changes=again.changed)
