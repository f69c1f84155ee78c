"""The example GitHub Actions workflow (examples/ci/github-actions.yml), run here step by step as GitHub would run
it, with podman in place of docker: the example users copy is known to work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import (CONTAINER_ENGINE, MINI_DDTREE, REPO_ROOT, _fresh_prefix, container_engine_unavailable,
                            git_seed, requires_sshd)

pytestmark = [pytest.mark.sshd, pytest.mark.containers, requires_sshd]

WORKFLOW = REPO_ROOT / "examples" / "ci" / "github-actions.yml"
# Steps that set up GitHub's runner (checkout, Python) or install ddops: here the checkout and ddops already are.
RUNNER_SETUP = {"install-ddops"}


def workflow_job() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert list(doc["jobs"]) == ["dry-run"]
    return doc["jobs"]["dry-run"]


def test_the_workflow_runs_each_ddops_step_the_issue_asks_for():
    scripts = "\n".join(step.get("run", "") for step in workflow_job()["steps"])
    for command in ("ddops testbed up --engine docker --hosts 3 --seed .", "ddops patch --all --check --diff",
                    "ddops --json patch --all", "ddops --json verify --all", "ddops --json rollback --all --yes",
                    "sha256sum --quiet --check", "ddops testbed down"):
        assert command in scripts
    assert scripts.count("ddops --json patch --all") == 2
    assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in workflow_job()["steps"])


def test_the_example_workflow_passes_locally_with_podman_and_leaves_the_originals(tmp_path):
    reason = container_engine_unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the container tests: {reason}")
        pytest.skip(reason)
    job = workflow_job()
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()

    def github(text: str) -> str:
        text = text.replace("${{ runner.temp }}", str(runner_temp))
        assert "${{" not in text, f"an expression this test does not know: {text}"
        return text

    checkout = git_seed(MINI_DDTREE, tmp_path / "research-repo")  # the user's research repo, checked out
    env = {**os.environ, **{k: github(str(v)) for k, v in job["env"].items()}, "RUNNER_TEMP": str(runner_temp),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DDOPS_TESTBED_ADDRESS_PREFIX": _fresh_prefix()}  # a /24 of its own on this shared machine
    shell = job["defaults"]["run"]["shell"]
    assert shell == "bash"
    ran, failure = [], None
    try:
        for step in job["steps"]:
            if "uses" in step or step.get("id") in RUNNER_SETUP:
                continue
            if failure is not None and step.get("if") != "always()":
                continue
            script = github(step["run"]).replace("--engine docker", f"--engine {CONTAINER_ENGINE}")
            # How GitHub runs a `shell: bash` step.
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=checkout,
                                  env=env, capture_output=True, text=True, timeout=600)
            ran.append(step["name"])
            if proc.returncode != 0 and failure is None:
                failure = f"step {step['name']!r} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    finally:
        if (Path(env["DDOPS_TESTBED_ROOT"]) / "testbed.json").exists():
            from ddops import testbed

            testbed.down(env["DDOPS_TESTBED_ROOT"])
    assert failure is None, failure
    assert len(ran) == 8 and ran[-1] == "Take the testbed down"
    assert not Path(env["DDOPS_TESTBED_ROOT"]).exists()

    out = Path(env["DDOPS_OUT"])
    patched = json.loads((out / "patch.json").read_text())["hosts"]
    assert [h["status"] for h in patched] == ["changed"] * 3
    assert [h["status"] for h in json.loads((out / "patch-again.json").read_text())["hosts"]] == ["ok"] * 3
    assert [h["status"] for h in json.loads((out / "rollback.json").read_text())["hosts"]] == ["changed"] * 3
    assert json.loads((out / "verify.json").read_text())["hosts"]
    # The checkout the hosts were seeded from is untouched.
    assert subprocess.run(["git", "status", "--porcelain"], cwd=checkout, capture_output=True,
                          text=True).stdout == ""
