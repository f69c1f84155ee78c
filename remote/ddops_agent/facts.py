"""What the controller wants to know about a host (the `facts` verb) and who the agent runs as."""

import os
import platform
import pwd
import shlex
import shutil
import socket
import subprocess
import sys

from ddops_agent.protocol import VERBS, optional_str, verb
from ddops_agent.checks import run_quiet


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


def parse_gpu_line(line):
    """One nvidia-smi CSV line as {name, memory_total_mib, driver_version}."""
    name, memory, driver = (part.strip() for part in line.rsplit(",", 2))
    digits = memory.split()[0] if memory else ""
    return {"name": name, "memory_total_mib": int(digits) if digits.isdigit() else None, "driver_version": driver}


def query_gpus():
    """(gpus, error): the GPUs nvidia-smi lists, [] without nvidia-smi; error says why a listing failed."""
    if shutil.which("nvidia-smi") is None:
        return [], None
    argv = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=20)
    except (OSError, subprocess.SubprocessError) as error:
        return [], "nvidia-smi: %s" % error
    text = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode != 0:
        return [], "nvidia-smi exit %d: %s" % (done.returncode, text.splitlines()[-1] if text else "")
    try:
        return [parse_gpu_line(line) for line in text.splitlines() if line.strip()], None
    except ValueError:
        return [], "nvidia-smi printed something unexpected: %s" % text[:200]


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


def distribution_version(name):
    """The installed version of distribution `name` without importing it, or None."""
    if sys.flags.no_site and "site" not in sys.modules:
        # The bootstrap starts Python with -S (faster); package versions need site-packages on sys.path.
        import site

        site.main()
    try:
        from importlib import metadata
    except ImportError:
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_head(repo):
    """HEAD of `repo` when it is a git checkout, else None."""
    if not os.path.exists(os.path.join(repo, ".git")):
        return None
    return run_quiet(["git", "rev-parse", "HEAD"], cwd=repo)


def collect_facts(raw_repo):
    """What the controller wants to know about this host before planning."""
    repo = os.path.realpath(os.path.expanduser(raw_repo)) if raw_repo else None
    repo_exists = bool(repo) and os.path.isdir(repo)
    gpus, gpu_error = query_gpus()
    return {
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
        "versions": {"torch": distribution_version("torch"), "transformers": distribution_version("transformers")},
        "verbs": sorted(VERBS),
    }


@verb("facts")
def facts_verb(payload):
    """Host facts; `repo` is optional and need not exist."""
    return collect_facts(optional_str(payload, "repo"))
