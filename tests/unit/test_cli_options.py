"""Where an option goes on the command line does not matter: every global option works before or after the
command's name, and every command that selects hosts takes the same four options."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from ddops.cli.app import app
from ddops.cli.options import with_global_options
from ddops.cli.state import AppState

GLOBAL = ("--inventory", "--json", "--verbose", "--forks", "--accept-new", "--ask-key-passphrase", "--all-rows")


def every_command() -> list[tuple[str, Any]]:
    root = typer.main.get_command(app)
    found = []

    def walk(prefix: str, group: Any) -> None:
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                walk(f"{prefix} {name}", cmd)
            else:
                found.append((f"{prefix} {name}".strip(), cmd))

    walk("", root)
    return found


@pytest.mark.parametrize("name,cmd", every_command(), ids=[n for n, _ in every_command()])
def test_every_command_takes_the_global_options_after_its_name(name, cmd):
    taken = {opt for p in cmd.params for opt in getattr(p, "opts", ())}
    assert set(GLOBAL) <= taken, f"ddops {name} lacks {set(GLOBAL) - taken}"


def test_global_options_given_after_the_command_count_as_if_given_before():
    seen = {}

    def probe(ctx: typer.Context) -> None:
        seen["state"] = ctx.find_root().obj

    wrapped = with_global_options(probe)
    st = AppState(inventory="before.yaml", forks=32)
    ctx = type("Ctx", (), {"find_root": lambda self: self, "obj": st, "command_path": "ddops probe"})()
    wrapped(ctx, inventory="after.yaml", json_out=True, verbose=2, forks=4, accept_new=True, ask_key_passphrase=True,
            all_rows=True)
    assert (st.inventory, st.json, st.verbose, st.forks, st.accept_new) == ("after.yaml", True, 2, 4, True)
    assert st.ask_key_passphrase and st.all_rows
    wrapped(ctx, inventory=None, json_out=False, verbose=0, forks=None, accept_new=False, ask_key_passphrase=False,
            all_rows=False)
    assert (st.inventory, st.json, st.verbose, st.forks, st.accept_new) == ("after.yaml", True, 2, 4, True)


def test_a_command_with_a_selection_gets_the_four_host_options_as_one_value_and_hosts_after_its_name():
    got = {}

    def probe(selection) -> None:  # noqa: ANN001 - the wrapper supplies it
        got["selection"] = selection

    wrapped = with_global_options(probe)
    names = list(__import__("inspect").signature(wrapped).parameters)
    assert {"host", "group", "all_", "limit", "adhoc_hosts"} <= set(names) and "selection" not in names
    st = AppState()
    ctx = type("Ctx", (), {"find_root": lambda self: self, "obj": st, "command_path": "ddops probe"})()
    wrapped(ctx, host=["a"], group=None, all_=False, limit="g*", inventory=None, json_out=False, verbose=0,
            forks=None, accept_new=False, ask_key_passphrase=False, all_rows=False, adhoc_hosts="root@gpu-a:22")
    assert got["selection"].hosts == ("a",) and got["selection"].limit == "g*" and not got["selection"].all
    assert st.adhoc_hosts == "root@gpu-a:22"  # as if `-H root@gpu-a:22` came before the command's name


def test_hosts_after_the_name_is_only_for_commands_that_select_hosts():
    # `testbed up --hosts N` counts hosts: a command without a selection keeps its own --hosts.
    names = list(__import__("inspect").signature(with_global_options(lambda: None)).parameters)
    assert "adhoc_hosts" not in names


@pytest.mark.parametrize("name", ["patch", "sync", "deploy"])
def test_the_commands_that_change_hosts_take_exit_code_for_ci(name):
    [cmd] = [c for n, c in every_command() if n == name]
    assert "--exit-code" in {opt for p in cmd.params for opt in getattr(p, "opts", ())}
