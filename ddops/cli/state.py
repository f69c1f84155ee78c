"""The running command's state: its global options, given before or after its name, and its inventory."""

from __future__ import annotations

import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from ddops.inventory import Inventory
    from ddops.transport import Connector


@dataclass(slots=True)
class AppState:
    """Global options, set once by the top-level callback."""

    inventory: str | None = None
    json: bool = False
    verbose: int = 0
    forks: int | None = None  # None: the fleet's DEFAULT_FORKS (ddops.fleet loads only when hosts are worked on)
    accept_new: bool = False
    ask_key_passphrase: bool = False
    adhoc_hosts: str | None = None  # -H user@host:port,...: these hosts instead of an inventory file
    all_rows: bool = False  # --all-rows: the recap never folds
    command: str = ""  # the running command's name (`bench status`): its --json document's and its progress title
    _inventory_cache: Any = field(default=None, repr=False)

    def given_here(self, *, inventory: str | None, json_out: bool, verbose: int, forks: int | None,
                   accept_new: bool, ask_key_passphrase: bool, all_rows: bool, adhoc_hosts: str | None = None) -> None:
        """Global options given after the command's name: they count as if given before it."""
        if inventory is not None:
            self.inventory = inventory
            self._inventory_cache = None
        if adhoc_hosts is not None:
            self.adhoc_hosts = adhoc_hosts
            self._inventory_cache = None
        self.json = self.json or json_out
        self.verbose += verbose
        if forks is not None:
            self.forks = forks
        self.accept_new = self.accept_new or accept_new
        self.ask_key_passphrase = self.ask_key_passphrase or ask_key_passphrase
        self.all_rows = self.all_rows or all_rows

    def load_inventory(self) -> Inventory:
        from ddops.inventory import adhoc_inventory, inventory_path, load_inventory

        if self._inventory_cache is None:
            self._inventory_cache = (adhoc_inventory(self.adhoc_hosts) if self.adhoc_hosts is not None
                                     else load_inventory(inventory_path(self.inventory)))
        return self._inventory_cache

    def connector(self, inventory: Inventory) -> Connector:
        from ddops.transport import Connector

        # An encrypted key the ssh-agent lacks is asked for on a terminal (or wherever --ask-key-passphrase says).
        ask = read_passphrase if self.ask_key_passphrase or sys.stdin.isatty() else None
        return Connector(inventory.known_hosts, accept_new=self.accept_new,
                         jump_hosts=(*inventory.hosts, *inventory.jump_hosts), ask_passphrase=ask)


def read_passphrase(prompt: str) -> str | None:
    """A passphrase from the terminal (not echoed), else a line of stdin; None at end of input."""
    import getpass
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", getpass.GetPassWarning)  # no terminal: --ask-key-passphrase reads stdin
        try:
            return getpass.getpass(prompt, stream=sys.stderr)
        except EOFError:
            return None


# The running command's global options, for renderers deep in a command (the recap's -v columns).
_current_state: ContextVar[AppState | None] = ContextVar("ddops_app_state", default=None)


def current_state() -> AppState | None:
    """The running command's global options (None before a command started)."""
    return _current_state.get()


def state(ctx: typer.Context) -> AppState:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = AppState()
    _current_state.set(root.obj)
    return root.obj
