"""The options every command shares, declared once, and `command`, which gives each command the global ones (and
the four host options as one Selection)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from ddops import settings
from ddops.cli import completion
from ddops.cli.state import state

# The global options, declared once: the top-level callback and every command take them, so that each works
# before or after the command's name (`ddops -i inv.yaml ping --all` and `ddops ping --all -i inv.yaml`).
InventoryOpt = Annotated[str | None, typer.Option("--inventory", "-i", envvar=settings.INVENTORY.name,
                                                     help="Inventory file (default: ./inventory.yaml).",
                                                     show_default=False)]
# After the command's name without the envvar: DDOPS_INVENTORY must not outvote an `-i` given before it.
_InventoryHereOpt = Annotated[str | None, typer.Option("--inventory", "-i", help="Inventory file (default: "
                                                          "./inventory.yaml).", show_default=False)]
JSON_FLAG = "--json"  # also read from the raw argv when the command line did not parse (app.main)
JsonOpt = Annotated[bool, typer.Option(JSON_FLAG, help="Print one JSON document on stdout and nothing else there "
                                                      "(docs/json.md).")]
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail (repeatable).")]
ForksOpt = Annotated[int | None, typer.Option("--forks", "-f", min=1, help="Hosts worked on at once (default 32).",
                                                 show_default=False)]
# Where a command's own `-f` is a follow (bench logs, bench run), --forks keeps only its long name there.
_ForksLongOpt = Annotated[int | None, typer.Option("--forks", min=1, help="Hosts worked on at once (default 32).",
                                                      show_default=False)]
AcceptNewOpt = Annotated[bool, typer.Option("--accept-new", help="Record unknown host keys (changed keys are always "
                                                                 "refused).")]
AllRowsOpt = Annotated[bool, typer.Option("--all-rows", help="A recap row for every host (past a screenful, only "
                                                             "those to look at are shown, the rest counted).")]
AskKeyPassphraseOpt = Annotated[bool, typer.Option(
    "--ask-key-passphrase", help="Ask the passphrase of an encrypted identity_file the ssh-agent lacks, even without "
                                 "a terminal (one line of stdin).")]
GLOBAL_OPTIONS: dict[str, tuple[Any, Any]] = {  # parameter name -> (annotation, default meaning "not given here")
    "inventory": (_InventoryHereOpt, None), "json_out": (JsonOpt, False), "verbose": (VerboseOpt, 0),
    "forks": (ForksOpt, None), "accept_new": (AcceptNewOpt, False),
    "ask_key_passphrase": (AskKeyPassphraseOpt, False), "all_rows": (AllRowsOpt, False),
}

# The four host-selecting options, declared once; a command that takes a `selection` parameter gets them.
HostOpt = Annotated[list[str] | None, typer.Option("--host", "-H", help="Host name or address (repeatable).",
                                                       show_default=False, autocompletion=completion.hosts)]
GroupOpt = Annotated[list[str] | None, typer.Option("--group", "-g", help="Every host of a group (repeatable).",
                                                        show_default=False, autocompletion=completion.groups)]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Every host in the inventory.")]
LimitOpt = Annotated[str | None, typer.Option("--limit", "-l", help="Globs over names/addresses/groups, "
                                                 "comma-separated; !glob excludes.", show_default=False,
                                                 autocompletion=completion.limit)]
SELECTION_OPTIONS: dict[str, tuple[Any, Any]] = {
    "host": (HostOpt, None), "group": (GroupOpt, None), "all_": (AllOpt, False), "limit": (LimitOpt, None),
}
# `--hosts` after the command's name too (its short form -H is --host there, as in every selecting command).
_AdhocHostsHereOpt = Annotated[str | None, typer.Option(
    "--hosts", help="Work on these hosts, not an inventory's: [user@]host[:port], comma-separated (~/.ssh/config "
                    "fills in the rest).", show_default=False)]
CheckOpt = Annotated[bool, typer.Option("--check", help="Show what would change; write nothing.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ExitCodeOpt = Annotated[bool, typer.Option("--exit-code", help="Exit 3 when a host changed (with --check: would "
                                                               "change) and none failed, as `git diff --exit-code`.")]


def command(app: typer.Typer, name: str, **options: Any) -> Callable[[Callable], Callable]:
    """Register fn as `ddops NAME`, taking the global options too, and, when fn has a `selection` parameter, the
    four host options as one `Selection` value."""
    def register(fn: Callable) -> Callable:
        app.command(name, **options)(with_global_options(fn))
        return fn

    return register


def with_global_options(fn: Callable) -> Callable:
    """fn with the global options (and, for a `selection` parameter, the host options) added to its signature."""
    import functools
    import inspect

    signature = inspect.signature(fn)
    selects = "selection" in signature.parameters
    # Annotations are strings here (postponed evaluation); `selection`'s names a type imported only for checking.
    params = [p.replace(annotation=eval(p.annotation, fn.__globals__) if isinstance(p.annotation, str)  # noqa: S307
                        else p.annotation)
              for p in signature.parameters.values() if p.name != "selection"]
    if "ctx" not in signature.parameters:
        params.insert(0, inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context))
    added = {**(SELECTION_OPTIONS if selects else {}), **GLOBAL_OPTIONS,
             **({"adhoc_hosts": (_AdhocHostsHereOpt, None)} if selects else {})}
    if any("-f" in _flags(p.annotation) for p in params):
        added["forks"] = (_ForksLongOpt, None)
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a, default=d)
               for n, (a, d) in added.items()]

    @functools.wraps(fn)
    def run(ctx: typer.Context, **kwargs: Any) -> Any:
        st = state(ctx)
        st.given_here(**{n: kwargs.pop(n) for n in GLOBAL_OPTIONS}, adhoc_hosts=kwargs.pop("adhoc_hosts", None))
        st.command = ctx.command_path.partition(" ")[2]
        if selects:
            from ddops.inventory import Selection

            host, group, all_, limit = (kwargs.pop(n) for n in SELECTION_OPTIONS)
            kwargs["selection"] = Selection(hosts=tuple(host or ()), groups=tuple(group or ()), all=all_, limit=limit)
        if "ctx" in signature.parameters:
            kwargs["ctx"] = ctx
        return fn(**kwargs)

    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # typer must read the signature above, not fn's
    return run


def _flags(annotation: Any) -> set[str]:
    """The option names an `Annotated[..., typer.Option(...)]` parameter declares (`--follow/--no-follow` split)."""
    names: set[str] = set()
    for info in getattr(annotation, "__metadata__", ()):
        for decl in getattr(info, "param_decls", None) or ():
            names.update(d.strip() for d in decl.split("/"))
    return names


def one_host(name: str) -> Any:
    """The selection of one host named by a command's argument (`ddops backups show HOST ...`)."""
    from ddops.inventory import Selection

    return Selection(hosts=(name,))
