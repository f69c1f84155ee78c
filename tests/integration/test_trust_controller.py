"""Controller-side trust over real sshd hosts: `repo: ~/...` means the host's home, collect downloads within limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import MINI_DDTREE, git_seed, requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]

TILDE_PLAYBOOK = """\
name: where-am-i
patches:
  - id: where-am-i
    files: [ddtree.py]
    transform: {kind: set_call_kwarg, callee: DynamicCache, assigned_to: past_key_values_target, keyword: config,
                value: 'None'}
    checks:
      - {kind: command, run: 'test -f ddtree.py && test "$PWD" = "$HOME/ddtree"'}
"""


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    return git_seed(MINI_DDTREE, tmp_path_factory.mktemp("seed") / "mini-ddtree")


def test_verify_runs_command_checks_in_a_repo_given_relative_to_home(make_testbed, seed, tmp_path):
    bed = make_testbed(1, seed=seed)
    text = bed.inventory_path.read_text()
    assert '"/root/ddtree"' in text  # the testbed's user is root: ~/ddtree is the same repo
    bed.inventory_path.write_text(text.replace('"/root/ddtree"', '"~/ddtree"'))
    playbook = tmp_path / "where-am-i.yaml"
    playbook.write_text(TILDE_PLAYBOOK)
    proc = run_ddops("--json", "verify", "--all", str(playbook), inventory=bed.inventory_path)
    doc = json.loads(proc.stdout)
    command = [c for c in doc["hosts"][0]["data"]["checks"] if c["kind"] == "command"]
    assert command and command[0]["ok"], command or doc
