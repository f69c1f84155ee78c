"""`ddops playbook lint`: check a patch playbook or bench plan without hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddops.cli.options import command
from ddops.cli.render import console, escape, write_document
from ddops.cli.state import state

playbook_app = typer.Typer(help="Check your own playbooks and bench plans.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(playbook_app, name="playbook")


@command(playbook_app, "lint")
def lint(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A patch playbook or bench plan (YAML).", show_default=False)],
    sample: Annotated[Optional[list[str]], typer.Option(
        "--sample", help="A copy of a file the playbook patches: FILE (matched by its name) or REPO_PATH=FILE; "
                         "repeatable.", show_default=False)] = None,
    diff: Annotated[bool, typer.Option("--diff", help="Show what the playbook would write to each sample.")] = False,
) -> None:
    """Validate the schema (exit 2 with file:line); with --sample, try every transform and check on the sample
    (exit 1 when a patch finds no site, a check fails or a second pass would change the file)."""
    from ddops.errors import PlaybookError, UsageError
    from ddops.patching.playbook import parse_playbook
    from ddops.yamlsrc import load_yaml_file

    doc = load_yaml_file(file, PlaybookError)
    if isinstance(doc.data, dict) and doc.data.get("kind", "patch") != "patch" or _is_bench_plan(doc.data):
        from ddops.bench.plan import load_bench_plan

        plan = load_bench_plan(file)
        if sample:
            raise UsageError("--sample tries patch playbooks; a bench plan has no transform to try")
        if state(ctx).json:
            write_document(0, {"file": str(file), "kind": "bench plan", "name": plan.name})
            return
        console.print(f"{escape(str(file))}: ok (bench plan {escape(plan.name)})")
        return
    book = parse_playbook(doc)
    as_json = state(ctx).json
    if not as_json:
        console.print(f"{escape(str(file))}: ok (playbook {escape(book.name)}: {len(book.patches)} patches over "
                      f"{', '.join(book.files)})")
    reports = [_lint_sample(book, spec, diff, show=not as_json) for spec in sample or ()]
    failed = not all(ok for ok, _ in reports)
    if as_json:
        write_document(int(failed), {"file": str(file), "kind": "playbook", "name": book.name,
                                                      "files": list(book.files),
                                                      "samples": [found for _, found in reports]})
    if failed:
        raise typer.Exit(1)


def _is_bench_plan(data: object) -> bool:
    from ddops.patching.playbook import _BENCH_KEYS

    return isinstance(data, dict) and "patches" not in data and any(k in data for k in _BENCH_KEYS)


def _lint_sample(book, spec: str, show_diff: bool, show: bool = True) -> tuple[bool, dict]:
    from ddops.errors import UsageError
    from ddops.patching.lint import lint_sample, sample_target

    explicit, _, path = spec.rpartition("=") if "=" in spec else (None, "", spec)
    try:
        source = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise UsageError(f"--sample {path}: cannot read it ({exc.strerror})") from None
    target = sample_target(book, path, explicit or None)
    report = lint_sample(book, target, source, sample=path)
    found = {"sample": path, "target": target, "ok": report.ok,
             "findings": [{"patch": f.patch, "state": str(f.state), "ok": f.ok, "message": f.message}
                          for f in report.findings],
             "checks": [{"name": c.name, "ok": c.ok, "message": c.message} for c in report.checks],
             "second_pass_changes": bool(report.second_pass_changes)}
    if not show:
        return report.ok, found
    for f in report.findings:
        mark = "[green]ok[/]  " if f.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {escape(target)} ({escape(path)}): {escape(f.patch)}: {f.state}"
                      + ("" if f.ok and f.state != "partial" else f": {escape(f.message)}"))
    for c in report.checks:
        mark = "[green]ok[/]  " if c.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {escape(target)}: check {escape(c.name)}" + ("" if c.ok else f": {escape(c.message)}"))
    if report.second_pass_changes:
        console.print(f"[bold red]FAIL[/] {escape(target)}: applying the playbook a second time changes the file "
                      "again (a transform does not recognise its own result)")
    if show_diff and report.diff:
        console.print(escape(report.diff), end="")
    return report.ok, found
