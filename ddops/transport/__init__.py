"""SSH transport: the only place that imports paramiko.

connector (opens sessions: host keys, sockets, ProxyJump chains) -> session (commands, files, agent calls) ->
agent_client (the agent's line protocol) -> channel (the one channel reader); hostkeys, sockets, streamlocal
(paramiko's private API, nowhere else) and resident (the book of resident agents) beside them."""

import importlib
import importlib.util
import logging
import sys
import types


class _ImportedOnFirstUse(types.ModuleType):
    """Stands for a module until one of its names is used, then imports it (under the import system's lock, so
    threads may race for it) and answers from it."""

    def __getattr__(self, name: str) -> object:
        if sys.modules.get(self.__name__) is self:  # asked while still standing in: there is no real one yet
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} yet")
        return getattr(importlib.import_module(self.__name__), name)


def _import_paramiko() -> None:
    """Where invoke is installed (the `fabric` extra), paramiko imports it for its ssh_config parser's `Match exec`,
    which ddops' CLI never uses (ssh_config is read through `ssh -G`); invoke's own imports (asyncio, unittest.mock)
    would cost every connecting command ~50 ms of CPU (RESULTS.md). So paramiko's import gets a stand-in that imports
    invoke when `Match exec` first uses it; every later `import invoke` (ddops.fabric, the user's scripts) gets the
    real module. (importlib's LazyLoader does not do here: on Python 3.11 paramiko's `import invoke` loads it.)"""
    stand_in = None
    if "invoke" not in sys.modules and importlib.util.find_spec("invoke") is not None:
        stand_in = sys.modules["invoke"] = _ImportedOnFirstUse("invoke")
    try:
        import paramiko  # noqa: F401
    finally:
        if stand_in is not None and sys.modules.get("invoke") is stand_in:
            del sys.modules["invoke"]


_import_paramiko()

from ddops.transport.channel import CommandResult  # noqa: E402  (paramiko is imported above)
from ddops.transport.connector import Connector  # noqa: E402
from ddops.transport.session import Session  # noqa: E402

# paramiko logs what it also raises (a refused channel is an ERROR record); with no handler configured, Python would
# print those on stderr. ddops reports failures itself, in one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

__all__ = ["CommandResult", "Connector", "Session"]
