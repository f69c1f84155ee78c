"""A host whose python is older than the agent supports gets one line naming what it found, never a traceback or a
silent run: real Python 2.7, 3.6 and 3.7 interpreters, reached as local hosts through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_ddops, run_ddops_json

PYENV = Path("/root/.pyenv/versions")


def interpreter(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/bin/python"))
    if not found:
        pytest.skip(f"no Python {version} on this machine (pyenv)")
    return found[-1]


@pytest.mark.parametrize("version", ["2.7", "3.6", "3.7"])
def test_a_host_whose_python_is_older_than_3_8_gets_one_line_naming_the_version(tmp_path, version):
    python = interpreter(version)
    found = python.parent.parent.name
    (tmp_path / "repo").mkdir()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("ssh_config: /dev/null\nhosts:\n"
                         f"  old: {{connection: local, repo: {json.dumps(str(tmp_path / 'repo'))}, "
                         f"python: {json.dumps(str(python))}}}\n")
    code, doc = run_ddops_json("ping", "--all", inventory=inventory, env={"SSH_AUTH_SOCK": ""})
    (host,) = doc["hosts"]
    assert code == 1 and host["status"] == "failed" and host["message"] == f"needs Python >= 3.8 (found {found})"
    plain = run_ddops("ping", "--all", inventory=inventory, env={"SSH_AUTH_SOCK": ""})
    assert "Traceback" not in plain.stdout + plain.stderr and "AttributeError" not in plain.stdout + plain.stderr
