"""`ddops exec [selection] -- CMD ARGS...`: one ad-hoc command on every selected host."""

from __future__ import annotations

import sys
import threading
from typing import Annotated, Any, Optional, Sequence

import typer

from ddops.cli.common import (AllOpt, ForksOpt, GroupOpt, HostOpt, JsonOpt, LimitOpt, console, emit_json, escape,
                              finish, selected_hosts, state)

CommandArg = Annotated[Optional[list[str]], typer.Argument(
    help="The program and its arguments, after `--`; each word reaches the host as one quoted argument.",
    show_default=False)]
ShellOpt = Annotated[Optional[str], typer.Option(
    "--shell", help="A shell command line instead ('CMD | CMD'), run by the user's login shell.", show_default=False)]
InRepoOpt = Annotated[bool, typer.Option("--in-repo", help="Run in the host's repo directory.")]
SudoOpt = Annotated[bool, typer.Option("--sudo", help="Run through `sudo -n` where the user is not root "
                                                      "(refused, never prompted, when sudo wants a password).")]
TimeoutOpt = Annotated[Optional[float], typer.Option(
    "--timeout", help="Seconds before the command is ended on the host (default: the host's command_timeout).",
    show_default=False)]
GroupedOpt = Annotated[bool, typer.Option("--grouped", help="Show hosts with identical output and exit code once, "
                                                            "after all have finished, instead of streaming.")]


def register(app: typer.Typer) -> None:
    # Options end at the command's first word, so `ddops exec --all ls -la` passes -la to ls (`--` is clearer).
    app.command("exec", context_settings={"allow_interspersed_args": False})(exec_command)


def exec_command(ctx: typer.Context, command: CommandArg = None, host: HostOpt = None, group: GroupOpt = None,
                 all_: AllOpt = False, limit: LimitOpt = None, shell: ShellOpt = None, in_repo: InRepoOpt = False,
                 sudo: SudoOpt = False, timeout: TimeoutOpt = None, grouped: GroupedOpt = False,
                 json_out: JsonOpt = False, forks: ForksOpt = None) -> None:
    """Run one command on the selected hosts: output streamed per host, exit 1 when any host fails."""
    from ddops.tasks.adhoc import ExecSpec, exec_host
    from ddops.fleet import run_fleet

    st = state(ctx)
    st.json = st.json or json_out
    spec = ExecSpec(argv=tuple(command or ()), shell=shell, in_repo=in_repo, sudo=sudo, timeout=timeout)
    inventory, chosen = selected_hosts(st, host, group, all_, limit)
    streaming = not (st.json or grouped)
    printer = _LinePrinter([h.name for h in chosen]) if streaming else None
    connector = st.connector(inventory)
    try:
        connector.prepare(chosen)
        results = run_fleet(chosen, lambda h, s: exec_host(h, s, spec, printer.line if printer else None),
                            connector.connect, forks=forks or st.forks)
    finally:
        connector.close()
    if st.json:
        emit_json("exec", results, {"argv": list(spec.argv), "shell": spec.shell, "in_repo": spec.in_repo,
                                    "sudo": spec.sudo, "timeout_s": spec.timeout})
    else:
        if grouped:
            _show_groups(results)
        _summary(results)
    finish(results)


class _LinePrinter:
    """Each host's lines as they arrive, prefixed by the host: stdout lines on stdout, stderr lines on stderr."""

    def __init__(self, names: Sequence[str]) -> None:
        self.width = max((len(n) for n in names), default=0)
        self.lock = threading.Lock()

    def line(self, host: str, stream: str, text: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        with self.lock:  # whole lines, never two hosts' halves on one line
            out.write(f"{host:<{self.width}} | {text}\n")
            out.flush()


def _show_groups(results: Sequence[Any]) -> None:
    from ddops.tasks.adhoc import group_outputs, outputs_of

    for g in group_outputs(outputs_of(results)):
        code = "timed out" if g.output.timed_out else f"exit {g.output.exit_code}"
        title = f"{len(g.hosts)} hosts · {code} ({', '.join(g.hosts)})" if len(g.hosts) > 1 else f"{g.hosts[0]} · {code}"
        console.rule(escape(title), align="left")
        for text, label in ((g.output.stdout, ""), (g.output.stderr, "stderr: ")):
            for line in text.splitlines():
                console.print(f"[dim]{label}[/]{escape(line)}" if label else escape(line), soft_wrap=True)


def _summary(results: Sequence[Any]) -> None:
    """What went wrong per host, and one count line, on stderr (stdout keeps the command's output)."""
    from ddops.fleet import counts

    for r in results:
        if r.failed:
            message = r.message.removeprefix(f"{r.host}: ")
            print(f"{r.host}: {r.status}: {message}", file=sys.stderr)
    summary = ", ".join(f"{n} {s}" for s, n in counts(results).items())
    print(f"{len(results)} host{'s' if len(results) != 1 else ''}: {summary}", file=sys.stderr)
