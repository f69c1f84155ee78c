"""What the controller wants to know about a host (the `facts` verb) and who the agent runs as."""

import ast
import os
import platform
import pwd
import re
import shlex
import socket
import sys

from ddops_agent.checks import run_quiet
from ddops_agent.gpus import gpu_health, query_gpus
from ddops_agent.protocol import VERBS, bad_request, optional_str, require_list, verb

# Always reported; a plan's `requires_packages` asks for more (the `packages` of a facts request).
PACKAGES = ("torch", "transformers")
TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(.+?)\s*$", re.M)


# -- facts ----------------------------------------------------------------------------------------------------


def current_user():
    """The name of the user the agent runs as (its uid when it has no passwd entry)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or str(os.geteuid())


def user_name(uid):
    """The name of user `uid`, or the number when it has no passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def os_pretty_name():
    """PRETTY_NAME from os-release, or None."""
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("PRETTY_NAME="):
                value = line.split("=", 1)[1]
                try:
                    return " ".join(shlex.split(value))
                except ValueError:
                    return value.strip("\"'")
    return None


def nearest_existing(path):
    """`path` or its closest existing parent."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def disk_free_bytes(path):
    """Bytes available to us on the filesystem holding `path` (or its nearest existing parent)."""
    try:
        st = os.statvfs(nearest_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def metadata_module():
    """importlib.metadata with site-packages on sys.path, or None (Python < 3.8 has none)."""
    if sys.flags.no_site and "site" not in sys.modules:
        # The bootstrap starts Python with -S (faster); package versions need site-packages on sys.path.
        import site

        site.main()
    try:
        from importlib import metadata
    except ImportError:
        return None
    return metadata


def distribution_version(name):
    """The installed version of distribution `name` without importing it, or None."""
    metadata = metadata_module()
    if metadata is None:
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torch_cuda_version():
    """The CUDA version torch was built with, read from torch/version.py without importing torch (None: a CPU
    build, or no torch)."""
    metadata = metadata_module()
    try:
        path = metadata.distribution("torch").locate_file("torch/version.py")
        with open(str(path), encoding="utf-8") as handle:
            found = TORCH_CUDA.search(handle.read())
        value = ast.literal_eval(found.group(1)) if found else None
    except (AttributeError, OSError, ValueError, SyntaxError, metadata.PackageNotFoundError):
        return None
    return value if isinstance(value, str) else None


def package_names(payload, key="packages"):
    """The distribution names payload[key] lists (absent: none)."""
    names = require_list(payload, key)
    if not all(isinstance(n, str) and n and len(n) < 200 for n in names):
        raise bad_request("payload.%s must hold distribution names" % key)
    return names


def git_head(repo):
    """HEAD of `repo` when it is a git checkout, else None."""
    if not os.path.exists(os.path.join(repo, ".git")):
        return None
    return run_quiet(["git", "rev-parse", "HEAD"], cwd=repo)


def collect_facts(raw_repo, packages=(), health=False):
    """What the controller wants to know about this host before planning; `packages`: more distributions to report
    the versions of; `health`: the GPUs' processes, Xid events and the driver's CUDA version too."""
    repo = os.path.realpath(os.path.expanduser(raw_repo)) if raw_repo else None
    repo_exists = bool(repo) and os.path.isdir(repo)
    gpus, gpu_error = query_gpus()
    names = list(PACKAGES) + [n for n in packages if n not in PACKAGES]
    facts = {
        "hostname": socket.gethostname(),
        "os": os_pretty_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "user": current_user(),
        "gpus": gpus,
        "gpu_error": gpu_error,
        "disk_free_bytes": disk_free_bytes(repo or os.path.expanduser("~")),
        "repo_exists": repo_exists,
        "git_commit": git_head(repo) if repo_exists else None,
        "versions": dict((name, distribution_version(name)) for name in names),
        "torch_cuda": torch_cuda_version(),
        "verbs": sorted(VERBS),
    }
    if health and gpus:
        facts.update(gpu_health())
    return facts


def requested_versions(payload):
    """{name: version} of the distributions a snapshot's `versions` names (no facts beside), or None."""
    if not payload.get("versions"):
        return None
    return dict((name, distribution_version(name)) for name in package_names(payload, "versions"))


def requested_facts(payload):
    """The facts a request asks for: `repo` (optional, need not exist), `packages` (more versions) and
    `gpu_health` (true: the GPUs' processes, Xid events and CUDA too)."""
    return collect_facts(optional_str(payload, "repo"), package_names(payload), payload.get("gpu_health") is True)


@verb("facts")
def facts_verb(payload):
    """Host facts (requested_facts)."""
    return requested_facts(payload)
