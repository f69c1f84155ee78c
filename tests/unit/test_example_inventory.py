"""The checkout's example inventory (10.x hosts that are nobody's) is refused until edited: a command run in the
checkout without -i reads it by default, and must dial nothing. Run here on a copy, in a folder of its own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from ddops.inventory import load_inventory
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "inventory.yaml"


def ddops_in(folder, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddops", *argv], capture_output=True, text=True, cwd=folder,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(folder)})


def test_a_command_run_where_the_example_is_the_default_inventory_is_refused_in_one_line(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "inventory.yaml")
    line = next(i for i, text in enumerate(EXAMPLE.read_text().splitlines(), 1) if text == "example: true")
    for argv in (["ping", "--all"], ["patch", "--all", "--check"], ["inventory", "check"], ["status"]):
        done = ddops_in(tmp_path, *argv)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert done.stderr.startswith(f"ddops: error: inventory.yaml:{line}: example: this is ddops' example "
                                      "inventory, its hosts are not yours: copy it, put your hosts in and delete "
                                      "this line"), done.stderr
    doc = json.loads(ddops_in(tmp_path, "--json", "ping", "--all").stdout)
    assert doc["exit_code"] == 2 and "example inventory" in doc["error"] and "hosts" not in doc


def test_the_example_with_its_marker_line_deleted_is_a_valid_inventory(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(EXAMPLE.read_text().replace("example: true\n", ""))
    inventory = load_inventory(mine)
    assert [h.name for h in inventory.hosts] == ["h200-a", "h200-b", "bastion"]
    assert any(h.address == "10.1.230.172" for h in inventory.hosts)
