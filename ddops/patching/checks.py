"""Grep-style checks over a file's bytes after a patch: contains, absent, unchanged, count, compiles.

Pure: `command` checks are only carried here (CheckSpec.runs_on_host); the host agent runs them after the write."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ddops.jsonvalue import JsonValue
from ddops.patching.playbook import CheckSpec

Match = tuple[int, str]  # (1-based line number, the line without its line ending)


@dataclass(frozen=True, slots=True)
class CheckResult(JsonValue):
    """One check on one file: passed or not, the lines it matched (like grep), and why."""

    name: str
    ok: bool
    matches: tuple[Match, ...] = ()
    message: str = ""
    path: str = ""
    kind: str = ""

    def grep_lines(self) -> list[str]:
        """`file:line: text` for each matching line."""
        return [f"{self.path}:{n}: {text}" for n, text in self.matches]

    @property
    def finds_lines(self) -> bool:
        """A check whose matching lines say more than its name (contains, unchanged, count)."""
        return self.kind in ("contains", "unchanged", "count") and bool(self.matches)


def run_checks(path: str, before: bytes | None, after: bytes, checks: Iterable[CheckSpec]) -> list[CheckResult]:
    """Run the pure checks that apply to path (command checks are skipped: the agent runs those)."""
    after_lines = lines_of(after)
    before_lines = lines_of(before) if before is not None else None
    results = []
    for check in checks:
        if check.runs_on_host or not check.applies_to(path):
            continue
        results.append(_run_one(path, before_lines, after, after_lines, check))
    return results


def host_checks(checks: Iterable[CheckSpec], path: str) -> list[CheckSpec]:
    """The command checks for path, for the agent to run on the host."""
    return [c for c in checks if c.runs_on_host and c.applies_to(path)]


def lines_of(data: bytes) -> list[str]:
    """Lines split on \\n only, without \\n or \\r\\n; undecodable bytes shown as U+FFFD."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def find(lines: list[str], text: str | None = None, regex: str | None = None) -> tuple[list[Match], int]:
    """Matching lines and the number of occurrences (two on one line count two)."""
    matched: list[Match] = []
    occurrences = 0
    if text is not None and "\n" in text:
        return _find_multiline(lines, text)
    pattern = re.compile(regex) if regex is not None else None
    for i, line in enumerate(lines, start=1):
        n = len(pattern.findall(line)) if pattern is not None else line.count(text or "")
        if n:
            matched.append((i, line))
            occurrences += n
    return matched, occurrences


def _find_multiline(lines: list[str], text: str) -> tuple[list[Match], int]:
    joined = "\n".join(lines)
    needle = text.replace("\r\n", "\n")
    matched: list[Match] = []
    start = joined.find(needle)
    while start != -1:
        line_no = joined.count("\n", 0, start) + 1
        matched.append((line_no, lines[line_no - 1]))
        start = joined.find(needle, start + len(needle))
    return matched, len(matched)


def _run_one(path: str, before_lines: list[str] | None, after: bytes, after_lines: list[str],
             check: CheckSpec) -> CheckResult:
    kind = check.kind

    def result(ok: bool, message: str, matches: list[Match] | tuple[Match, ...] = ()) -> CheckResult:
        return CheckResult(check.name, ok, tuple(matches), message, path, kind)

    if kind == "compiles":
        try:
            compile(after, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return result(False, f"{path}:{exc.lineno or 1}: {exc.msg}")
        except ValueError as exc:  # e.g. null bytes
            return result(False, f"{path}: {exc}")
        return result(True, "compiles")
    what = f"/{check.regex}/" if check.regex is not None else repr(check.text)
    matched, occurrences = find(after_lines, check.text, check.regex)
    if kind == "contains":
        return result(bool(matched), f"found {occurrences}" if matched else f"{path}: {what} not found", matched)
    if kind == "absent":
        if not matched:
            return result(True, "absent")
        return result(False, f"{path}:{matched[0][0]}: {what} still present ({occurrences})", matched)
    if kind == "count":
        ok = occurrences == check.count
        return result(ok, f"found {occurrences}, expected {check.count}", matched)
    if kind == "unchanged":
        if before_lines is None:
            ok = bool(matched)
            return result(ok, "present (no earlier version to compare)" if ok else f"{path}: {what} not found", matched)
        was, _ = find(before_lines, check.text)
        if not was:
            return result(False, f"{path}: {what} was not there before the patch either", matched)
        before_count = Counter(line for _, line in was)
        after_count = Counter(line for _, line in matched)
        if before_count == after_count:
            return result(True, f"unchanged ({len(was)} line{'s' if len(was) != 1 else ''})", matched)
        lost = before_count - after_count
        gained = after_count - before_count
        detail = "; ".join([f"was {line.strip()!r}" for line in lost] + [f"now {line.strip()!r}" for line in gained])
        return result(False, f"{path}: lines with {what} changed: {detail}", matched)
    raise ValueError(f"unknown check kind {kind!r}")
