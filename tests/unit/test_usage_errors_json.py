"""--json prints its one document on a usage error too: an unknown option or command, a bad value; the usage text
still goes to stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("argv, command, says", [
    (["--json", "patch", "--bogus"], "patch", "No such option: --bogus"),
    (["bench", "status", "--json", "--forks", "x"], "bench status", "'x' is not a valid int"),
    (["--json", "nosuchcommand"], "", "No such command 'nosuchcommand'"),
])
def test_a_usage_error_under_json_is_one_document_with_exit_code_2(tmp_path, argv, command, says):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts: {h1: {address: 127.0.0.1}}\n")
    done = subprocess.run([sys.executable, "-m", "ddops", "-i", str(inventory), *argv], capture_output=True,
                          text=True, cwd=tmp_path)
    [line] = done.stdout.splitlines()
    doc = json.loads(line)
    assert done.returncode == 2 and doc["exit_code"] == 2 and doc["command"] == command and says in doc["error"]
    assert says in done.stderr and "Usage:" in done.stderr


def test_json_after_the_separator_is_the_remote_commands_word_not_ours(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts: {h1: {address: 127.0.0.1}}\n")
    done = subprocess.run([sys.executable, "-m", "ddops", "-i", str(inventory), "exec", "--bogus", "--", "x",
                           "--json"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 2 and done.stdout == ""
