"""The host agent as shipped: the bundle of its modules and the bootstrap command that runs it from stdin.

The agent (remote/ddops_agent/) and its bootstrap (remote/bootstrap.py) are described in remote/README.md, with the
protocol. agent_program() is the stable entry point for anything that runs the agent: over ssh (Session) or as a
local subprocess (`program.argv(sys.executable, serve=True)`, then write `program.bundle`, then requests)."""

from __future__ import annotations

import hashlib
import json
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddops.errors import AgentError
from ddops.resources import remote_dir

AGENT_PACKAGE = "ddops_agent"

__all__ = ["AgentProgram", "agent_digest", "agent_program", "agent_request", "agent_source", "build_program",
           "remote_dir"]


@dataclass(frozen=True)
class AgentProgram:
    """What runs the agent on a host: `python -S -c bootstrap N [options]`, with `bundle` (N bytes) on stdin first.

    digest: the bundle's sha256, the key of the compiled agent cached on each host and of its resident."""

    bootstrap: str
    bundle: bytes
    digest: str

    def argv(self, python: str, *, cache: bool = True, serve: bool = False, linger: float = 0,
             probe_resident: bool = False, lifetime: float = 0) -> list[str]:
        """The command's words (shlex.join them for a shell). cache: pass the digest (the host caches the compiled
        bundle); serve: one answer per request line until stdin ends; linger (with cache and serve): then stay on as
        a resident, for at most `lifetime` seconds (0: the agent's own maximum); probe_resident: the first answer
        says whether a resident already listens."""
        words = [python, "-S", "-c", self.bootstrap, str(len(self.bundle))]
        if cache:
            words.append(f"--sha256={self.digest}")
        if serve:
            words.append("--serve")
        if linger > 0 and cache and serve:
            words.append(f"--linger={linger:g}")
            if lifetime > 0:
                words.append(f"--lifetime={lifetime:g}")
            if probe_resident:
                words.append("--probe-resident")
        return words


def _module_files(folder: Path) -> list[tuple[str, Path]]:
    """(module name, file) of every shipped module: the package first, then its modules in sorted order."""
    package = folder / AGENT_PACKAGE
    init = package / "__init__.py"
    if not init.is_file():
        raise AgentError(f"agent package not found at {package} (ddops is installed without its remote/ files)",
                         kind="no_agent_source")
    # __main__ runs the agent without the bootstrap: not shipped
    return [(AGENT_PACKAGE, init)] + [(f"{AGENT_PACKAGE}.{path.stem}", path)
                                      for path in sorted(package.glob("*.py")) if not path.name.startswith("__")]


def build_program(extra_modules: Mapping[str, str] | None = None) -> AgentProgram:
    """The agent program from remote/, plus `extra_modules` ({"ddops_agent.name": source}; tests add verbs and
    fault injection so)."""
    folder = remote_dir()
    # [module name, file name (what tracebacks say), is a package, source]
    modules = [[name, f"{AGENT_PACKAGE}/{path.name}", name == AGENT_PACKAGE, path.read_text(encoding="utf-8")]
               for name, path in _module_files(folder)]
    for name, source in (extra_modules or {}).items():
        modules.append([name, f"{name.replace('.', '/')}.py", False, source])
    bootstrap = (folder / "bootstrap.py").read_text(encoding="utf-8")
    # The bootstrap travels in the bundle too, so that a verb can start the agent again detached (bench runner).
    document = json.dumps({"bootstrap": bootstrap, "modules": modules}).encode("ascii")
    # Compressed: every session that starts an agent sends it (the bootstrap decompresses it with zlib).
    bundle = zlib.compress(document, 9)
    return AgentProgram(bootstrap, bundle, hashlib.sha256(bundle).hexdigest())


_program: AgentProgram | None = None
_program_lock = threading.Lock()


def agent_program() -> AgentProgram:
    """The agent program as this ddops ships it, built once per process: the first thread to ask builds it and the
    others wait for it (under lru_cache every worker thread that asked before the first build ended compressed a
    copy of its own)."""
    global _program
    with _program_lock:
        if _program is None:
            _program = build_program()
        return _program


def agent_deadline(timeout: float) -> float:
    """The deadline a request carries for the agent: a little before the caller stops waiting, so the agent's
    `timeout` answer (it stops the verb there) still arrives, even from an agent that took a while to start."""
    return max(0.1, timeout - min(5.0, max(1.0, timeout / 5)))


def agent_request(verb: str, payload: Mapping[str, object], timeout: float) -> bytes:
    """One request line for the agent, with the deadline it must answer by (remote/README.md, protocol)."""
    return json.dumps({"verb": verb, "payload": payload, "deadline": round(agent_deadline(timeout), 3)}).encode() \
        + b"\n"


def agent_source() -> bytes:
    """The bytes written to the agent's stdin before any request: the bundle."""
    return agent_program().bundle


def agent_digest() -> str:
    """The sha256 of agent_source()."""
    return agent_program().digest
