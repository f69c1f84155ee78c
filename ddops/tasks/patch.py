"""Per-host patch, verify, rollback and status: snapshot (1 agent call), plan locally, commit (1 agent call).

Each function is a fleet task body: `(host, session, ...) -> TaskOutcome`. The session is an AgentSession; what
the plan means lives in ddops/patching/ (pure), so these functions only ask the host and act on the answer."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ddops import __version__
from ddops.bench.environment import host_versions, support_for
from ddops.errors import AgentError, AgentNoAnswer, CommandTimeout, message_for
from ddops.fleet import CHANGED, DRIFTED, FAILED, NOT_STARTED, OK, HostResult, TaskOutcome
from ddops.inventory import Host
from ddops.patching import journal as journal_mod
from ddops.patching.backups import backup_path
from ddops.patching.checks import CheckResult, host_checks, run_checks
from ddops.patching.kinds import ADD_MODULE, APPLIED, CHANGING_STATES, PARTIAL, PENDING
from ddops.patching.kinds import DRIFTED as PLAN_DRIFTED
from ddops.patching.plan import Planner
from ddops.patching.playbook import CheckSpec, PatchPlaybook
from ddops.patching.reports import (PatchReport, Refusal, RollbackReport, SavedCopy, StatusReport, VerifyCheck,
                                    VerifyReport, file_reports)
from ddops.patching.snapshot import (Snapshot, all_files, all_patches, make_planner, patch_states, plan_problems,
                                     with_host_python)
from ddops.pins import PIN_NOT_ASKED, PIN_UNKNOWN, PinSummary, host_pins
from ddops.tasks.base import AgentSession, default_actor, shell_path
from ddops.tasks.journal_status import JournalReport, journal_and_files


def take_snapshot(host: Host, session: AgentSession, files: Sequence[str], *, facts: bool = False,
                  versions: Sequence[str] = ()) -> Snapshot:
    """One agent round trip: every target file's bytes and hash, plus the journal (and the facts, or the versions
    of these packages, when asked)."""
    payload = {"repo": host.repo, "files": list(files), "facts": facts, **({"versions": list(versions)}
                                                                           if versions else {})}
    return Snapshot.from_reply(files, session.call_agent("snapshot", payload))


def repo_without_files(host: Host, snap: Snapshot, patches: Sequence[Any]) -> str | None:
    """Why a host's repo looks like the wrong folder: none of the files the patches edit is there (a file a patch
    adds does not count). None when any is: a missing one among others is drift, said per file."""
    edited = list(dict.fromkeys(f for p in patches if p.transform.kind != ADD_MODULE for f in p.files))
    if not edited or any(snap.files.get(f) is not None or f in snap.errors for f in edited):
        return None
    return (f"none of {', '.join(edited)} is in {host.repo}: is `repo:` this host's checkout, or is the checkout "
            "not there yet (`ddops sync`)?")


def patch_host(host: Host, session: AgentSession, playbooks: Sequence[PatchPlaybook], *, planner: Planner,
               check: bool = False, actor: str | None = None, lock_timeout: float = 10.0) -> TaskOutcome:
    """Apply the playbooks' patches to one host: all or nothing, backed up, journalled, checked. With check, also
    the host's transformers against the hybrid playbooks' support matrix, where one of them is involved (said
    after the outcome's message; untested is a warning, never a refusal)."""
    outcome = _patch_host(host, session, playbooks, planner=planner, check=check, actor=actor,
                          lock_timeout=lock_timeout)
    words = getattr(outcome.report, "transformers_support", None)
    return replace(outcome, message=f"{outcome.message}; {words}") if words else outcome


def _patch_host(host: Host, session: AgentSession, playbooks: Sequence[PatchPlaybook], *, planner: Planner,
                check: bool, actor: str | None, lock_timeout: float) -> TaskOutcome:
    patches = all_patches(playbooks)
    support = support_for([b.name for b in playbooks]) if check else None
    snap = take_snapshot(host, session, all_files(patches), versions=("transformers",) if support else ())
    plan = planner.plan_host(patches, snap.files, snap.ours(patches))
    report = PatchReport(patch_states(plan, patches, snap), file_reports(plan, snap), plan.diff, check_mode=check)
    if support is not None:
        tested, words = support.verdict((snap.versions or {}).get("transformers"))
        report = replace(report, transformers_support=words, transformers_tested=tested)
    wrong_repo = repo_without_files(host, snap, patches)
    if wrong_repo:
        return TaskOutcome(FAILED, "nothing written: " + wrong_repo, report, reason="no_repo")
    hard, drift = plan_problems(plan, snap)
    if hard:
        return TaskOutcome(FAILED, "; ".join(hard), report)
    if drift:
        # All or nothing per host: patches may depend on each other, and a half-patched repo helps nobody.
        return TaskOutcome(DRIFTED, "nothing written: " + "; ".join(drift), report)
    changing = [f for f in plan.files if f.changed]
    if not changing:
        return TaskOutcome(OK, f"already applied ({len(patches)} patch{'es' if len(patches) != 1 else ''})", report)

    # Pure checks run on the exact bytes about to be written: a failing check means nothing is written at all.
    results: list[CheckResult] = []
    post_checks: dict[tuple[str, str], dict[str, Any]] = {}
    for f in changing:
        touching = [p for p in patches if f.path in p.files]
        checks = [c for p in touching for c in p.checks_for(f.path)]
        # Pure, so once per distinct (before, after) content in a run, like the plan itself; not once per host.
        results += planner.memo(("checks", f.path, f.before_sha, f.after_sha, tuple(checks)),
                                partial(run_checks, f.path, snap.files[f.path], f.new or b"", checks))
        for c in host_checks(checks, f.path):
            command = with_host_python(host.python, c.run or "")
            post_checks.setdefault((c.name, c.run or ""), {"name": c.name, "command": command, "timeout": c.timeout})
    report = replace(report, checks=tuple(results))
    failed_checks = [r for r in results if not r.ok]
    if failed_checks:
        return TaskOutcome(FAILED, "nothing written: check failed: " + "; ".join(
            f"{r.name}: {r.message}" for r in failed_checks), report)
    if check:
        names = sorted({r.patch_id for f in changing for r in f.results if r.state in CHANGING_STATES})
        return TaskOutcome(CHANGED, f"would change {len(changing)} file{'s' if len(changing) != 1 else ''} "
                                    f"({', '.join(names)})", report)

    changes = [{
        "path": f.path,
        "patch_ids": [r.patch_id for r in f.results if r.state in (PENDING, PARTIAL)],
        "expected_sha256": f.before_sha,
        "new_content_b64": base64.b64encode(f.new or b"").decode("ascii"),
        "new_sha256": f.after_sha,
    } for f in changing]
    seconds = commit_timeout(host, lock_timeout, list(post_checks.values()))
    try:
        reply = session.call_agent("commit", {
            "repo": host.repo, "actor": actor or default_actor(), "ddops_version": __version__,
            "changes": changes, "post_checks": list(post_checks.values()), "lock_timeout": lock_timeout},
            timeout=seconds)
    except AgentError as exc:
        if exc.kind == "conflict":
            return TaskOutcome(FAILED, f"{message_for(host.name, exc)} (changed since it was read: nothing written; "
                                       "run again)", report, reason=exc.kind)
        if isinstance(exc, AgentNoAnswer):  # killed (out of memory, say) part way: some files may be patched
            why = f"the agent ended during the commit without answering ({_exit_detail(exc.message)})"
            return after_lost_commit(host, session, changing, why, 0.0, report, reason=exc.kind,
                                     checks_unknown=bool(post_checks))
        raise
    except CommandTimeout:
        # The answer did not come, but the commit may well go on (or have finished) on the host: say what it holds.
        return after_lost_commit(host, session, changing, f"the commit's answer did not come within {seconds:g}s",
                                 lock_timeout, report, reason=CommandTimeout.kind)
    ran = reply.get("checks", [])
    commands = tuple(CheckResult(c["name"], c["ok"], message=(c.get("output") or "").strip()[-400:], kind="command")
                     for c in ran)
    report = replace(report, written=tuple(reply.get("written", [])), reverted=bool(reply.get("reverted")),
                     checks=report.checks + commands)
    if report.reverted:
        detail = "; ".join(f"{c['name']} (exit {c.get('exit_code')}): {(c.get('output') or '').strip()[-200:]}"
                           for c in ran if not c.get("ok"))
        return TaskOutcome(FAILED, f"check failed after writing, originals restored: {detail}", report)
    return TaskOutcome(CHANGED, f"patched {', '.join(report.written)}", report)


def commit_timeout(host: Host, lock_timeout: float, post_checks: Sequence[dict[str, Any]]) -> float:
    """How long a commit's answer may take: the host's command timeout for the writes, plus the lock wait and every
    post check's own timeout (they run one after another), all of which the agent may spend first."""
    return host.command_timeout + lock_timeout + sum(float(c.get("timeout") or 60) for c in post_checks)


def _exit_detail(message: str) -> str:
    """`exit -9: no output` from an agent's `... (exit -9): no output`."""
    found = re.search(r"\((exit -?\d+)\): (.*)$", message)
    return f"{found[1]}: {found[2]}" if found else message


def after_lost_commit(host: Host, session: AgentSession, changing: Sequence[Any], late: str, lock_timeout: float,
                      report: PatchReport, *, reason: str, checks_unknown: bool = False) -> TaskOutcome:
    """The outcome of a commit whose answer never came (`late` says why, `reason` is its kind): read the files, the
    lock and the journal (pending notes included, as `status` does; waiting up to lock_timeout for a commit still
    running there to end) and report what the host holds. `checks_unknown`: whether its post checks ran is unknown
    (the agent died)."""
    settle_until = time.monotonic() + lock_timeout
    paths = [f.path for f in changing]
    while True:
        reply = session.call_agent("snapshot", {"repo": host.repo, "files": paths})
        holder = reply.get("lock")  # None: free; {} while its holder has not said who it is yet
        running = holder is not None and holder.get("verb", "commit") == "commit"
        if not running or time.monotonic() >= settle_until:
            break
        time.sleep(0.25)
    entries = list(reply.get("journal") or [])
    states, patched = [], []
    for f in changing:
        found = (reply["files"].get(f.path) or {}).get("sha256")
        if found == f.after_sha:
            patched.append(f.path)
            journalled = journal_mod.last_written(entries, f.path) == f.after_sha
            states.append(f"{f.path} patched" + ("" if journalled else " (not journalled yet)"))
        elif found == f.before_sha:
            states.append(f"{f.path} original")
        else:
            states.append(f"{f.path} changed by someone else (sha256 {found})" if found else f"{f.path} missing")
    report = replace(report, written=tuple(patched))
    if running:
        lock = holder or {}
        who = f"pid {lock.get('pid')} for {lock.get('actor')} since {lock.get('since')}"
        return TaskOutcome(FAILED, f"{late}; a commit is still running on the host ({who}): so far "
                                   f"{', '.join(states)}; `ddops status` shows how it ends", report, reason=reason)
    if checks_unknown and len(patched) == len(changing):
        return TaskOutcome(FAILED, f"{late}; the host now holds: {', '.join(states)}; its post checks may not have "
                                   "run: `ddops verify` runs them", report, reason=reason)
    if len(patched) == len(changing):
        return TaskOutcome(CHANGED, f"patched {', '.join(patched)} ({late}, but the host's files and journal show "
                                    f"that it finished)", report)
    return TaskOutcome(FAILED, f"{late}; the host now holds: {', '.join(states)}", report, reason=reason)


def verify_host(host: Host, session: AgentSession, playbooks: Sequence[PatchPlaybook], *,
                planner: Planner | None = None) -> TaskOutcome:
    """Run every check of the playbooks against the files as they are now; grep-style matches in the report."""
    patches = all_patches(playbooks)
    snap = take_snapshot(host, session, all_files(patches))
    wrong_repo = repo_without_files(host, snap, patches)
    if wrong_repo:
        return TaskOutcome(FAILED, wrong_repo, VerifyReport(()), reason="no_repo")
    results: list[VerifyCheck] = []
    commands: dict[str, tuple[str, CheckSpec]] = {}
    failures = [f"{path}: {message}" for path, message in snap.errors.items()]
    for patch in patches:
        for path in patch.files:
            content = snap.files.get(path)
            if path in snap.errors:
                continue
            if content is None:
                failures.append(f"{path}: missing")
                continue
            for r in run_checks(path, None, content, patch.checks_for(path)):
                results.append(VerifyCheck(r.name, r.ok, r.matches, r.message, r.path, r.kind, patch=patch.id))
                if not r.ok:
                    failures.append(f"{patch.id}: {r.name}: {r.message}")
            for c in host_checks(patch.checks_for(path), path):
                commands.setdefault(c.run or "", (patch.id, c))
    for command, (patch_id, check) in commands.items():
        ran = session.run(f"cd {shell_path(host.repo)} && {with_host_python(host.python, command)}",
                          timeout=check.timeout)
        output = (ran.stdout + ran.stderr).strip()
        results.append(VerifyCheck(check.name, ran.ok, (), output[-400:], "", "command", patch=patch_id,
                                   exit_code=ran.exit_code))
        if not ran.ok:
            failures.append(f"{patch_id}: {check.name} exited {ran.exit_code}: {output[-200:]}")
    report = VerifyReport(tuple(results))
    if failures:
        return TaskOutcome(FAILED, "; ".join(failures), report)
    return TaskOutcome(OK, f"{len(results)} checks passed", report)


def status_host(host: Host, session: AgentSession, playbooks: Sequence[PatchPlaybook], *,
                planner: Planner | None = None) -> TaskOutcome:
    """Per patch: pending / applied / drifted / modified (and ambiguous / error), plus the repo's commit."""
    patches = all_patches(playbooks)
    snap = take_snapshot(host, session, all_files(patches), facts=True)
    plan = (planner or make_planner()).plan_host(patches, snap.files, snap.ours(patches))
    states = patch_states(plan, patches, snap)
    report = StatusReport(states, (snap.facts or {}).get("git_commit"), file_reports(plan, snap),
                          snap.journal_corrupt, host_versions(snap.facts))
    wrong_repo = repo_without_files(host, snap, patches)
    if wrong_repo:
        return TaskOutcome(FAILED, wrong_repo, report, reason="no_repo")
    corrupt = journal_mod.describe_corrupt(snap.journal_corrupt)
    said = f"; {corrupt}" if corrupt else ""
    attention = {pid: s for pid, s in states.items() if s not in (PENDING, APPLIED, PARTIAL)}
    if attention:
        status = DRIFTED if all(s in (PLAN_DRIFTED, journal_mod.MODIFIED) for s in attention.values()) else FAILED
        unreadable = "; ".join(f"{path}: {message}" for path, message in snap.errors.items())  # a symlink, a FIFO ...
        return TaskOutcome(status, ", ".join(f"{pid} {s}" for pid, s in attention.items())
                           + (f" ({unreadable})" if unreadable else "") + said, report)
    pending = [pid for pid, s in states.items() if s != APPLIED]
    return TaskOutcome(OK, (f"{len(pending)} pending" if pending else "all applied") + said, report)


@dataclass(frozen=True, slots=True)
class PinnedStatus:
    """A host's status (None: it was not reached) and its pin as the controller resolved it: what `ddops status`
    shows of each host."""

    status: StatusReport | JournalReport | None
    pin: PinSummary

    def to_json(self) -> dict[str, Any]:
        shown = self.status.to_json() if self.status else {}
        return {**shown, "pin": self.pin.state, "pin_detail": self.pin.to_json()}


def with_pins(results: Sequence[HostResult], hosts: Sequence[Host]) -> list[HostResult]:
    """Each status result with its host's pin, every distinct pin resolved once on the controller; a host that was
    not asked (an interrupted run) or did not answer says so, never `no-repo`."""
    pins = host_pins(hosts, [r.report.commit if r.report else None for r in results])
    by_name = {h.name: h for h in hosts}

    def pin_of(r: HostResult) -> PinSummary:
        if r.report is not None:
            return pins[r.host]
        return PinSummary(PIN_NOT_ASKED if r.interrupted == NOT_STARTED else PIN_UNKNOWN, by_name[r.host].commit)

    return [replace(r, report=PinnedStatus(r.report, pin_of(r))) for r in results]


def rollback_host(host: Host, session: AgentSession, patch_ids: Sequence[str] | None = None, *, force: bool = False,
                  actor: str | None = None, lock_timeout: float = 10.0, check: bool = False) -> TaskOutcome:
    """Restore the exact pre-patch bytes of patch_ids (None: every patch ddops applied), newest first; with check,
    only say what would be restored and refused (the files as they are now), writing nothing."""
    if check:
        return rollback_check(host, session, patch_ids, force=force)
    for attempt in range(ROLLBACK_ATTEMPTS):
        try:
            return rollback_once(host, session, patch_ids, force=force, actor=actor, lock_timeout=lock_timeout)
        except AgentError as exc:
            # Another ddops wrote to the journal between our plan and our commit: plan again from what it holds now.
            if exc.kind != "journal_moved" or attempt == ROLLBACK_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


ROLLBACK_ATTEMPTS = 3


def still_written(host: Host, session: AgentSession, torn: Sequence[journal_mod.TornApplication],
                  covered: set[str]) -> list[journal_mod.TornApplication]:
    """The torn applies whose file still holds the bytes they record, beside no application of its own (one more
    round trip, only where the journal has such a line)."""
    torn = [t for t in torn if t.file not in covered]
    if not torn:
        return []
    files = session.call_agent("snapshot", {"repo": host.repo, "files": sorted({t.file for t in torn})})["files"]
    return [t for t in torn if (files.get(t.file) or {}).get("sha256") == t.after]


def rollback_check(host: Host, session: AgentSession, patch_ids: Sequence[str] | None, *, force: bool) -> TaskOutcome:
    """What rollback_host would restore and refuse on this host now: planned against the files' hashes as they are
    (a file edited since ddops wrote it is refused, as the agent's compare-and-swap would), nothing written."""
    journal, shas, first = journal_and_files(host, session)
    entries = journal_mod.parse_journal(journal)
    actives = journal_mod.active_applications(entries)
    torn = still_written(host, session, journal_mod.torn_applications(first.get("journal_corrupt") or []),
                         {a.file for a in actives})
    if not actives and not torn:
        return TaskOutcome(OK, "nothing to roll back", RollbackReport(check_mode=True))
    plan = journal_mod.plan_rollback(entries, shas, patch_ids, force=force)
    rolled = tuple(dict.fromkeys(a.patch for r in plan.restores for a in r.applications))
    report = RollbackReport(restored=tuple(r.file for r in plan.restores),
                            refused=tuple(Refusal(r.file, r.reason, r.patch) for r in plan.refused),
                            not_applied=tuple(plan.not_applied), patches=rolled, check_mode=True)
    if patch_ids is None:  # as rollback_once: a torn line's file is restored only when no patch is named
        report = replace(report, restored=report.restored + tuple(t.file for t in torn))
    else:
        report = replace(report, refused=report.refused + tuple(Refusal(t.file, (
            f"{t.file}: journal line {t.line} was cut before its patch id: which patch wrote it is unknown; "
            "`ddops rollback` without naming patches restores it")) for t in torn))
    if report.refused:
        return TaskOutcome(FAILED, report.summary(host.name), report)
    if not report.restored:
        return TaskOutcome(OK, "nothing to roll back" + (f" ({', '.join(plan.not_applied)} not applied)"
                                                         if plan.not_applied else ""), report)
    return TaskOutcome(CHANGED, report.summary(host.name), report)


def rollback_once(host: Host, session: AgentSession, patch_ids: Sequence[str] | None, *, force: bool,
                  actor: str | None, lock_timeout: float) -> TaskOutcome:
    """One plan-and-commit of rollback_host; the agent refuses it (`journal_moved`) if the journal moved meanwhile."""
    journal = session.call_agent("journal", {"repo": host.repo})
    raw = journal.get("entries", [])
    # Parsed once: a host patched for months has a long journal, and each step below reads all of it.
    entries = journal_mod.parse_journal(raw)
    actives = journal_mod.active_applications(entries)
    torn = still_written(host, session, journal_mod.torn_applications(journal.get("corrupt") or []),
                         {a.file for a in actives})
    if not actives and not torn:
        return TaskOutcome(OK, "nothing to roll back", RollbackReport())
    # The agent compares each file with what ddops last wrote (compare-and-swap); plan as if it still is.
    written = journal_mod.last_written_by_file(entries)
    expected = {a.file: written.get(a.file) for a in actives}
    plan = journal_mod.plan_rollback(entries, expected, patch_ids, force=force)
    report = RollbackReport(refused=tuple(Refusal(r.file, r.reason, r.patch) for r in plan.refused),
                            not_applied=tuple(plan.not_applied), patches=tuple(plan.patches))
    restores = [{"path": r.file, "patch_ids": list(r.patches), "expected_sha256": r.expected,
                 "restore_sha256": r.restore, "force": force} for r in plan.restores]
    if patch_ids is None:  # every patch: the one a torn line lost is among them, whichever it was
        restores += [{"path": t.file, "patch_ids": [], "expected_sha256": t.after, "restore_sha256": t.before,
                      "force": force} for t in torn]
    else:
        report = replace(report, refused=report.refused + tuple(Refusal(t.file, (
            f"{t.file}: journal line {t.line} was cut before its patch id: which patch wrote it is unknown; "
            "`ddops rollback` without naming patches restores it")) for t in torn))
    if not restores:
        if report.refused:
            return TaskOutcome(FAILED, report.summary(host.name), report)
        return TaskOutcome(OK, "nothing to roll back" + (f" ({', '.join(plan.not_applied)} not applied)"
                                                         if plan.not_applied else ""), report)
    reply = session.call_agent("rollback", {
        "repo": host.repo, "actor": actor or default_actor(), "ddops_version": __version__,
        "lock_timeout": lock_timeout, "journal_last": journal_mod.last_entry_id(raw), "restores": restores})
    refused = [Refusal(r["path"], f"{r['path']} " + ("changed since ddops wrote it: left untouched (--force saves "
                                                     "that edit, then restores)" if r.get("reason") == "modified"
                                                     else r.get("reason", "refused")))
               for r in reply.get("refused", [])]
    refused += [Refusal(f["path"], f"{f['path']}: {f.get('message')}") for f in reply.get("failed", [])]
    lines = {t.file: t.line for t in torn if patch_ids is None}
    restored = [f"{path} (its journal line {lines[path]} cut before the patch id: restored from the backup it names)"
                if path in lines else path for path in reply.get("restored", []) + reply.get("unchanged", [])]
    report = replace(report, restored=tuple(restored),
                     refused=report.refused + tuple(refused),
                     saved=tuple(SavedCopy(s["path"], s["sha256"], backup_path(host.repo, s["sha256"]))
                                 for s in reply.get("saved", [])))
    return TaskOutcome(FAILED if report.refused else CHANGED, report.summary(host.name), report)
