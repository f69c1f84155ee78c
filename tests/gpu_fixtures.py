"""A fake `nvidia-smi` (and `dmesg`) answering from the hand-written fixtures of tests/fixtures/nvidia-smi."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia-smi"


def fake_gpu_bin(bin_dir: Path, fixture: str) -> Path:
    """bin_dir holding `nvidia-smi` and `dmesg` that answer as the host `fixture` describes; put it first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("nvidia-smi", "dmesg"):
        shutil.copy(FIXTURES / "fake.py", bin_dir / name)
        (bin_dir / name).chmod(0o755)
    shutil.copytree(FIXTURES / fixture, bin_dir / "fixture", dirs_exist_ok=True)
    return bin_dir


def fake_gpus_on_testbed_host(bed, name: str, fixture: str) -> None:
    """A namespace testbed host whose login shell finds the fake first on PATH (through the host's own ~/.bashrc)."""
    host = bed.host(name)
    bin_dir = fake_gpu_bin(Path(host.repo_dir) / ".fake-gpu-bin", fixture)
    inside = f"{bed.repo_path}/.fake-gpu-bin"
    assert bin_dir.is_dir()
    bashrc = Path(host.dir) / "bashrc"
    bashrc.write_text(f'export PATH="{inside}:$PATH"\n' + bashrc.read_text())
