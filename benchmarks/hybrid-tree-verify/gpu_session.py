"""The GPU session of issue 36 in one command: hybrid-tree-verify's figures on a 27B layout (gpu.py) and ddops itself
on CUDA (a `connection: local` host over mini-DDTree: ping, patch, verify, exec, bench, collect, report), on the GPU
machine's image as it is, with what the image lacks carried in .gpu-carry/ (gpu_prepare.py makes it here first).

Standard library only: it runs under the image's python3 (torch, transformers, triton; no libcst, paramiko or
flash-linear-attention, and no network). In order, each step logged with its exit status and time:

1. nvidia-smi's raw answers: the agent's own queries (remote/ddops_agent/gpus.py) saved as a fixture folder in
   tests/fixtures/nvidia-smi's layout, to replace the hand-written ones there, and a wider CSV, `-q -x` and `-L`;
2. flash-linear-attention and fla-core installed from the carried wheels into a folder of their own (CUDA only: its
   kernels are Triton GPU kernels), on gpu.py's PYTHONPATH only;
3. gpu.py in a copy of the carried patched mini-DDTree (patched here beforehand, so nothing needs libcst there), with
   the time left minus what step 4 needs;
4. ddops' wheel and its dependencies installed from the carried wheels (no index) into a venv that also sees this
   interpreter's packages, then ddops against a fresh copy of examples/mini-ddtree on this machine, models from
   the carry, benchmark.py on this interpreter (on CUDA when there is one: it picks the device itself).

Writes at most 8 files to --out (the device tool's limit): hybrid-gpu.json (gpu.py's figures), session.json (every
step, the versions, ddops' ping, patch, verify, the bench run, the manifest's GPU fields and the report's rows),
nvidia-smi-query.csv, nvidia-smi-full.csv, nvidia-smi-q.xml, session.log, and outputs.tar.gz (everything else:
profiles, ddops' JSON documents, the collected results).

The device call (after `.venv/bin/python benchmarks/hybrid-tree-verify/gpu_prepare.py` here, in the checkout the
device tool sends; playbooks/README.md, "On a GPU", says what comes back and where it goes):
    run  command:   PYTHONUNBUFFERED=1 python3 benchmarks/hybrid-tree-verify/gpu_session.py --out $OUT --time-limit 420
         carry:     [".gpu-carry"]
         timeout_s: 480
A rerun of one half: add --skip bench or --skip ddops (and a --time-limit that fits what is left).
Here, the whole session on the CPU at toy size (what tests/unit/test_gpu_session.py runs):
    .venv/bin/python benchmarks/hybrid-tree-verify/gpu_session.py --dry --out /tmp/gpu-out
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CARRY = REPO / ".gpu-carry"
# The carry's layout (gpu_prepare.py writes it).
WHEELS, MODELS, PATCHED = "wheels", "models", "mini-exact"
# The playbooks the README recommends for hybrids, applied to the carried copy here and by ddops there.
PLAYBOOKS = ("cpu-timing", "hybrid-cache", "crop-relative", "hybrid-tree-verify")
FLA_WHEELS = ("fla_core", "flash_linear_attention", "einops")
MINI_PLAN = "mini-ddtree-bench"
RUN_ID = "gpu-session"
NVIDIA_SMI = {  # file: argv (beside the fixture folder of the agent's own queries: capture_gpu_fixture)
    "nvidia-smi-query.csv": ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
    "nvidia-smi-full.csv": ["--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,driver_version,"
                            "compute_cap,power.limit,clocks.max.sm", "--format=csv"],
    "nvidia-smi-q.xml": ["-q", "-x"],
    "nvidia-smi-L.txt": ["-L"],
}
OUT_FILES = ("hybrid-gpu.json", "session.json", "nvidia-smi-query.csv", "nvidia-smi-full.csv", "nvidia-smi-q.xml",
             "session.log")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="where the results go ($OUT)")
    parser.add_argument("--carry", type=Path, default=CARRY)
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new one under /tmp)")
    parser.add_argument("--time-limit", type=float, default=420.0, help="seconds for the whole session")
    parser.add_argument("--dry", action="store_true",
                        help="the whole session on the CPU at toy size: gpu.py --device cpu --layout tiny, one "
                             "short mini response per method")
    parser.add_argument("--skip", choices=("bench", "ddops"), action="append", default=[],
                        help="leave out a step (for a rerun of the other)")
    parser.add_argument("--bench-args", default="", help="more gpu.py options, e.g. '--contexts 8192'")
    parser.add_argument("--ddops-seconds", type=float, default=150.0,
                        help="what step 4 is given (the mini bench on 2 targets included); gpu.py has the rest")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out is required where $OUT is not set")
    return args


class Session:
    """Runs the steps, each logged (command, output, exit status, seconds) and recorded in session.json."""

    def __init__(self, work: Path, time_limit: float):
        self.began, self.time_limit = time.monotonic(), time_limit
        self.work = work
        self.log = (work / "session.log").open("w", encoding="utf-8")
        self.steps: list[dict] = []

    def left(self) -> float:
        return self.time_limit - (time.monotonic() - self.began)

    def note(self, text: str) -> None:
        stamp = f"[{time.monotonic() - self.began:7.1f}s]"
        print(f"{stamp} {text}", flush=True)
        self.log.write(f"{stamp} {text}\n")
        self.log.flush()

    def run(self, name: str, argv: list, *, timeout: float, cwd=None, env=None, quiet=False) -> tuple[int | str, str]:
        """(exit status or "timeout" or "not run: ...", output) of one command, its whole process group ended at
        the timeout; quiet: neither logged nor a step (a poll)."""
        argv = [str(a) for a in argv]
        if not quiet:
            self.note(f"{name}: $ {' '.join(argv)}")
        tick = time.monotonic()
        if timeout <= 0:
            status, output = "not run: no time left", ""
        else:
            try:
                child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace", start_new_session=True)
            except OSError as error:
                status, output = f"not run: {error}", ""
            else:
                try:
                    output, _ = child.communicate(timeout=timeout)
                    status = child.returncode
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    output, _ = child.communicate()
                    status = "timeout"
        seconds = round(time.monotonic() - tick, 1)
        if quiet:
            return status, output
        self.log.write(output if output.endswith("\n") or not output else output + "\n")
        self.note(f"{name}: exit {status} after {seconds}s")
        self.steps.append({"step": name, "status": status, "seconds": seconds})
        return status, output

    def skipped(self, name: str, why: str) -> None:
        self.note(f"{name}: skipped: {why}")
        self.steps.append({"step": name, "status": "skipped", "why": why})


def offline_env(**extra) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def versions(names) -> dict:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def nvidia_smi(session: Session, into: Path) -> dict:
    """Each query's raw answer saved under into/; {file: exit status}."""
    into.mkdir()
    if shutil.which("nvidia-smi") is None:
        session.skipped("nvidia-smi", "not on PATH")
        return {}
    statuses = {}
    for file, argv in NVIDIA_SMI.items():
        status, output = session.run(f"nvidia-smi {file}", ["nvidia-smi", *argv], timeout=60)
        (into / file).write_text(output)
        statuses[file] = status
    return statuses


def agent_gpus_module():
    """remote/ddops_agent/gpus.py, what asks nvidia-smi on the hosts (standard library only): its queries' one home."""
    spec = importlib.util.spec_from_file_location("agent_gpus", REPO / "remote" / "ddops_agent" / "gpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def capture_gpu_fixture(session: Session, into: Path) -> dict:
    """This machine's answers to the agent's own nvidia-smi and dmesg queries, as a fixture folder of
    tests/fixtures/nvidia-smi (its README has the layout): fields (those of the first field list this driver
    takes, the agent's order of tries), query-gpu.csv, query-compute-apps.csv, q-compute.txt, and the kernel log's
    NVRM lines in dmesg.txt (or dmesg's refusal in dmesg-denied). {file: exit status}."""
    gpus = agent_gpus_module()
    into.mkdir(parents=True)
    statuses: dict = {}
    for fields in ([f[0] for f in tries] for tries in gpus.gpu_queries()):
        status, output = session.run("nvidia-smi query-gpu", ["nvidia-smi", "--query-gpu=" + ",".join(fields),
                                                              gpus.CSV], timeout=60)
        statuses["query-gpu.csv"] = status
        if status == 0:
            (into / "fields").write_text(",".join(fields) + "\n")
            (into / "query-gpu.csv").write_text(output)
            break
    asks = {"query-compute-apps.csv": ["nvidia-smi", "--query-compute-apps=" + ",".join(f[0] for f in gpus.APP_FIELDS),
                                       gpus.CSV],
            "q-compute.txt": ["nvidia-smi", "-q", "-d", "COMPUTE"], "dmesg.txt": ["dmesg"]}
    for file, argv in asks.items():
        status, output = session.run(f"fixture {file}", argv, timeout=60)
        statuses[file] = status
        if file == "dmesg.txt" and status != 0:
            file = "dmesg-denied"
        elif file == "dmesg.txt":
            output = "".join(line for line in output.splitlines(keepends=True) if "NVRM" in line)
        (into / file).write_text(output)
    return statuses


def gpu_figures(session: Session, args, carry: Path, cuda: bool) -> dict:
    """Step 2 and 3: fla installed for gpu.py alone, then gpu.py in a copy of the carried patched mini-DDTree."""
    work = session.work
    fla_site = None
    if not cuda:
        session.skipped("fla", "no CUDA device: flash-linear-attention's kernels are Triton GPU kernels")
    else:
        wheels = sorted(w for w in (carry / WHEELS).glob("*.whl") if w.name.startswith(FLA_WHEELS))
        status, _ = session.run("fla", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                        "--no-compile", "--target", work / "fla-site", *wheels],
                                timeout=120, env=offline_env())
        fla_site = work / "fla-site" if status == 0 else None
    repo = work / PATCHED
    shutil.copytree(carry / PATCHED, repo)
    figures = work / "bench"
    device = ["--device", "cpu", "--layout", "tiny", "--contexts", "48", "--budgets", "16,64", "--repeats", "1",
              "--prefill-chunk", "32"] if args.dry else ["--device", "cuda", "--layout", "27b"]
    budget = session.left() - (0 if "ddops" in args.skip else args.ddops_seconds)
    env = offline_env(**({"PYTHONPATH": fla_site} if fla_site else {}))
    status, output = session.run("gpu.py", [sys.executable, HERE / "gpu.py", *device, *args.bench_args.split(),
                                            "--time-limit", max(budget - 20, 1), "--out", figures],
                                 cwd=repo, env=env, timeout=budget)
    return {"status": status, "fla_site": fla_site is not None, "tail": output[-2000:] if status != 0 else None}


def ddops_venv(session: Session, carry: Path) -> Path | None:
    """A venv with ddops' wheel and its dependencies from the carried wheels (no index), that also sees this
    interpreter's packages (torch, for bench report): its python, or None."""
    venv = session.work / "venv"
    status, _ = session.run("venv", [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv],
                            timeout=120)
    if status != 0:
        return None
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The image's python3 is itself a venv: --system-site-packages reaches its base interpreter, not its packages.
    Path(purelib, "session-parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    [wheel] = (carry / WHEELS).glob("ddops-*.whl")
    # The venv's python runs this interpreter's pip (seen through the .pth), which installs into the venv.
    status, _ = session.run("install ddops", [python, "-m", "pip", "install", "-q", "--no-index", "--find-links",
                                              carry / WHEELS, wheel],
                            timeout=180, env=offline_env())
    return python if status == 0 else None


def ddops_on_this_machine(session: Session, args, carry: Path) -> dict:
    """Step 4: ping, patch, verify, bench (waited for), collect and report on a `connection: local` host."""
    work = session.work
    found: dict = {}
    python = ddops_venv(session, carry)
    if python is None:
        return {"error": "ddops could not be installed (session.log)"}
    probe = "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in " \
            "('ddops', 'libcst', 'paramiko', 'typer', 'click', 'rich', 'pyyaml', 'cryptography')}))"
    status, output = session.run("ddops versions", [python, "-c", probe], timeout=60)
    found["versions"] = json.loads(output.strip().splitlines()[-1]) if status == 0 else output[-500:]
    repo = work / "mini"
    shutil.copytree(REPO / "examples" / "mini-ddtree", repo,
                    ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    mini_vars = {"models": str((carry / MODELS).resolve()), "max_samples": 1 if args.dry else 4,
                 "max_new_tokens": 8 if args.dry else 64}
    inventory = work / "inventory.yaml"
    host = {"connection": "local", "repo": str(repo), "python": sys.executable, "vars": mini_vars}
    inventory.write_text(f"ssh_config: /dev/null\npatches: {json.dumps(list(PLAYBOOKS))}\n"
                         f"hosts:\n  gpu: {json.dumps(host)}\n")
    docs = work / "ddops"
    docs.mkdir()
    env = offline_env(DDOPS_CACHE_DIR=work / "ddops-cache", DDOPS_RESULTS_DIR=work / "results", COLUMNS=200)

    def ddops(name: str, *argv: str, timeout: float = 120, quiet=False) -> dict:
        """The first host's part of one `ddops --json` command's document (saved whole under docs/)."""
        status, output = session.run(f"ddops {name}", [python, "-m", "ddops", "-i", inventory, "--json", *argv],
                                     cwd=work, env=env, timeout=timeout, quiet=quiet)
        (docs / f"{name}.json").write_text(output)
        try:
            document = json.loads(output)
        except ValueError:
            return {"exit": status, "error": output[-1000:]}
        hosts = document.get("hosts") or [{}]
        return {"exit": status, **{k: v for k, v in document.items() if k not in ("hosts", "rows")},
                **hosts[0], "rows": document.get("rows")}

    ping = ddops("ping", "ping", "--all")
    found["ping"] = {k: (ping.get("data") or {}).get(k) for k in ("gpus", "gpu_error", "python", "python_executable",
                                                             "versions", "arch", "os")}
    for name in ("patch", "verify"):
        done = ddops(name, name, "--all", timeout=300)
        found[name] = {"status": done.get("status"), "message": done.get("message"),
                       "patches": (done.get("data") or {}).get("patches")}
    # The device benchmark.py takes: it runs on CUDA wherever the host's interpreter sees a GPU.
    seen = ddops("exec", "exec", "--all", "--", sys.executable, "-c", "import torch; print(torch.cuda.is_available()"
                 " and torch.cuda.get_device_name() or 'cpu')", timeout=120)
    found["device_for_benchmark"] = ((seen.get("data") or {}).get("stdout") or "").strip() or seen.get("message")
    # The hybrid target alone in the dry run: the CPU check of the same steps, in half the time.
    only = ["--only", "target=qwen3.5-hybrid"] if args.dry else []
    launch = ddops("bench", "bench", MINI_PLAN, "--all", "--run-id", RUN_ID, *only)
    found["bench"] = {"status": launch.get("status"), "message": launch.get("message")}
    state, tick = {}, time.monotonic()
    while launch.get("status") == "changed" and session.left() > 20:
        polled = ddops("bench-status", "bench", "status", RUN_ID, "--all", quiet=True)
        state = (polled.get("data") or {}).get("run") or {}
        if state.get("status") not in ("starting", "running"):
            break
        time.sleep(2)
    session.note(f"bench run: {state.get('status')} after {time.monotonic() - tick:.1f}s")
    if state.get("status") in ("starting", "running"):
        ddops("bench-stop", "bench", "stop", RUN_ID, "--all")
    found["bench"]["run"] = {k: state.get(k) for k in ("status", "message", "runs")}
    collected = ddops("collect", "bench", "collect", RUN_ID, "--all")
    manifest = (collected.get("data") or {}).get("manifest") or {}
    found["collect"] = {"status": collected.get("status"), "message": collected.get("message"),
                        "manifest": {k: manifest.get(k) for k in ("gpu", "python", "python_executable", "torch",
                                                                  "transformers", "status")}}
    report = ddops("report", "bench", "report", RUN_ID, timeout=180)
    found["report"] = {"exit": report.get("exit"), "title": report.get("title"),
                       "rows": [{k: v for k, v in row.items() if k not in ("code", "source")}
                                for row in report.get("rows") or []]}
    return found


def main() -> None:
    args = parse_args()
    carry = args.carry.resolve()
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu-session-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    session = Session(work, args.time_limit)
    record: dict = {"argv": sys.argv[1:], "python": sys.executable,
                    "versions": versions(("torch", "transformers", "triton", "accelerate", "numpy", "typer", "pip")),
                    "carry": json.loads((carry / "MANIFEST.json").read_text()) if (carry / "MANIFEST.json").is_file()
                    else f"{carry}: no MANIFEST.json (run gpu_prepare.py here first)"}
    session.note(f"session in {work}, carry {carry}, out {out}")
    try:
        record["nvidia_smi"] = nvidia_smi(session, work / "nvidia-smi")
        if record["nvidia_smi"]:
            record["gpu_fixture"] = capture_gpu_fixture(session, work / "nvidia-smi" / "fixture")
        cuda = not args.dry and bool(record["nvidia_smi"])
        if "bench" in args.skip:
            session.skipped("gpu.py", "--skip bench")
        else:
            record["bench"] = gpu_figures(session, args, carry, cuda)
        if "ddops" in args.skip:
            session.skipped("ddops", "--skip ddops")
        else:
            record["ddops"] = ddops_on_this_machine(session, args, carry)
    finally:
        record["steps"] = session.steps
        record["total_s"] = round(time.monotonic() - session.began, 1)
        (work / "session.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        session.note("writing the outputs")
        session.log.close()
        deliver(work, out)


def deliver(work: Path, out: Path) -> None:
    """The few files the device tool brings back, and everything else in one archive."""
    sources = {"hybrid-gpu.json": work / "bench" / "hybrid-gpu.json", "session.json": work / "session.json",
               "session.log": work / "session.log",
               **{name: work / "nvidia-smi" / name for name in OUT_FILES if name.startswith("nvidia-smi")}}
    for name, source in sources.items():
        if source.is_file():
            shutil.copyfile(source, out / name)
    with tarfile.open(out / "outputs.tar.gz", "w:gz") as archive:
        for part in ("bench", "ddops", "results", "nvidia-smi", "inventory.yaml", "mini/.ddops/runs"):
            if (work / part).exists():
                archive.add(work / part, arcname=part)


if __name__ == "__main__":
    main()
