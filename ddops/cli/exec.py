"""`ddops exec [selection] -- CMD ARGS...`: one ad-hoc command on every selected host."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddops.cli.onhosts import OnHosts
from ddops.cli.options import command
from ddops.cli.render import console, count_line, escape
from ddops.safe_text import one_line

if TYPE_CHECKING:
    from ddops.inventory import Selection

CommandArg = Annotated[list[str] | None, typer.Argument(
    help="The program and its arguments, after `--`; each word reaches the host as one quoted argument.",
    show_default=False)]
ShellOpt = Annotated[str | None, typer.Option(
    "--shell", help="A shell command line instead ('CMD | CMD'), run by the user's login shell.", show_default=False)]
InRepoOpt = Annotated[bool, typer.Option("--in-repo", help="Run in the host's repo directory.")]
SudoOpt = Annotated[bool, typer.Option("--sudo", help="Run through `sudo -n` where the user is not root "
                                                      "(refused, never prompted, when sudo wants a password).")]
TimeoutOpt = Annotated[float | None, typer.Option(
    "--timeout", help="Seconds before the command is ended on the host (default: the host's command_timeout).",
    show_default=False)]
GroupedOpt = Annotated[bool, typer.Option("--grouped", help="Show hosts with identical output and exit code once, "
                                                            "after all have finished, instead of streaming.")]


def register(app: typer.Typer) -> None:
    # Options end at the command's first word, so `ddops exec --all ls -la` passes -la to ls (`--` is clearer).
    command(app, "exec", context_settings={"allow_interspersed_args": False})(exec_command)


def exec_command(ctx: typer.Context, selection: Selection, command: CommandArg = None, shell: ShellOpt = None,
                 in_repo: InRepoOpt = False, sudo: SudoOpt = False, timeout: TimeoutOpt = None,
                 grouped: GroupedOpt = False) -> None:
    """Run one command on the selected hosts: output streamed per host, exit 1 when any host fails."""
    from ddops.tasks.adhoc import ExecSpec, exec_host
    from ddops.transport.channel import HeldOutput

    spec = ExecSpec(argv=tuple(command or ()), shell=shell, in_repo=in_repo, sudo=sudo, timeout=timeout)
    run = OnHosts(ctx, selection)
    printer = _LinePrinter([h.name for h in run.hosts]) if not (run.json or grouped) else None
    held = HeldOutput()  # what every host's kept output may take together
    results = run.run(lambda h, s: exec_host(h, s, spec, printer.line if printer else None,
                                             cancel=run.interrupt.event, held=held), progress=False)

    def render(results: Sequence[Any]) -> None:
        if grouped:
            _show_groups(results)
        _summary(results)

    run.finish(results, {"argv": list(spec.argv), "shell": spec.shell, "in_repo": spec.in_repo, "sudo": spec.sudo,
                         "timeout_s": spec.timeout}, render=render)


class _LinePrinter:
    """Each host's lines as they arrive, prefixed by the host: stdout lines on stdout, stderr lines on stderr."""

    def __init__(self, names: Sequence[str]) -> None:
        self.width = max((len(n) for n in names), default=0)
        self.lock = threading.Lock()

    def line(self, host: str, stream: str, text: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        with self.lock:  # whole lines, never two hosts' halves on one line
            out.write(f"{host:<{self.width}} | {one_line(text)}\n")
            out.flush()


def _show_groups(results: Sequence[Any]) -> None:
    from ddops.tasks.adhoc import group_outputs, outputs_of

    for g in group_outputs(outputs_of(results)):
        code = "timed out" if g.output.timed_out else f"exit {g.output.exit_code}"
        title = (f"{len(g.hosts)} hosts · {code} ({', '.join(g.hosts)})" if len(g.hosts) > 1
                 else f"{g.hosts[0]} · {code}")
        console.rule(escape(title), align="left")
        for text, label in ((g.output.stdout, ""), (g.output.stderr, "stderr: ")):
            for line in text.splitlines():
                console.print(f"[dim]{label}[/]{escape(line)}" if label else escape(line), soft_wrap=True)


def _summary(results: Sequence[Any]) -> None:
    """What went wrong per host, and one count line, on stderr (stdout keeps the command's output)."""
    for r in results:
        if r.failed:
            print(one_line(f"{r.host}: {r.status}: {r.message}"), file=sys.stderr)
    print(count_line(results), file=sys.stderr)
