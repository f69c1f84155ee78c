"""The bench report: method summaries from many hosts as rows, with speedups, best budgets and lossy flags, and the
same rows aggregated per host (over repeats) or per method (over hosts and repeats) with their spread; pure."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from statistics import fmean, pstdev
from typing import Any

from ddops.bench.summarize_ddtree import BASELINE, method_order
from ddops.bench.summary import ONE_FORWARD, Divergence, MethodSummary

BEST = "best"
NOT_LOSSLESS = "NOT LOSSLESS"
INCOMPLETE = "incomplete"
REFERENCE_PATH = "REFERENCE PATH"  # some verify rounds took the slow exact fallback: the speed is not the method's
# What `--by` makes one row of: a host (its repeats pooled), a method (every host and repeat pooled), a run (one
# collected run id, nothing pooled across runs), or a patch set (each method's rows per code side by side).
BY = ("host", "method", "run", "patchset")
DEFAULT_VIEWS = ("host", "method")


@dataclass(frozen=True, slots=True)
class CodeId:
    """What code produced a result, from the run's manifest: the commit, the patches in place, library versions.

    Results of different code are never averaged together as if they were repeats."""

    commit: str | None = None
    patches: tuple[tuple[str, str | None], ...] = ()  # (patch id, sha256 of the patched file), sorted
    versions: tuple[tuple[str, str | None], ...] = ()  # (library, version): torch, transformers, python[, vllm]
    playbooks: tuple[str, ...] = ()  # the playbooks those patches come from, where the controller knows them

    @classmethod
    def from_manifest(cls, entry: Any, playbook_of: Mapping[str, str] | None = None) -> CodeId:
        """The code identity of one host's manifest entry (ddops/bench/collect.py host_manifest); playbook_of maps
        patch ids to the playbook that defines them."""
        patches = sorted({(str(p.get("id")), p.get("sha256")) for p in entry.get("patches") or ()
                          if isinstance(p, dict) and p.get("in_place", True)}, key=lambda x: (x[0], x[1] or ""))
        libs = ("torch", "transformers", "python") + (("vllm",) if isinstance(entry.get("vllm"), str) else ())
        versions = tuple((lib, None if entry.get(lib) is None else str(entry.get(lib))) for lib in libs)
        commit = entry.get("repo_commit")
        names = sorted({(playbook_of or {}).get(pid, pid) for pid, _ in patches})
        return cls(commit=str(commit) if commit else None, patches=tuple(patches), versions=versions,
                   playbooks=tuple(names))

    @property
    def label(self) -> str:
        """`73068c9 +hybrid-tree-verify` (playbook names, or patch ids where no playbook is known), or
        `73068c9 no patches`."""
        commit = self.commit[:7] if self.commit else "unknown commit"
        names = self.playbooks or tuple(dict.fromkeys(pid for pid, _ in self.patches))
        return f"{commit} " + " ".join(f"+{n}" for n in names) if names else f"{commit} no patches"


@dataclass(frozen=True, slots=True)
class Labeled:
    """A MethodSummary and where it came from: the host, the run (plan run id or file name), the code that ran."""

    host: str
    run: str
    summary: MethodSummary
    code: CodeId | None = None
    incomplete: bool = False  # collected while the run was still going: more results may come
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class ReportRow:
    host: str
    run: str
    model: str | None
    dataset: str | None
    temperature: float | None
    method: str  # MethodSummary.label: ddtree_tb64, dflash, vllm:mtp ...
    engine: str
    n_responses: int
    tokens_per_s: float | None
    mean_tpot_s: float | None
    speedup: float | None  # the fastest same-host, same-engine baseline's mean tpot / this method's
    acceptance_length: float | None
    mean_ttft_s: float | None
    fidelity: float | None  # share of responses equal to the baseline's
    tree_budget: int | None
    best_budget: bool  # the fastest DDTree tree budget for this host, model, dataset and temperature
    lossy: bool  # greedy (temperature 0) and fidelity < 1: the speed is not for the same output
    source: str
    attn: str | None = None  # the target's attention implementation: runs with another one are not repeats
    divergence: Divergence | None = None  # a response that differs from the baseline's, and where
    code: CodeId | None = None
    incomplete: bool = False
    run_id: str = ""
    verify_paths: tuple[tuple[str, int], ...] = ()  # (path, rounds): which verify ran, where the results say
    prompt_times: tuple[float | None, ...] = ()  # per prompt: seconds per output token
    prompt_lengths: tuple[int | None, ...] = ()

    @property
    def flags(self) -> tuple[str, ...]:
        return _flags(self.best_budget, self.lossy, self.incomplete, self.verify_paths)

    @property
    def note(self) -> str:
        """Why a row is flagged, in words, with the first differing token of one response as the example."""
        lossy = _lossy_note(self.fidelity, self.speedup, self.divergence) if self.lossy and self.fidelity is not None \
            else ""
        return "; ".join(n for n in (lossy, reference_note(self.verify_paths)) if n)


@dataclass(frozen=True, slots=True)
class Report:
    rows: tuple[ReportRow, ...]

    @property
    def faster_but_lossy(self) -> tuple[ReportRow, ...]:
        """The rows whose speedup is not a lossless speedup: what a reader must not quote."""
        return tuple(r for r in self.rows if r.lossy and r.speedup is not None and r.speedup > 1)


def _flags(best: bool, lossy: bool, incomplete: bool, paths: Sequence[tuple[str, int]] = ()) -> tuple[str, ...]:
    reference = any(label != ONE_FORWARD and rounds for label, rounds in paths)
    return tuple(flag for flag, on in ((BEST, best), (NOT_LOSSLESS, lossy), (REFERENCE_PATH, reference),
                                       (INCOMPLETE, incomplete)) if on)


def reference_note(paths: Sequence[tuple[str, int]]) -> str:
    """`REFERENCE PATH: 10 of 40 verify rounds took the reference path (<reason>): ...`; empty when none did."""
    fallback = [(label, rounds) for label, rounds in paths if label != ONE_FORWARD and rounds]
    if not fallback:
        return ""
    total = sum(rounds for _, rounds in paths)
    took = sum(rounds for _, rounds in fallback)
    reasons = "; ".join(label.partition(": ")[2] or label for label, _ in fallback)
    share = "every verify round" if took == total else f"{took} of {total} verify rounds"
    return (f"{REFERENCE_PATH}: {share} took the reference path ({reasons}): this speed is the slow exact "
            "fallback's, not the one-forward verify's")


def verify_cell(paths: Sequence[tuple[str, int]]) -> str:
    """Which verify path ran: `one-forward`, `reference: <reason>`, or each with its rounds when they were mixed."""
    ran = [(label, rounds) for label, rounds in paths if rounds]
    return ran[0][0] if len(ran) == 1 else ", ".join(f"{label} ({rounds} rounds)" for label, rounds in ran)


def _add_paths(rows: Iterable[Any]) -> tuple[tuple[str, int], ...]:
    total: dict[str, int] = {}
    for r in rows:
        for label, rounds in r.verify_paths:
            total[label] = total.get(label, 0) + rounds
    return tuple(sorted(total.items()))


def build_report(items: Iterable[Labeled | tuple[str, str, MethodSummary]]) -> Report:
    """Rows per host x code x model x dataset x temperature x method (x run), each against the baseline of its own
    host and code."""
    labeled = [x if isinstance(x, Labeled) else Labeled(*x) for x in items]
    groups: dict[tuple, list[Labeled]] = {}
    for item in labeled:
        groups.setdefault(_group_key(item), []).append(item)

    host_rank = _first_seen(x.host for x in labeled)
    rows: list[ReportRow] = []
    for members in groups.values():
        baselines = [m for m in members if m.summary.method == BASELINE and m.summary.mean_tpot_s]
        # The fastest baseline: never flatter a method by choosing a slow reference (as the DDTree paper's table).
        reference_tpot = min((m.summary.mean_tpot_s for m in baselines if m.summary.mean_tpot_s), default=None)
        group_rows: list[ReportRow] = []
        for m in members:
            s = m.summary
            speedup = reference_tpot / s.mean_tpot_s if reference_tpot is not None and s.mean_tpot_s else None
            fidelity = s.fidelity
            if fidelity is None and s.output_digests:
                fidelity = _digest_fidelity(s, [b.summary for b in baselines])
            lossy = s.temperature == 0 and fidelity is not None and fidelity < 1.0
            group_rows.append(ReportRow(
                host=m.host, run=m.run, model=s.model, dataset=s.dataset, temperature=s.temperature,
                method=s.label, engine=s.engine, n_responses=s.n_responses, tokens_per_s=s.tokens_per_s,
                mean_tpot_s=s.mean_tpot_s, speedup=speedup, acceptance_length=s.acceptance_length,
                mean_ttft_s=s.mean_ttft_s, fidelity=fidelity, tree_budget=s.tree_budget,
                best_budget=False, lossy=lossy, source=s.source, attn=s.attn, divergence=s.first_difference,
                code=m.code, incomplete=m.incomplete, run_id=m.run_id, verify_paths=s.verify_paths,
                prompt_times=s.prompt_times, prompt_lengths=s.prompt_lengths,
            ))
        best = _best_budget(group_rows)
        rows.extend(replace(r, best_budget=True) if r is best else r for r in group_rows)
    order_of = _first_seen((r.model, r.dataset, r.temperature) for r in rows)
    rows.sort(key=lambda r: (host_rank[r.host], order_of[(r.model, r.dataset, r.temperature)],
                             r.engine != "ddtree", r.engine, method_order(r.method.split(":")[-1]), r.run))
    return Report(rows=tuple(rows))


def _group_key(item: Labeled) -> tuple:
    s = item.summary
    return (item.host, item.code, s.engine, s.model, s.dataset, s.temperature)


def _best_budget(rows: Sequence[ReportRow]) -> ReportRow | None:
    """The fastest tree budget whose output is the baseline's: a NOT LOSSLESS row is never the best."""
    trees = [(r.tokens_per_s, r) for r in rows if r.tree_budget is not None and r.tokens_per_s and not r.lossy]
    return max(trees, key=lambda t: t[0])[1] if trees else None


def code_ids(rows: Iterable[Any]) -> tuple[CodeId | None, ...]:
    """The distinct code identities of the rows, in first-seen order."""
    return tuple(dict.fromkeys(r.code for r in rows))


def pooling_note(report: Report) -> str | None:
    """One line saying that results of different code are side by side, never averaged; None if all match."""
    codes = [c for c in code_ids(report.rows) if c is not None]
    if len(codes) < 2:
        return None
    differ = [what for what, values in (("commit", {c.commit for c in codes}),
                                        ("patch set", {c.patches for c in codes}),
                                        ("library versions", {c.versions for c in codes})) if len(values) > 1]
    return (f"not pooled: these runs differ in {' and '.join(differ)} "
            f"({'; '.join(code_label(c, codes) for c in codes)})"
            ": each code's rows are reported side by side")


def report_title(rows: Sequence[Any], run_ids: Sequence[str]) -> str:
    """`bench report RUN: Qwen3-8B, 73068c9 +hybrid-tree-verify`: the runs, and the target and code when there is one
    of each (a table or plot of one target shows no Model or Code column, so its title names them)."""
    models = list(dict.fromkeys(_short_model(r.model) for r in rows if r.model))
    codes = code_ids(rows)
    what = ([models[0]] if len(models) == 1 else [f"{len(models)} targets"] if models else []) + (
        [code_label(codes[0])] if len(codes) == 1 and codes[0] is not None else
        [f"{len(codes)} code variants"] if len(codes) > 1 else [])
    return f"bench report {', '.join(run_ids)}" + (": " + ", ".join(what) if what else "")


def code_label(code: CodeId | None, among: Sequence[CodeId | None] = ()) -> str:
    """The code's label, with library versions when they are what tells it apart from the others."""
    if code is None:
        return "unknown code"
    label = code.label
    alike = [o for o in among if o is not None and o != code and o.label == label]
    if any(o.patches != code.patches for o in alike):  # one playbook's patches, not all of them in place
        label += " (patches " + ",".join(pid for pid, _ in code.patches) + ")"
    if any(o.versions != code.versions for o in alike):
        label += " (" + ", ".join(f"{lib} {v}" for lib, v in code.versions if v) + ")"
    return label


def _digest_fidelity(summary: MethodSummary, baselines: Sequence[MethodSummary]) -> float | None:
    """Across runs (vLLM): compare outputs prompt by prompt with a baseline run over the same prompts."""
    for b in sorted(baselines, key=lambda b: b.mean_tpot_s or 0):
        if len(b.output_digests) == len(summary.output_digests):
            same = sum(1 for x, y in zip(summary.output_digests, b.output_digests) if x == y)
            return same / len(summary.output_digests)
    return None


def _first_seen(keys: Iterable[Any]) -> dict[Any, int]:
    rank: dict[Any, int] = {}
    for k in keys:
        rank.setdefault(k, len(rank))
    return rank


def _lossy_note(fidelity: float, speedup: float | None, divergence: Divergence | None) -> str:
    pct = _pct(fidelity)
    if speedup is not None and speedup > 1:
        text = f"{NOT_LOSSLESS}: {speedup:.2f}x faster than baseline but only {pct} of outputs match at T=0"
    else:
        text = f"{NOT_LOSSLESS}: only {pct} of outputs match the baseline at T=0"
    return text + (f"; {describe_divergence(divergence)}" if divergence is not None else "")


def describe_divergence(d: Divergence) -> str:
    """`response 3 first differs at generated token 17 (baseline 101, this method 32)`."""
    def tok(t: int | None) -> str:
        return "end of output" if t is None else str(t)

    return (f"response {d.response} first differs at generated token {d.position} "
            f"(baseline {tok(d.baseline_token)}, this method {tok(d.method_token)})")


# --- aggregation: per host over repeats, per method over hosts and repeats -----------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    """A number measured n times: mean, population standard deviation, min and max."""

    mean: float
    std: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        xs = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not xs:
            return None
        try:
            return cls(mean=fmean(xs), std=pstdev(xs) if len(xs) > 1 else 0.0, low=min(xs), high=max(xs), n=len(xs))
        except OverflowError:  # numbers near 1e308 from a file: no spread worth showing, and no crash
            return None


@dataclass(frozen=True, slots=True)
class GroupRow:
    """Report rows of one method aggregated: on one host over its repeats, or over every host and repeat."""

    by: str  # "host" or "method"
    host: str  # the host, or "all" for a row over every host
    hosts: tuple[str, ...]
    model: str | None
    dataset: str | None
    temperature: float | None
    attn: str | None
    method: str
    engine: str
    runs: int  # how many result rows (host x run) went into this one: the n of the spreads
    n_responses: int  # responses over all those runs
    tokens_per_s: Spread | None
    speedup: Spread | None  # each run's speedup is over its own host's baseline
    acceptance_length: Spread | None
    mean_ttft_s: Spread | None
    equal_responses: int | None  # responses whose output equals the baseline's, over all runs
    compared_responses: int | None
    tree_budget: int | None
    best_budget: bool  # the fastest (mean tokens/s) lossless DDTree budget of its group
    divergence: tuple[str, Divergence] | None  # (host, where) for one response that differs
    code: CodeId | None = None  # every row pooled here ran this code
    incomplete: bool = False  # some pooled run was collected while still going
    run_id: str = ""  # by run: the run
    verify_paths: tuple[tuple[str, int], ...] = ()  # summed over the pooled rows
    prompt_times: tuple[float | None, ...] = ()  # per prompt, the mean over the pooled runs (same prompts only)
    prompt_lengths: tuple[int | None, ...] = ()

    @property
    def fidelity(self) -> float | None:
        return (self.equal_responses or 0) / self.compared_responses if self.compared_responses else None

    @property
    def lossy(self) -> bool:
        fidelity = self.fidelity
        return self.temperature == 0 and fidelity is not None and fidelity < 1.0

    @property
    def flags(self) -> tuple[str, ...]:
        return _flags(self.best_budget, self.lossy, self.incomplete, self.verify_paths)

    @property
    def note(self) -> str:
        text = ""
        if self.lossy:
            speed = self.speedup.mean if self.speedup is not None else None
            where = self.divergence[1] if self.divergence is not None else None
            text = _lossy_note(self.fidelity or 0.0, speed, where)
            if self.divergence is not None and len(self.hosts) > 1:
                text += f" on {self.divergence[0]}"
        return "; ".join(n for n in (text, reference_note(self.verify_paths)) if n)


def aggregate(report: Report, by: str) -> tuple[GroupRow, ...]:
    """Rows grouped per host (over repeats), per method (over every host and run), per run (nothing pooled across
    runs) or per patch set (each method's code variants side by side); never over different code."""
    if by not in BY:
        raise ValueError(f"by={by!r}: use one of {BY}")
    groups: dict[tuple, list[ReportRow]] = {}
    for r in report.rows:
        key = (r.code, r.model, r.dataset, r.temperature, r.attn, r.engine, r.method)
        scope = {"host": (r.host,), "run": (r.run_id or r.run, r.host)}.get(by, ())
        groups.setdefault(scope + key, []).append(r)
    out = []
    for rows in groups.values():
        compared = [r for r in rows if r.fidelity is not None]
        example = next(((r.host, r.divergence) for r in rows if r.divergence is not None), None)
        out.append(GroupRow(
            by=by, host=rows[0].host if by in ("host", "run") else "all",
            hosts=tuple(dict.fromkeys(r.host for r in rows)),
            model=rows[0].model, dataset=rows[0].dataset, temperature=rows[0].temperature, attn=rows[0].attn,
            method=rows[0].method, engine=rows[0].engine, runs=len(rows), n_responses=sum(r.n_responses for r in rows),
            tokens_per_s=Spread.of(r.tokens_per_s for r in rows), speedup=Spread.of(r.speedup for r in rows),
            acceptance_length=Spread.of(r.acceptance_length for r in rows),
            mean_ttft_s=Spread.of(r.mean_ttft_s for r in rows),
            equal_responses=sum(round((r.fidelity or 0.0) * r.n_responses) for r in compared) if compared else None,
            compared_responses=sum(r.n_responses for r in compared) if compared else None,
            tree_budget=rows[0].tree_budget, best_budget=False, divergence=example, code=rows[0].code,
            incomplete=any(r.incomplete for r in rows), run_id=(rows[0].run_id or rows[0].run) if by == "run" else "",
            verify_paths=_add_paths(rows), **_prompts_of(rows),
        ))
    out = _mark_best(out, by)
    if by in ("method", "patchset"):  # each target's methods together, in the report's order of targets
        order = _first_seen((g.model, g.dataset, g.temperature) for g in out)
        code_rank = _first_seen(g.code for g in out)

        def place(g: GroupRow) -> tuple:
            method = (g.engine != "ddtree", g.engine, method_order(g.method.split(":")[-1]), g.attn or "")
            # method: each code's table in turn; patchset: each method's code variants next to each other
            return (order[(g.model, g.dataset, g.temperature)],) + (
                (code_rank[g.code],) + method if by == "method" else method + (code_rank[g.code],))

        out.sort(key=place)
    elif by == "run":  # each run's rows together, runs in the order given
        run_rank = _first_seen(g.run_id for g in out)
        out.sort(key=lambda g: run_rank[g.run_id])  # stable: report order within a run
    return tuple(out)


def _prompts_of(rows: Sequence[ReportRow]) -> dict[str, tuple]:
    """Per-prompt times averaged over repeats of the same prompts (same count and lengths); none otherwise."""
    first = rows[0]
    if not first.prompt_times or any(len(r.prompt_times) != len(first.prompt_times)
                                     or r.prompt_lengths != first.prompt_lengths for r in rows):
        return {}
    columns = zip(*(r.prompt_times for r in rows))
    means = tuple(None if None in ts else fmean(ts) for ts in columns)  # type: ignore[arg-type]
    return {"prompt_times": means, "prompt_lengths": first.prompt_lengths}


def _mark_best(groups: list[GroupRow], by: str) -> list[GroupRow]:
    best: dict[tuple, GroupRow] = {}
    for g in groups:
        if g.tree_budget is None or g.tokens_per_s is None or g.lossy:
            continue
        key = (g.host if by in ("host", "run") else None, g.run_id, g.code, g.model, g.dataset, g.temperature, g.engine)
        if key not in best or g.tokens_per_s.mean > best[key].tokens_per_s.mean:  # type: ignore[union-attr]
            best[key] = g
    chosen = {id(g) for g in best.values()}
    return [_replace_best(g) if id(g) in chosen else g for g in groups]


def _replace_best(g: GroupRow) -> GroupRow:
    return replace(g, best_budget=True)


# --- formatting --------------------------------------------------------------------------------------------------

FIELDS = ("host", "run", "model", "dataset", "temperature", "method", "engine", "n_responses", "tokens_per_s",
          "mean_tpot_s", "speedup", "acceptance_length", "mean_ttft_s", "fidelity", "tree_budget", "best_budget",
          "lossy", "source", "incomplete", "verify_paths")


def to_json(report: Report, views: Sequence[str] = DEFAULT_VIEWS) -> str:
    """One JSON document: every result row, the rows aggregated as the table shows them (`views`: `--by`, or host and
    method by default; each under `by_<view>`, in the table's row order, and named in `views`), and the lossy notes.
    `by_host` and `by_method` are always there; an unknown view is aggregate()'s ValueError."""
    codes = code_ids(report.rows)

    def doc(row: Any) -> dict[str, Any]:
        d = asdict(row)
        del d["prompt_times"], d["prompt_lengths"]  # per prompt: what `comparisons` summarizes, too long to list
        d["verify_paths"] = dict(row.verify_paths) or None
        if isinstance(row, GroupRow):
            d["fidelity"] = row.fidelity
            d["lossy"] = row.lossy
        d["code_label"] = code_label(row.code, codes) if row.code is not None else None
        d["flags"] = list(row.flags)
        d["note"] = row.note
        return d

    grouped = {view: aggregate(report, view) for view in dict.fromkeys(("host", "method", *views))}
    return json.dumps({
        "pooling": pooling_note(report),
        "views": list(views),
        "rows": [doc(r) for r in report.rows],
        **{f"by_{view}": [doc(g) for g in groups] for view, groups in grouped.items()},
        "not_lossless": [f"{g.model} {g.dataset} {g.method}: {g.note}" for g in grouped["method"] if g.lossy],
        "reference_path": [f"{g.model} {g.dataset} {g.method}: {reference_note(g.verify_paths)}"
                           for g in grouped["method"] if REFERENCE_PATH in g.flags],
        "faster_but_lossy": len(report.faster_but_lossy),
    }, indent=2)


# The CSV of `--by VIEW`: one line per aggregated row (as the table's), each spread as its mean and std columns.
GROUP_FIELDS = ("by", "run_id", "host", "hosts", "code", "model", "dataset", "temperature", "attn", "method", "engine",
                "runs", "n_responses")
SPREAD_FIELDS = ("tokens_per_s", "speedup", "acceptance_length", "mean_ttft_s")
GROUP_TAIL = ("fidelity", "equal_responses", "compared_responses", "tree_budget", "best_budget", "lossy",
              "incomplete", "verify_paths", "flags")


def to_csv(report: Report, by: str | None = None) -> str:
    """Every field, one row per ReportRow (by None), or one row per aggregated row of `aggregate(report, by)` in the
    table's order (`--by`); empty cells for unknown values."""
    if by is not None:
        return groups_csv(aggregate(report, by))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    codes = code_ids(report.rows)
    writer.writerow(FIELDS + ("code", "flags"))
    for r in report.rows:
        cells = [_csv_cell(r, f) for f in FIELDS]
        writer.writerow(cells + [code_label(r.code, codes) if r.code else "", ";".join(r.flags)])
    return buf.getvalue()


def groups_csv(groups: Sequence[GroupRow], extra: Sequence[str] = (), extra_cells: Sequence[Sequence[Any]] = ()) -> str:
    """Aggregated rows, each spread as its mean and std columns, then the `extra` columns given per row."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    codes = code_ids(groups)
    writer.writerow(GROUP_FIELDS + tuple(f"{f}_{part}" for f in SPREAD_FIELDS for part in ("mean", "std"))
                    + GROUP_TAIL + tuple(extra))
    for k, g in enumerate(groups):
        head = {"hosts": ";".join(g.hosts), "code": code_label(g.code, codes) if g.code else ""}
        cells = [head[f] if f in head else getattr(g, f) for f in GROUP_FIELDS]
        for f in SPREAD_FIELDS:
            spread = getattr(g, f)
            cells += ["", ""] if spread is None else [spread.mean, spread.std]
        cells += [";".join(g.flags) if f == "flags" else _csv_cell(g, f) for f in GROUP_TAIL]
        cells += list(extra_cells[k]) if extra else []
        writer.writerow(["" if c is None else c for c in cells])
    return buf.getvalue()


def _csv_cell(row: Any, field: str) -> Any:
    if field == "verify_paths":
        return ";".join(f"{label}={rounds}" for label, rounds in row.verify_paths)
    value = getattr(row, field)
    return "" if value is None else value


def group_columns(groups: Sequence[GroupRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells for aggregated rows: each number as mean ± std over its n runs (n shown once per row)."""
    show_model = len({_short_model(g.model) for g in groups}) > 1  # engines name one target by different paths
    show_attn = len({g.attn for g in groups}) > 1
    by = groups[0].by if groups else "method"
    by_host = by in ("host", "run")
    codes = code_ids(groups)
    show_code = len(codes) > 1 or by == "patchset"
    show_verify = any(g.verify_paths for g in groups)
    headers = (["Run"] if by == "run" else []) + (["Host"] if by_host else ["Hosts"]) + (
        ["Code"] if show_code else []) + (["Model"] if show_model else []) + [
        "Dataset", "T"] + (["Attn"] if show_attn else []) + ["Method"] + (["Verify"] if show_verify else []) + [
        "tok/s", "Speedup", "τ", "TTFT", "n", "Resp", "Fidelity", "Flags"]
    rows = []
    for g in groups:
        ttft = _scaled(g.mean_ttft_s, 1000)
        cells = ([g.run_id] if by == "run" else []) + ([g.host] if by_host else [str(len(g.hosts))]) + (
            [code_label(g.code, codes)] if show_code else []) + ([_short_model(g.model)] if show_model else []) + [
            _s(g.dataset), _num(g.temperature, "g")] + ([_s(g.attn)] if show_attn else []) + [g.method] + (
            [verify_cell(g.verify_paths) or "—"] if show_verify else []) + [
            _spread(g.tokens_per_s, ".1f"), _spread(g.speedup, ".2f", "x"), _spread(g.acceptance_length, ".2f"),
            _spread(ttft, ".1f", " ms"), str(g.runs), str(g.n_responses), _group_fidelity(g), ", ".join(g.flags)]
        rows.append(cells)
    return headers, rows


def _group_fidelity(g: GroupRow) -> str:
    """Sampled runs draw different tokens by design: an output match rate only means something when greedy."""
    if g.temperature not in (None, 0) and g.method != "baseline":
        return "— (sampled)"
    if g.fidelity is None:
        return "—"
    return f"{_pct(g.fidelity)} ({g.equal_responses}/{g.compared_responses})"


def _spread(s: Spread | None, fmt: str, suffix: str = "") -> str:
    if s is None:
        return "—"
    if s.n == 1:
        return f"{s.mean:{fmt}}{suffix}"
    return f"{s.mean:{fmt}} ± {s.std:{fmt}}{suffix}"


def _scaled(s: Spread | None, k: float) -> Spread | None:
    return None if s is None else Spread(s.mean * k, s.std * k, s.low * k, s.high * k, s.n)


def groups_markdown(groups: Sequence[GroupRow]) -> str:
    """Aggregated rows as a GitHub-flavoured table, lossy rows flagged, their notes below."""
    headers, rows = group_columns(groups)
    return md_table(headers, rows, groups) + md_notes(groups)


def md_table(headers: list[str], rows: list[list[str]], items: Sequence[Any]) -> str:
    method_col, flags_col = headers.index("Method"), headers.index("Flags")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r, cells in zip(items, rows):
        cells = [c.replace("|", "\\|") for c in cells]
        if r.best_budget:
            cells[method_col] = f"**{cells[method_col]}**"
        for warning in (NOT_LOSSLESS, REFERENCE_PATH):
            cells[flags_col] = cells[flags_col].replace(warning, f"⚠ {warning}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def md_notes(items: Sequence[Any]) -> str:
    notes = [f"- {note_label(r)}: {r.note}" for r in items if r.note]
    return ("\n" + "\n".join(notes) + "\n") if notes else ""


def note_label(row: Any) -> str:
    """Who a lossy note is about: host (or "all hosts"), target and dataset, method."""
    where = row.host if row.host != "all" else "all hosts"
    model = f" {_short_model(row.model)}" if row.model else ""
    return f"{where}{model} {row.dataset} {row.method}"


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "—" if value is None else f"{value:{fmt}}{suffix}"


def _pct(value: float | None) -> str:
    if value is None:
        return "—"
    return "100%" if value == 1 else f"{value * 100:.1f}%"


def _s(value: str | None) -> str:
    return "—" if value is None else value


def _short_model(model: str | None) -> str:
    return "—" if model is None else model.rsplit("/", 1)[-1]
