"""The host agent as shipped: its source text and the bootstrap program that runs it from stdin."""

from __future__ import annotations

import functools
import hashlib
import shlex
from pathlib import Path

import ddops
from ddops.errors import AgentError

# Run as `python -S -c BOOTSTRAP N [--sha256=HEX] [--serve] [--linger=SECONDS]`: stdin holds N bytes of agent
# source, then requests.
# One-shot (no --serve): one JSON request follows, which the agent's main() reads to EOF.
# --serve: one JSON request per line, one JSON answer per line, until stdin ends (a session's calls share one Python).
# --sha256: the source's hash; the compiled agent is cached on the host under it (compiling costs more than a verb).
# --linger (with --serve and --sha256): when stdin ends, leave a resident agent behind for later sessions, serving
#   on a unix socket until idle for SECONDS (see the agent's "resident" section); the first answer carries the
#   socket's path as "resident". With --probe-resident as well, it also says whether a resident accepts
#   connections there now ("resident_alive"): the controller asks after sshd refused it a channel to that socket.
# -S: no site-packages scan at startup (the agent is stdlib only; `facts` loads site itself for package versions).
# Kept free of anything newer than Python 3.8 since it runs on the hosts.
BOOTSTRAP = """\
import sys
def _ddops_fail(message):
    import json
    sys.stdout.write(json.dumps({"ok": False, "error": {"kind": "bootstrap", "message": message}}) + "\\n")
    sys.stdout.flush()
class _DdopsLazyModule(object):
    # Stands in sys.modules for a standard module until first used: most verbs never touch these, and importing
    # them costs about a third of an agent start. `import x` returns the stand-in (its __spec__ is None, so the
    # import system does not touch anything else); the first attribute read imports the real module.
    __spec__ = None
    def __init__(self, name):
        self.__dict__["_ddops_name"] = name
    def __getattr__(self, attr):
        name = self.__dict__["_ddops_name"]
        if sys.modules.get(name) is self:
            del sys.modules[name]
        module = __import__(name)
        sys.modules[name] = module
        return getattr(module, attr)
for _name in ("base64", "datetime", "glob", "hashlib", "json", "platform", "re", "shlex", "shutil", "signal", "socket",
              "subprocess", "tempfile", "uuid"):
    if _name not in sys.modules:
        sys.modules[_name] = _DdopsLazyModule(_name)
n = int(sys.argv[1])
serve = "--serve" in sys.argv[2:]
digest = ([a[9:] for a in sys.argv[2:] if a.startswith("--sha256=")] or [None])[0]
linger = float(([a[9:] for a in sys.argv[2:] if a.startswith("--linger=")] or [0])[0])
probe_resident = "--probe-resident" in sys.argv[2:]
stdin = sys.stdin.buffer
if serve:
    import os
    # Requests keep coming on the channel: read them from a descriptor of our own, and give fd 0 to /dev/null so
    # that no child process can read them.
    stdin = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
source = stdin.read(n)
if len(source) != n:
    _ddops_fail("agent source cut short: got %d of %d bytes" % (len(source), n))
    sys.exit(0)
code = cache = None
if digest:
    import marshal, os
    try:
        from _sha2 import sha256
    except ImportError:
        try:
            from _sha256 import sha256
        except ImportError:
            from hashlib import sha256
    if sha256(source).hexdigest() == digest:
        magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"").hex()
        cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddops",
                             "agent-%s-%s-%s.marshal" % (digest[:32], sys.implementation.cache_tag, magic))
        try:
            with open(cache, "rb") as handle:
                code = marshal.loads(handle.read())
        except Exception:
            code = None
def _ddops_load():
    namespace = {"__name__": "__ddops_agent__", "AGENT_SOURCE": source}
    exec(code, namespace)
    return namespace
try:
    if code is None:
        code = compile(source, "<ddops-agent>", "exec")
        if cache is not None:
            try:
                os.makedirs(os.path.dirname(cache), 0o700, exist_ok=True)
                temp = "%s.%d.tmp" % (cache, os.getpid())
                with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
                    handle.write(marshal.dumps(code))
                os.replace(temp, cache)
                # Keep the newest few versions: every ddops upgrade leaves one behind.
                folder = os.path.dirname(cache)
                entries = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".marshal")]
                for old in sorted(entries, key=os.path.getmtime, reverse=True)[8:]:
                    os.unlink(old)
            except OSError:
                pass
    namespace = _ddops_load()
except Exception as error:
    _ddops_fail("agent source does not load on Python %s: %s: %s" % (sys.version.split()[0], type(error).__name__, error))
    sys.exit(0)
if not serve:
    namespace["main"]()
    sys.exit(0)
# Only a verified hash names a resident (as it names the cache).
resident = namespace["resident_socket_path"](digest) if linger > 0 and cache is not None else None
announce = resident
while True:
    line = stdin.readline()
    if not line:
        break
    response = namespace["answer"](line)
    if announce:
        response["resident"], announce = announce, None
        if probe_resident:
            response["resident_alive"] = namespace["resident_alive"](resident)
    sys.stdout.write(namespace["encode_response"](response))
    sys.stdout.flush()
    # The next request gets a freshly loaded agent, as a new process would; loading it now overlaps with the
    # controller's work on this answer.
    namespace = _ddops_load()
if resident:
    stdin.close()
    namespace["become_resident"](resident, linger, _ddops_load)
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


@functools.lru_cache(maxsize=1)
def agent_digest() -> str:
    """The sha256 of agent_source(): the key of the compiled agent cached on each host."""
    return hashlib.sha256(agent_source()).hexdigest()


def bootstrap_command(python: str, n: int, *, digest: str | None = None, serve: bool = False,
                      linger: float = 0, probe_resident: bool = False) -> str:
    """The shell command that runs the agent with `python`, reading `n` bytes of source from stdin.

    With `digest` (agent_digest()) the host caches the compiled agent; with `serve` it answers one request per line
    until stdin ends, instead of one request; with `linger` (and both of those) it then stays on as a resident, and
    with `probe_resident` its first answer says whether a resident already listens.
    """
    words = [python, "-S", "-c", BOOTSTRAP, str(n)]
    if digest:
        words.append(f"--sha256={digest}")
    if serve:
        words.append("--serve")
    if linger > 0 and digest and serve:
        words.append(f"--linger={linger:g}")
        if probe_resident:
            words.append("--probe-resident")
    return " ".join(shlex.quote(word) for word in words)
