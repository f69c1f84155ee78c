"""`ddops playbook lint`: check a patch playbook or bench plan without hosts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddops.cli.options import command
from ddops.cli.render import console, escape, write_document
from ddops.cli.state import state

if TYPE_CHECKING:
    from ddops.patching.lint import LintReport, SampleReport

playbook_app = typer.Typer(help="Check your own playbooks and bench plans.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(playbook_app, name="playbook")


@command(playbook_app, "lint")
def lint(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A patch playbook or bench plan (YAML).", show_default=False)],
    sample: Annotated[list[str] | None, typer.Option(
        "--sample", help="A copy of a file the playbook patches: FILE (matched by its name) or REPO_PATH=FILE; "
                         "repeatable.", show_default=False)] = None,
    diff: Annotated[bool, typer.Option("--diff", help="Show what the playbook would write to each sample.")] = False,
) -> None:
    """Validate the schema (exit 2 with file:line); with --sample, try every transform and check on the sample
    (exit 1 when a patch finds no site, a check fails or a second pass would change the file)."""
    from ddops.bench.plan import load_bench_plan
    from ddops.patching.lint import lint_file

    report = lint_file(file, sample or (), load_bench_plan)
    if state(ctx).json:
        write_document(int(not report.ok), report.to_json())
    else:
        render_lint(report, diff)
    if not report.ok:
        raise typer.Exit(1)


def render_lint(report: LintReport, show_diff: bool) -> None:
    if report.patches is None:  # a bench plan
        console.print(f"{escape(report.file)}: ok ({report.kind} {escape(report.name)})")
        return
    console.print(f"{escape(report.file)}: ok (playbook {escape(report.name)}: "
                  f"{len(report.patches or ())} patches over "
                  f"{', '.join(report.files or ())})")
    for sample in report.samples or ():
        render_sample(sample, show_diff)


def render_sample(report: SampleReport, show_diff: bool) -> None:
    target, path = escape(report.target), escape(report.sample)
    for f in report.findings:
        mark = "[green]ok[/]  " if f.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {target} ({path}): {escape(f.patch)}: {f.state}"
                      + ("" if f.ok and f.state != "partial" else f": {escape(f.message)}"))
    for c in report.checks:
        mark = "[green]ok[/]  " if c.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {target}: check {escape(c.name)}" + ("" if c.ok else f": {escape(c.message)}"))
    if report.second_pass_changes:
        console.print(f"[bold red]FAIL[/] {target}: applying the playbook a second time changes the file again (a "
                      "transform does not recognise its own result)")
    if show_diff and report.diff:
        console.print(escape(report.diff), end="")
