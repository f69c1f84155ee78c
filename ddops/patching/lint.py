"""`ddops playbook lint`: a playbook or bench plan validated, and a playbook tried against samples of the files it
patches, without a host.

The planner's own plan_file and the pure checks on the samples' bytes. A sample passes when every patch finds its
sites (pending, applied or partial), the checks hold on the result, and a second pass changes nothing (the
guard-first contract every transform keeps)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ddops.errors import PlaybookError, UsageError
from ddops.jsonvalue import JsonValue, omitted_when_none
from ddops.patching.checks import CheckResult, run_checks
from ddops.patching.kinds import APPLIED, PARTIAL, PENDING
from ddops.patching.plan import plan_file
from ddops.patching.playbook import PatchPlaybook, is_bench_plan, parse_playbook
from ddops.yamlsrc import load_yaml_file, suggest

FINDS_ITS_SITES = (PENDING, APPLIED, PARTIAL)


@dataclass(frozen=True, slots=True)
class PatchFinding(JsonValue):
    """What one patch found in the sample."""

    patch: str
    state: str
    message: str

    @property
    def ok(self) -> bool:
        return self.state in FINDS_ITS_SITES

    def to_json(self) -> dict[str, Any]:
        return {**JsonValue.to_json(self), "ok": self.ok}


@dataclass(frozen=True, slots=True)
class SampleReport(JsonValue):
    """A playbook against one sample file (standing for the playbook's file `target`): each patch's finding, the
    checks on the result, the diff, and whether applying again would change the result."""

    target: str
    sample: str
    findings: tuple[PatchFinding, ...]
    checks: tuple[CheckResult, ...]
    diff: str
    second_pass_changes: bool

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings) and all(c.ok for c in self.checks) and not self.second_pass_changes

    def to_json(self) -> dict[str, Any]:
        return {"sample": self.sample, "target": self.target, "ok": self.ok,
                "findings": [f.to_json() for f in self.findings], "checks": [c.to_json() for c in self.checks],
                "second_pass_changes": self.second_pass_changes}


@dataclass(frozen=True, slots=True)
class LintReport(JsonValue):
    """`playbook lint`'s answer: the file is a valid playbook or bench plan (`kind`, `name`); a playbook's patch
    ids, the files it patches and one report per sample it was tried on."""

    file: str
    kind: str
    name: str
    patches: tuple[str, ...] | None = omitted_when_none()
    files: tuple[str, ...] | None = omitted_when_none()
    samples: tuple[SampleReport, ...] | None = omitted_when_none()

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.samples or ())


def lint_file(file: Path, samples: Sequence[str], load_bench_plan: Callable[[Path], Any]) -> LintReport:
    """Validate `file` (PlaybookError, or load_bench_plan's error for a bench plan, with file:line) and try a
    playbook on each sample (`FILE`, or `REPO_PATH=FILE` to say which of its files the sample stands for). The
    bench layer, above this one, lends its plan loader."""
    doc = load_yaml_file(file, PlaybookError)
    if isinstance(doc.data, dict) and doc.data.get("kind", "patch") != "patch" or is_bench_plan(doc.data):
        plan = load_bench_plan(file)
        if samples:
            raise UsageError("--sample tries patch playbooks; a bench plan has no transform to try")
        return LintReport(str(file), "bench plan", plan.name)
    book = parse_playbook(doc)
    return LintReport(str(file), "playbook", book.name, tuple(p.id for p in book.patches), book.files,
                      tuple(lint_sample_file(book, spec) for spec in samples))


def lint_sample_file(book: PatchPlaybook, spec: str) -> SampleReport:
    """The playbook tried on the sample a `--sample` names."""
    explicit, _, path = spec.rpartition("=") if "=" in spec else (None, "", spec)
    try:
        source = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise UsageError(f"--sample {path}: cannot read it ({exc.strerror})") from None
    return lint_sample(book, sample_target(book, path, explicit or None), source, sample=path)


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
    return SampleReport(target=file, sample=sample or file,
                        findings=tuple(PatchFinding(r.patch_id, r.state, r.message) for r in first.results),
                        checks=tuple(checks), diff=first.diff, second_pass_changes=again.changed)
