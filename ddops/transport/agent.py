"""The host agent as shipped: its source text and the bootstrap program that runs it from stdin."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

import ddops
from ddops.errors import AgentError

# Run as `python -c BOOTSTRAP N`: stdin holds N bytes of agent source, then the JSON request, which the
# agent's main() reads. Kept free of anything newer than Python 3.8 since it runs on the hosts.
BOOTSTRAP = """\
import json, sys
def _ddops_fail(message):
    sys.stdout.write(json.dumps({"ok": False, "error": {"kind": "bootstrap", "message": message}}) + "\\n")
    sys.stdout.flush()
n = int(sys.argv[1])
source = sys.stdin.buffer.read(n)
if len(source) != n:
    _ddops_fail("agent source cut short: got %d of %d bytes" % (len(source), n))
    sys.exit(0)
namespace = {"__name__": "__ddops_agent__", "AGENT_SOURCE": source}
try:
    exec(compile(source, "<ddops-agent>", "exec"), namespace)
except Exception as error:
    _ddops_fail("agent source does not load on Python %s: %s: %s" % (sys.version.split()[0], type(error).__name__, error))
    sys.exit(0)
namespace["main"]()
"""


def remote_dir() -> Path:
    """The `remote/` folder beside the ddops package."""
    return Path(ddops.__file__).resolve().parent.parent / "remote"


@functools.lru_cache(maxsize=1)
def agent_source() -> bytes:
    """remote/agent.py followed by the sorted remote/agent_*.py extensions, as shipped to hosts."""
    folder = remote_dir()
    core = folder / "agent.py"
    if not core.is_file():
        raise AgentError(f"agent source not found at {core} (ddops must run from a checkout with remote/)",
                         kind="no_agent_source")
    parts = [core, *sorted(folder.glob("agent_*.py"))]
    # Each part ends on its own line so that one file's last line cannot run into the next file's first.
    return b"".join(f"# --- remote/{part.name} ---\n".encode() + part.read_bytes().rstrip(b"\n") + b"\n"
                    for part in parts)


def bootstrap_command(python: str, n: int) -> str:
    """The shell command that runs the agent with `python`, reading `n` bytes of source from stdin."""
    return " ".join(shlex.quote(word) for word in (python, "-c", BOOTSTRAP, str(n)))
