"""Starts the ddops agent on a host from the bundle on stdin (stdlib only, Python >= 3.8).

Run as `python -S -c "<this file>" N [--sha256=HEX] [--serve] [--linger=SECONDS] [--lifetime=SECONDS]
[--probe-resident]` (or, for a bench run's detached runner, as `python -S bootstrap.py N`): stdin holds N bytes of
agent bundle, then requests. The options and the protocol are described in remote/README.md."""

import hashlib
import json
import marshal
import os
import stat
import sys
import zlib

PACKAGE = "ddops_agent"
CACHE_KEEP = 8  # compiled bundles kept per host: every ddops upgrade leaves one behind
MINIMUM_PYTHON = (3, 8)


def fail(message):
    """Answer a request the agent never got to see."""
    sys.stdout.write(json.dumps({"ok": False, "error": {"kind": "bootstrap", "message": message}}) + "\n")
    sys.stdout.flush()


class BundleImporter(object):
    """A meta-path finder and loader over the shipped modules, so that they import one another as a package and
    tracebacks name their files and lines (linecache asks get_source)."""

    def __init__(self, bundle, compiled):
        self.bundle = bundle  # the bytes as shipped, for a verb that starts the agent again (protocol.shipped_bundle)
        self.modules = dict((name, (filename, is_package, code)) for name, filename, is_package, code in compiled)
        self.order = [entry[0] for entry in compiled]
        self.sources = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.modules:
            return None
        from importlib.machinery import ModuleSpec

        filename, is_package, _ = self.modules[fullname]
        spec = ModuleSpec(fullname, self, origin=filename, is_package=is_package)
        spec.has_location = True  # sets __file__
        return spec

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        exec(self.modules[module.__name__][2], module.__dict__)

    def get_source(self, fullname):
        if self.sources is None:
            self.sources = dict((entry[0], entry[3]) for entry in bundle_document(self.bundle)["modules"])
        return self.sources.get(fullname)

    def load(self):
        """The agent package, every shipped module imported (each registers its verbs); its modules are attributes
        of it. Once per process: verbs keep no state from one request to the next."""
        for name in self.order:
            __import__(name)
        return sys.modules[PACKAGE]


def bundle_document(bundle):
    """The bundle's JSON document, from the zlib-compressed bytes shipped."""
    return json.loads(zlib.decompress(bundle).decode("utf-8"))


def compile_bundle(bundle):
    """[(module name, file name, is package, code)] from the bundle."""
    return [(name, filename, is_package, compile(source, filename, "exec"))
            for name, filename, is_package, source in bundle_document(bundle)["modules"]]


def cache_path(digest):
    """Where this host caches the compiled bundle `digest` for this Python."""
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"").hex()
    folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddops")
    return os.path.join(folder, "agent-%s-%s-%s.marshal" % (digest[:32], sys.implementation.cache_tag, magic))


def private_folder(folder):
    """Whether `folder` is a real directory of ours that nobody else may write to (not a symlink)."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def read_cache(path):
    """The compiled bundle cached at `path`, or None: absent, not a regular file of ours that only we may write, in
    a folder that only we may write (not trusted by its name alone: its code runs as us), or it does not load."""
    try:
        if not private_folder(os.path.dirname(path)):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            return marshal.loads(handle.read())
    except Exception:
        return None


def write_cache(path, compiled):
    """Cache the compiled bundle; an unwritable cache (or a folder that is not only ours) only costs speed."""
    try:
        folder = os.path.dirname(path)
        os.makedirs(folder, 0o700, exist_ok=True)
        if not private_folder(folder):
            return
        temp = "%s.%d.tmp" % (path, os.getpid())
        try:
            os.unlink(temp)  # left by a writer that was killed
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temp, flags, 0o600), "wb") as handle:
            handle.write(marshal.dumps(compiled))
        os.replace(temp, path)
        entries = [os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".marshal")]
        for old in sorted(entries, key=os.path.getmtime, reverse=True)[CACHE_KEEP:]:
            os.unlink(old)
    except OSError:
        pass


def option(name, default=None):
    """The value of `--name=VALUE` among the options, or `default`."""
    prefix = "--%s=" % name
    return ([arg[len(prefix):] for arg in sys.argv[2:] if arg.startswith(prefix)] or [default])[0]


def main():
    # Checked first, in code that Python 2.7 still runs: an older host gets one line, not a traceback.
    if sys.version_info < MINIMUM_PYTHON:
        return fail("needs Python >= %d.%d (found %s)" % (MINIMUM_PYTHON + (sys.version.split()[0],)))
    size = int(sys.argv[1])
    serve = "--serve" in sys.argv[2:]
    digest = option("sha256")
    linger = float(option("linger", 0))
    stdin = sys.stdin.buffer
    if serve:
        # Requests keep coming on the channel: read them from a descriptor of our own, and give fd 0 to /dev/null
        # so that no child process can read them.
        stdin = os.fdopen(os.dup(0), "rb")
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    bundle = stdin.read(size)
    if len(bundle) != size:
        return fail("agent bundle cut short: got %d of %d bytes" % (len(bundle), size))
    # Only a hash checked against the bytes received names the cache (and a resident).
    verified = bool(digest) and hashlib.sha256(bundle).hexdigest() == digest
    cache = cache_path(digest) if verified else None
    try:
        compiled = read_cache(cache) if cache else None
        if compiled is None:
            compiled = compile_bundle(bundle)
            if cache:
                write_cache(cache, compiled)
        importer = BundleImporter(bundle, compiled)
        sys.meta_path.insert(0, importer)
        agent = importer.load()
    except Exception as error:
        return fail("agent bundle does not load on Python %s: %s: %s"
                    % (sys.version.split()[0], type(error).__name__, error))
    if not serve:
        return agent.protocol.main()
    resident = agent.resident.resident_socket_path(digest) if linger > 0 and verified else None
    announce = None
    while True:
        line = stdin.readline()
        if not line:
            break
        if resident:
            announce, resident = offer_resident(agent, resident, linger, stdin), None
        response = agent.protocol.answer(line)
        if announce is not None:
            response.update(announce(agent))
            announce = None
        sys.stdout.write(agent.protocol.encode_response(response))
        sys.stdout.flush()


def offer_resident(agent, path, linger, stdin):
    """Start the resident for socket `path` now (it binds while the first request is answered), or learn the secret
    of the one that serves it already; a function of the agent that answers the first request to the fields
    announcing it: the path and its secret (a new resident's only once its socket is bound), and with
    --probe-resident whether a resident already listened there."""
    probing = "--probe-resident" in sys.argv[2:]
    alive = agent.resident.resident_alive(path) if probing else None
    # Without a probe, a resident that serves this name was started for another controller (or one that lost its
    # book): it tells us its secret, and this controller uses it from the next command on.
    secret = None if probing else agent.resident.secret_of_resident(path)
    ready = None
    if not alive and secret is None:  # else a live resident holds this name: ours would only find it taken
        secret = agent.resident.new_secret()
        lifetime = float(option("lifetime", 0)) or agent.resident.MAX_LIFETIME
        ready = agent.resident.start_resident(path, secret, linger, lifetime, agent, [stdin.fileno()])

    def announce(current):
        fields = {} if alive is None else {"resident_alive": alive}
        already_there = ready is None and secret is not None
        if already_there or (ready is not None and current.resident.bound_resident(ready)):
            fields.update({"resident": path, "resident_secret": secret.hex()})
        return fields

    return announce


if __name__ == "__main__":
    main()
