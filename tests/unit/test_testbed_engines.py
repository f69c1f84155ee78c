"""Choosing a testbed engine: an engine counts only if it really runs, and hosts stay on loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddops import testbed
from ddops.errors import TestbedError, UsageError
from ddops.testbed.containers import ContainerEngine, image_tag


def fake_tool(bin_dir: Path, name: str, exit_code: int, says: str) -> None:
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\necho '{says}' >&2\nexit {exit_code}\n")
    tool.chmod(0o755)


@pytest.fixture
def only_fakes_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("DDOPS_CONTAINERS_DIR", str(tmp_path / "containers"))
    return bin_dir


def test_auto_skips_a_docker_client_without_a_daemon_and_takes_podman(only_fakes_on_path):
    fake_tool(only_fakes_on_path, "docker", 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    fake_tool(only_fakes_on_path, "podman", 0, "")
    assert ContainerEngine.detect("auto").name == "podman"


def test_a_docker_client_without_a_daemon_is_refused_with_the_reason(only_fakes_on_path):
    fake_tool(only_fakes_on_path, "docker", 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    with pytest.raises(TestbedError, match="docker: Cannot connect to the Docker daemon") as caught:
        ContainerEngine.detect("auto")
    assert "podman: not installed" in str(caught.value)
    with pytest.raises(TestbedError, match="no working container engine"):
        ContainerEngine.detect("docker")


@pytest.mark.parametrize("prefix", ["10.1.230.", "0.0.0.", "127.0.0", "127.0.0.5.", "localhost."])
def test_hosts_outside_loopback_are_refused_before_anything_starts(prefix, tmp_path):
    with pytest.raises(UsageError, match="loopback only"):
        testbed.up(1, root=tmp_path / "bed", address_prefix=prefix, engine="podman")
    assert not (tmp_path / "bed").exists()


def test_an_unknown_engine_and_an_image_for_namespace_hosts_are_usage_errors(tmp_path):
    from tests.conftest import run_ddops

    proc = run_ddops("testbed", "up", "--engine", "lxc", "--root", str(tmp_path / "bed"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "ddops: error: --engine lxc: not one of namespace, podman, docker, auto"]
    with pytest.raises(UsageError, match="--engine lxc: not one of namespace, podman, docker, auto"):
        testbed.up(1, root=tmp_path / "bed", engine="lxc")
    with pytest.raises(UsageError, match="--image needs a container engine"):
        testbed.up(1, root=tmp_path / "bed", image="mine:latest")


def test_the_default_image_tag_follows_the_containerfile(monkeypatch, tmp_path):
    from ddops.testbed import containers

    before = image_tag()
    assert before == image_tag() and before.startswith("localhost/ddops-testbed:")
    changed = tmp_path / "Containerfile"
    changed.write_bytes(containers.CONTAINERFILE.read_bytes() + b"RUN true\n")
    monkeypatch.setattr(containers, "CONTAINERFILE", changed)
    assert image_tag() != before


def test_podman_gets_a_private_configuration_with_the_settings_this_machine_needs(only_fakes_on_path):
    env = ContainerEngine("podman").env()
    conf = Path(env["CONTAINERS_CONF"]).read_text()
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]' in conf
    assert 'runtime = "runc"' in conf
    storage = Path(env["CONTAINERS_STORAGE_CONF"]).read_text()
    assert f'graphroot = "{os.environ["DDOPS_CONTAINERS_DIR"]}/storage"' in storage
