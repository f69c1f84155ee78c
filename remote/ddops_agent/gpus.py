"""The host's GPUs as nvidia-smi's documented query output describes them, and the NVRM Xid lines of the kernel log.

Only parsing and asking here: what counts as busy, throttled or unhealthy is decided on the controller
(ddops/bench/gpus.py). Field names are those `nvidia-smi --help-query-gpu` and `--help-query-compute-apps` document;
every query uses `--format=csv,noheader,nounits`, where an unsupported value reads `[N/A]` or `[Not Supported]`."""

import re
import shutil
import subprocess

# (field, key in the answer, type). `name` is last: the one free-text field, which may hold a comma.
GPU_FIELDS = (
    ("index", "index", int),
    ("uuid", "uuid", str),
    ("pci.bus_id", "bus_id", str),
    ("driver_version", "driver_version", str),
    ("memory.total", "memory_total_mib", int),
    ("memory.used", "memory_used_mib", int),
    ("utilization.gpu", "utilization_pct", int),
    ("temperature.gpu", "temperature_c", int),
    ("power.draw", "power_draw_w", float),
    ("power.limit", "power_limit_w", float),
    ("clocks.sm", "clocks_sm_mhz", int),
    ("clocks.mem", "clocks_mem_mhz", int),
    ("clocks.max.sm", "clocks_max_sm_mhz", int),
    ("pstate", "pstate", str),
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected", int),
    ("clocks_event_reasons.active", "clock_event_reasons", "hex"),
    ("name", "name", str),
)
# Drivers before the rename call the bitmask clocks_throttle_reasons; an unknown field fails the whole query, so a
# refused query is asked again with the older name, then without the bitmask and the ECC counter.
LEGACY_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
OPTIONAL_FIELDS = ("clocks_event_reasons.active", "ecc.errors.uncorrected.volatile.total")
APP_FIELDS = (("gpu_uuid", "gpu_uuid", str), ("pid", "pid", int), ("used_memory", "used_memory_mib", int),
              ("process_name", "name", str))
CSV = "--format=csv,noheader,nounits"
UNSUPPORTED = ("", "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]")
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)[^)]*\): (\d+)(?:, ?(.*))?")
KERNEL_TIME = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")
CUDA_LINE = re.compile(r"^\s*CUDA Version\s*:\s*(\S+)", re.M)
TIMEOUT = 20
MAX_XIDS = 32


def value_of(text, kind):
    """One CSV cell as its type; None for what nvidia-smi marks unsupported or cannot be read as one."""
    text = text.strip()
    if text in UNSUPPORTED or text.startswith("[") or text == "Unknown Error":
        return None
    try:
        return int(text, 16) if kind == "hex" else kind(text)
    except ValueError:
        return None


def parse_rows(text, fields):
    """CSV lines (noheader, nounits) -> one dict per line, keyed by each field's key. The last field takes the rest
    of the line, commas included; a line with too few cells is a ValueError."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(",", len(fields) - 1)
        if len(cells) != len(fields):
            raise ValueError("%d values where %d were asked: %r" % (len(cells), len(fields), line[:200]))
        rows.append(dict((key, value_of(cell, kind)) for (_, key, kind), cell in zip(fields, cells)))
    return rows


def gpu_queries():
    """The field lists to try, newest first: all, with the bitmask's older name, without the optional fields."""
    full = list(GPU_FIELDS)
    legacy = [(LEGACY_NAMES.get(name, name), key, kind) for name, key, kind in GPU_FIELDS]
    minimal = [f for f in GPU_FIELDS if f[0] not in OPTIONAL_FIELDS]
    return [full, legacy, minimal]


def start(argv):
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(process, what):
    """(text, None) of a started command, or (None, why it gave nothing)."""
    try:
        out, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return None, "%s: no answer within %d s" % (what, TIMEOUT)
    text = out.decode("utf-8", "replace").strip()
    if process.returncode != 0:
        return None, "%s exit %d: %s" % (what, process.returncode, text.splitlines()[-1] if text else "")
    return text, None


def run(argv):
    """(text, None) or (None, why) for one command."""
    try:
        return finish(start(argv), argv[0])
    except OSError as error:
        return None, "%s: %s" % (argv[0], error)


def query_gpus(ask=run):
    """(gpus, error): each GPU nvidia-smi lists as a dict; [] without nvidia-smi; error says why a listing failed."""
    if shutil.which("nvidia-smi") is None:
        return [], None
    error = None
    for fields in gpu_queries():
        text, error = ask(["nvidia-smi", "--query-gpu=" + ",".join(f[0] for f in fields), CSV])
        if text is None and error and "field" in error.lower():
            continue  # an older driver that does not know one of the fields
        if text is None:
            return [], error
        try:
            return parse_rows(text, fields), None
        except ValueError as why:
            return [], "nvidia-smi printed something unexpected: %s" % why
    return [], error


def parse_xids(text, uptime=None):
    """The NVRM Xid lines of `dmesg` output: [{bus_id, xid, detail, age_s}], the newest MAX_XIDS."""
    events = []
    for line in text.splitlines():
        found = XID.search(line)
        if not found:
            continue
        stamp = KERNEL_TIME.search(line)
        age = max(0.0, round(uptime - float(stamp.group(1)), 1)) if stamp and uptime is not None else None
        events.append({"bus_id": found.group(1).lower(), "xid": int(found.group(2)),
                       "detail": (found.group(3) or "").strip()[:200], "age_s": age})
    return events[-MAX_XIDS:]


def uptime_seconds():
    try:
        with open("/proc/uptime") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def gpu_health():
    """What the health rules read beyond the GPU list: compute processes, the driver's CUDA version and Xid events,
    asked of nvidia-smi and dmesg at once (each nvidia-smi start can take a second on a host without persistence
    mode)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    commands = {
        "apps": ["nvidia-smi", "--query-compute-apps=" + ",".join(f[0] for f in APP_FIELDS), CSV],
        "cuda": ["nvidia-smi", "-q", "-d", "COMPUTE"],
        "xid": ["dmesg"],
    }
    started = {}
    answers = {}
    for name, argv in commands.items():
        try:
            started[name] = start(argv)
        except OSError as error:
            answers[name] = (None, "%s: %s" % (argv[0], error))
    for name, process in started.items():
        answers[name] = finish(process, commands[name][0])
    out = {}
    apps, error = answers["apps"]
    try:
        out["gpu_processes"] = parse_rows(apps, APP_FIELDS) if apps is not None else None
    except ValueError as why:
        out["gpu_processes"], error = None, "nvidia-smi printed something unexpected: %s" % why
    out["gpu_processes_error"] = error
    cuda, _ = answers["cuda"]
    found = CUDA_LINE.search(cuda or "")
    out["cuda_driver"] = found.group(1) if found and found.group(1) not in UNSUPPORTED else None
    kernel_log, error = answers["xid"]
    out["xid_events"] = parse_xids(kernel_log, uptime_seconds()) if kernel_log is not None else None
    out["xid_error"] = error
    return out
