"""`ddops`: the typer application, global options, and the single error table."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ddops import __version__
from ddops.cli import hosts as hosts_cmds
from ddops.cli import testbed as testbed_cmds
from ddops.cli.options import (JSON_FLAG, AcceptNewOpt, AllRowsOpt, AskKeyPassphraseOpt, ForksOpt, InventoryOpt,
                               JsonOpt, VerboseOpt)
from ddops.cli.render import err_console, escape, hinted, write_document
from ddops.cli.state import AppState, current_state
from ddops.errors import EXIT_USAGE, DdopsError

app = typer.Typer(
    name="ddops",
    help="Keep a fleet of GPU hosts patched, synced and benchmarked over SSH.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's plain help: typer's rich help formatter loads a markdown parser and pygments, which put `ddops
    # --help` over its start-time budget on a slow machine.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"ddops {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    ctx: typer.Context, inventory: InventoryOpt = None, json_out: JsonOpt = False, verbose: VerboseOpt = 0,
    forks: ForksOpt = None, accept_new: AcceptNewOpt = False,
    adhoc_hosts: Annotated[str | None, typer.Option(
        "--hosts", "-H", help="Work on these hosts, not an inventory's: [user@]host[:port], comma-separated "
                              "(~/.ssh/config fills in the rest; after the command's name: --hosts, as -H is "
                              "--host there).", show_default=False)] = None,
    ask_key_passphrase: AskKeyPassphraseOpt = False, all_rows: AllRowsOpt = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    ctx.obj = AppState(inventory=inventory, json=json_out, verbose=verbose, accept_new=accept_new,
                       ask_key_passphrase=ask_key_passphrase, adhoc_hosts=adhoc_hosts, all_rows=all_rows, forks=forks)


hosts_cmds.register(app)
testbed_cmds.register(app)
for module_name in ("ddops.cli.patch", "ddops.cli.sync", "ddops.cli.bench", "ddops.cli.exec", "ddops.cli.playbook",
                    "ddops.cli.inventory", "ddops.cli.backups"):
    try:
        module = __import__(module_name, fromlist=["register"])
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        continue
    module.register(app)


def wants_json(argv: list[str]) -> bool:
    """--json among the options (not after `--`, where an ad-hoc command's own words start)."""
    return JSON_FLAG in (argv[:argv.index("--")] if "--" in argv else argv)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turn DdopsErrors into one line and an exit code."""
    try:
        rv = app(args=argv, prog_name="ddops", standalone_mode=False)
    except DdopsError as exc:
        # One line whatever its length (soft_wrap): scripts and CI logs grep for it.
        err_console.print(f"[bold red]ddops: error:[/] {escape(hinted(str(exc)))}", soft_wrap=True)
        current = current_state()
        if current is not None and current.json:  # --json: still one document on stdout, saying what went wrong
            write_document(exc.exit_code, {"error": hinted(str(exc))})
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # typer's (vendored) click errors: a bad option, a value out of range
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            err_console.print(f"[bold red]ddops: error:[/] {escape(str(exc))}", soft_wrap=True)
        code = exc.exit_code if exc.exit_code else EXIT_USAGE
        if wants_json(sys.argv[1:] if argv is None else argv):
            # The command line did not parse, so no command ran to say --json: still one document on stdout.
            context = getattr(exc, "ctx", None)
            command = context.command_path.partition(" ")[2] if context is not None else ""
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            write_document(code, {"error": message}, command=command)
        sys.exit(code)
    except typer.Abort:
        err_console.print("ddops: aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err_console.print("ddops: interrupted")
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)
