"""The agent's GPU facts from nvidia-smi's documented query output (hand-written fixtures, answered by a fake
nvidia-smi on PATH), package versions read without importing them, and the health rules the controller applies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.bench.gpus import Issue, gpu_issues, gpu_state, gpu_summary
from ddops.transport.agent import agent_program
from tests.gpu_fixtures import fake_gpu_bin


def facts(tmp_path: Path, fixture: str | None, **payload) -> dict:
    """The agent's `facts` answer on a host whose PATH finds the fake nvidia-smi and dmesg of `fixture` first."""
    env = dict(os.environ)
    if fixture is not None:
        env["PATH"] = f"{fake_gpu_bin(tmp_path / 'bin', fixture)}{os.pathsep}{env['PATH']}"
    program = agent_program()
    request = json.dumps({"verb": "facts", "payload": payload}).encode()
    done = subprocess.run(program.argv(payload.pop("python", sys.executable), cache=False),
                          input=program.bundle + request, capture_output=True, timeout=60, env=env)
    answer = json.loads(done.stdout)
    assert answer["ok"], answer
    return answer["result"]


def test_facts_read_every_gpu_of_an_idle_h100_host(tmp_path):
    found = facts(tmp_path, "h100-idle", gpu_health=True)
    assert found["gpu_error"] is None and len(found["gpus"]) == 8
    first = found["gpus"][0]
    assert first == {"index": 0, "uuid": "GPU-3f1c0a52-7d4e-4b8a-9c21-5e0b6a7d8f10", "bus_id": "00000000:18:00.0",
                     "driver_version": "550.54.15", "memory_total_mib": 81559, "memory_used_mib": 0,
                     "utilization_pct": 0, "temperature_c": 31, "power_draw_w": 69.45, "power_limit_w": 700.0,
                     "clocks_sm_mhz": 345, "clocks_mem_mhz": 2619, "clocks_max_sm_mhz": 1980, "pstate": "P0",
                     "ecc_uncorrected": 0, "clock_event_reasons": 1, "name": "NVIDIA H100 80GB HBM3"}
    assert found["cuda_driver"] == "12.4" and found["gpu_processes"] == [] and found["xid_events"] == []
    assert gpu_issues(found) == [] and gpu_summary(found) == "8x NVIDIA H100 80GB HBM3"


def test_health_is_asked_only_when_wanted(tmp_path):
    found = facts(tmp_path, "h100-idle")
    assert len(found["gpus"]) == 8 and "gpu_processes" not in found and "xid_events" not in found


def test_a_driver_before_the_clock_event_rename_is_asked_with_the_older_field_name(tmp_path):
    found = facts(tmp_path, "legacy-driver", gpu_health=True)
    assert found["gpu_error"] is None
    assert [g["name"] for g in found["gpus"]] == ["Tesla V100-SXM2-16GB"] * 2
    assert found["gpus"][1]["clock_event_reasons"] == 1 and found["cuda_driver"] == "11.4"
    # dmesg refused: the Xid events are unknown, not absent
    assert found["xid_events"] is None and "Operation not permitted" in found["xid_error"]


def test_busy_gpus_name_the_process_or_the_memory_nobody_listed(tmp_path):
    found = facts(tmp_path, "h100-busy", gpu_health=True)
    assert found["gpu_processes"] == [{"gpu_uuid": "GPU-5c8a1e36-2f7b-4d9e-a4c2-8b0d3f6e9a51", "pid": 48213,
                                       "used_memory_mib": 38912, "name": "/usr/bin/python3"}]
    issues = gpu_issues(found)
    assert [(i.gpu, i.issue) for i in issues] == [(1, Issue.BUSY), (2, Issue.BUSY)]
    assert str(issues[0]) == "GPU 1 busy: pid 48213 /usr/bin/python3 (38.0 GiB)"
    assert str(issues[1]) == "GPU 2 busy: 20.0 GiB in use by a process nvidia-smi does not list (another container?)"


def test_ecc_errors_thermal_slowdown_xid_and_an_odd_sibling_are_each_named(tmp_path):
    found = facts(tmp_path, "a100-unhealthy", gpu_health=True)
    assert [x["xid"] for x in found["xid_events"]] == [79] and found["xid_events"][0]["bus_id"] == "0000:4e:00"
    issues = gpu_issues(found)
    assert [(i.gpu, i.issue) for i in issues] == [(1, Issue.ECC), (2, Issue.THROTTLED), (3, Issue.XID),
                                                  (3, Issue.UNLIKE)]
    assert str(issues[0]) == "GPU 1 ecc: 2 uncorrected ECC errors since the driver loaded"
    assert str(issues[1]) == "GPU 2 throttled: hardware thermal slowdown at 91 C"
    assert str(issues[2]).startswith("GPU 3 xid: Xid 79 in the kernel log since boot (last, ")
    assert str(issues[2]).endswith("GPU has fallen off the bus.)")
    assert str(issues[3]) == ("GPU 3 unlike siblings: NVIDIA A100-SXM4-40GB 40.0 GiB, driver 535.161.08; "
                              "its siblings: NVIDIA A100-SXM4-80GB 80.0 GiB, driver 535.161.08")
    assert gpu_summary(found) == "3x NVIDIA A100-SXM4-80GB, 1x NVIDIA A100-SXM4-40GB"


def test_the_manifest_keeps_clocks_temperature_power_driver_and_cuda(tmp_path):
    state = gpu_state(facts(tmp_path, "a100-unhealthy", gpu_health=True))
    assert state["cuda_driver"] == "12.2" and len(state["gpus"]) == 4 and len(state["issues"]) == 4
    assert state["gpus"][2] == {"index": 2, "name": "NVIDIA A100-SXM4-80GB",
                                "uuid": "GPU-a1d4f7e3-5b2c-4e9a-8d16-0c3e5f8a1b92", "driver": "535.161.08",
                                "memory_total_mib": 81920, "memory_used_mib": 4, "clocks_sm_mhz": 705,
                                "clocks_max_sm_mhz": 1410, "clocks_mem_mhz": 1593, "temperature_c": 91,
                                "power_draw_w": 88.4, "power_limit_w": 400.0, "pstate": "P0",
                                "slowdowns": ["hardware thermal slowdown"]}


def test_a_host_without_nvidia_smi_has_no_gpu_and_no_error(tmp_path):
    found = facts(tmp_path, None, gpu_health=True)
    if found["gpus"]:
        pytest.skip("this machine has a real nvidia-smi")
    assert found["gpu_error"] is None and "gpu_processes" not in found and gpu_summary(found) == "no GPU"


def test_two_equal_groups_of_unlike_gpus_are_reported_for_the_host():
    gpus = [{"index": i, "name": name, "memory_total_mib": 81920, "driver_version": "535"}
            for i, name in enumerate(["A100", "A100", "H100", "H100"])]
    (issue,) = gpu_issues({"gpus": gpus})
    assert issue.gpu is None and str(issue) == ("GPUs unlike siblings: 2x A100 80.0 GiB, driver 535; "
                                               "2x H100 80.0 GiB, driver 535")


# -- package versions -----------------------------------------------------------------------------------------------


def fake_distribution(site: Path, name: str, version: str, files: dict[str, str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


def test_versions_of_asked_packages_and_torch_cuda_are_read_without_importing_them(tmp_path, monkeypatch):
    site = tmp_path / "site"
    # A torch whose import would fail: its version and CUDA come from the metadata and version.py alone.
    fake_distribution(site, "torch", "2.5.1+cu124", {
        "torch/__init__.py": "raise ImportError('imported')\n",
        "torch/version.py": "from typing import Optional\n__version__ = '2.5.1+cu124'\ncuda: Optional[str] = '12.4'\n"})
    fake_distribution(site, "flash_linear_attention", "0.3.2", {})
    monkeypatch.setenv("PYTHONPATH", str(site))
    found = facts(tmp_path, None, packages=["flash-linear-attention", "no-such-package"])
    assert found["versions"]["torch"] == "2.5.1+cu124" and found["torch_cuda"] == "12.4"
    assert found["versions"]["flash-linear-attention"] == "0.3.2"
    assert found["versions"]["no-such-package"] is None and "transformers" in found["versions"]


def test_a_cpu_torch_has_no_cuda(tmp_path, monkeypatch):
    site = tmp_path / "site"
    fake_distribution(site, "torch", "2.13.0+cpu", {"torch/version.py": "cuda: Optional[str] = None\n"})
    monkeypatch.setenv("PYTHONPATH", str(site))
    found = facts(tmp_path, None)
    assert found["versions"]["torch"] == "2.13.0+cpu" and found["torch_cuda"] is None
