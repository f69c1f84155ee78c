"""The controller's cache shows what is on the hosts (plans hold diffs of their files): only its user may read it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from tests.conftest import MINI_DDTREE, git_seed, run_ddops


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_the_cache_folder_plans_and_plan_files_are_private_even_where_an_older_run_left_them_open(tmp_path):
    checkout = git_seed(MINI_DDTREE, tmp_path / "checkout")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("ssh_config: /dev/null\npatches: [hybrid-cache]\n"
                         f"hosts:\n  here: {{connection: local, repo: {json.dumps(str(checkout))}}}\n")
    cache = tmp_path / "cache"
    (cache / "plans").mkdir(parents=True)
    for folder in (cache, cache / "plans"):
        folder.chmod(0o755)  # as ddops before this left them

    proc = run_ddops("--json", "patch", "--all", "--check", inventory=inventory,
                     env={"DDOPS_CACHE_DIR": str(cache), "DDOPS_PLAN_CACHE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = modes(cache)
    plan_files = [name for name in found if name.startswith("plans/") and name.endswith(".json")]
    assert plan_files, found  # the run did cache its plans
    assert {name: mode for name, mode in found.items() if (cache / name).is_dir() and mode != 0o700} == {}
    assert {name: mode for name, mode in found.items() if (cache / name).is_file() and mode != 0o600} == {}


def test_a_plan_written_to_the_cache_is_0600_in_0700_folders(tmp_path, monkeypatch):
    from ddops.patching.plan import Planner
    from ddops.patching.plan_store import default_store
    from ddops.patching.playbook import load_playbook

    monkeypatch.setenv("DDOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DDOPS_PLAN_CACHE", raising=False)
    planner = Planner(store=default_store())
    planner.plan_file("ddtree.py", (MINI_DDTREE / "ddtree.py").read_bytes(), load_playbook("hybrid-cache").patches)
    found = modes(tmp_path / "cache")
    assert any(name.endswith(".json") for name in found), found
    assert {name: mode for name, mode in found.items() if mode not in (0o700, 0o600)} == {}
