"""Make .gpu-carry/ here, before the GPU session: what gpu_session.py needs that the GPU machine's image lacks.

- wheels/: flash-linear-attention and fla-core (and einops), and ddops' dependencies, downloaded for the image
  (CPython 3.12, manylinux x86-64; each named: pip download --no-deps), plus ddops' own wheel built from this tree;
- models/: mini-DDTree's trained models (tests/conftest.py's cache, trained there on first use) for ddops' bench;
- mini-exact/: a copy of examples/mini-ddtree patched through the ddops CLI (a `connection: local` inventory) with
  the playbooks the README recommends for hybrids, so that gpu.py needs no libcst there;
- MANIFEST.json: what is in it and the commit it was made from.

    .venv/bin/python benchmarks/hybrid-tree-verify/gpu_prepare.py [--carry DIR] [--offline] [--models DIR]

--offline downloads nothing (ddops' dependencies then come from the interpreter that runs the session: the CPU
check). Run it in the checkout that travels to the GPU machine; the device call carries the folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_session import CARRY, MODELS, PATCHED, PLAYBOOKS, REPO, WHEELS  # noqa: E402

# The image's platform (../shared/facts/gpu-machine.md): pip matches the manylinux tags exactly.
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--platform",
            "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
FLA = ("fla-core==0.6.0", "flash-linear-attention==0.6.0", "einops")
# ddops' requirements' own dependencies that the image lacks (it has rich's, pyyaml and typing-extensions).
INDIRECT = ("bcrypt", "cryptography", "pynacl", "cffi", "pycparser", "invoke", "click", "shellingham")
WHEEL_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "ddops", "remote", "playbooks", "examples")
TRAVEL_LIMIT = 64 * 2**20  # the device tool's limit on what travels: the tree and the carry together


def pip(*argv, cwd=None) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *argv], check=True, cwd=cwd,
                   timeout=900)


def download_wheels(into: Path) -> None:
    requirements = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pip("download", "--no-deps", *PLATFORM, "-d", into, *FLA, *requirements, *INDIRECT)


def build_ddops_wheel(into: Path) -> None:
    """ddops' wheel from a copy of this tree (the build writes build/ and *.egg-info, which stay out of it)."""
    with tempfile.TemporaryDirectory(prefix="ddops-wheel-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        for name in WHEEL_SOURCES:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "models",
                                                                                   "runs", "logs"))
            else:
                shutil.copy2(source, tree / name)
        pip("wheel", "--no-deps", "--no-build-isolation", "-w", into, tree, cwd=tmp)


def patched_copy(repo: Path) -> dict:
    """examples/mini-ddtree copied to repo and patched by `ddops patch` on a `connection: local` host, then
    `ddops verify`d: the two JSON documents' host parts."""
    shutil.copytree(REPO / "examples" / "mini-ddtree", repo,
                    ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    found = {}
    with tempfile.TemporaryDirectory(prefix="gpu-prepare-") as tmp:
        inventory = Path(tmp) / "inventory.yaml"
        inventory.write_text(f"ssh_config: /dev/null\npatches: {json.dumps(list(PLAYBOOKS))}\n"
                             f"hosts:\n  here: {{connection: local, repo: {json.dumps(str(repo))}}}\n")
        env = {**os.environ, "DDOPS_CACHE_DIR": str(Path(tmp) / "cache")}
        for verb in ("patch", "verify"):
            done = subprocess.run([sys.executable, "-m", "ddops", "-i", str(inventory), "--json", verb, "--all"],
                                  capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
            (host,) = json.loads(done.stdout)["hosts"]
            if done.returncode != 0:
                raise SystemExit(f"ddops {verb} on {repo}: {host['status']}: {host['message']}")
            found[verb] = {"status": host["status"], "message": host["message"]}
    return found


def travelling_bytes(carry: Path) -> int:
    """The tracked and untracked-not-ignored files of the checkout, and the carry."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True).stdout.split(b"\0")  # nothing listed outside a git checkout
    tree = sum((REPO / os.fsdecode(name)).stat().st_size for name in listed if name and (REPO / os.fsdecode(name))
               .is_file())
    return tree + sum(path.stat().st_size for path in carry.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--carry", type=Path, default=CARRY)
    parser.add_argument("--offline", action="store_true", help="download nothing (ddops' dependencies must then "
                                                               "be where the session runs)")
    parser.add_argument("--models", type=Path, help="mini-DDTree models to carry (default: tests/conftest.py's)")
    args = parser.parse_args()
    carry = args.carry.resolve()
    if carry.exists():
        shutil.rmtree(carry)
    (carry / WHEELS).mkdir(parents=True)
    if not args.offline:
        download_wheels(carry / WHEELS)
    build_ddops_wheel(carry / WHEELS)
    if args.models is None:
        sys.path.insert(0, str(REPO))
        from tests.conftest import mini_ddtree_models

        args.models = mini_ddtree_models()
    shutil.copytree(args.models, carry / MODELS)
    checks = patched_copy(carry / PATCHED)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    manifest = {"made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
                "playbooks": list(PLAYBOOKS), **checks, "offline": args.offline,
                "wheels": sorted(p.name for p in (carry / WHEELS).glob("*.whl"))}
    (carry / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = travelling_bytes(carry)
    print(json.dumps({"carry": str(carry), "travelling_mib": round(size / 2**20, 1), **manifest}, indent=1))
    if size > TRAVEL_LIMIT:
        raise SystemExit(f"{carry}: the tree and the carry come to {size / 2**20:.1f} MiB, over the device tool's "
                         f"{TRAVEL_LIMIT / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
