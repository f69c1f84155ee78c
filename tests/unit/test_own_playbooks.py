"""A team's own playbooks and plans: `playbook_dirs:` and $DDOPS_PLAYBOOK_PATH searched before the built-ins, paths in
`patches:` read against the inventory's folder, `inventory check` validating every name, and `playbook lint`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.bench.preflight import load_plan
from ddops.errors import InventoryError, PlaybookError
from ddops.inventory import load_inventory
from ddops.patching.playbook import PLAYBOOK_PATH_ENV, load_inventory_playbooks
from tests.conftest import MINI_DDTREE, REPO_ROOT, run_ddops

OWN_PLAYBOOK = """name: {name}
description: a team's own patch
patches:
  - id: {id}
    files: [dflash.py]
    transform:
      kind: wrap_statement_in_if
      in_function: cuda_time
      statement: torch.cuda.synchronize()
      condition: torch.cuda.is_available()
    checks:
      - compiles
"""


def inventory(folder: Path, head: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "inventory.yaml"
    path.write_text(f"ssh_config: /dev/null\n{head}hosts:\n  a: {{address: 127.0.0.9}}\n")
    return path


def test_a_path_in_patches_is_read_against_the_inventory_folder_not_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "ops" / "mine").mkdir(parents=True)
    (tmp_path / "ops" / "mine" / "fix.yaml").write_text(OWN_PLAYBOOK.format(name="fix", id="own-fix"))
    path = inventory(tmp_path / "ops", "patches: [mine/fix.yaml]\n")
    monkeypatch.chdir(tmp_path)  # cron and CI run from elsewhere
    [book] = load_inventory_playbooks(load_inventory(path))
    assert book.name == "fix" and Path(book.path) == tmp_path / "ops" / "mine" / "fix.yaml"


def test_playbook_dirs_come_first_then_ddops_playbook_path_then_the_builtins(tmp_path, monkeypatch):
    for folder, patch_id in (("ours", "ours-cpu-timing"), ("env", "env-cpu-timing")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "cpu-timing.yaml").write_text(OWN_PLAYBOOK.format(name="cpu-timing", id=patch_id))
        (tmp_path / folder / f"{folder}-only.yaml").write_text(OWN_PLAYBOOK.format(name=f"{folder}-only",
                                                                                  id=f"{folder}-only"))
    monkeypatch.setenv(PLAYBOOK_PATH_ENV, str(tmp_path / "env"))
    path = inventory(tmp_path / "inv", "playbook_dirs: [../ours]\npatches: [cpu-timing, env-only, hybrid-cache]\n")
    books = load_inventory_playbooks(load_inventory(path))
    assert [p.id for b in books for p in b.patches] == ["ours-cpu-timing", "env-only", "hybrid-cache"]
    monkeypatch.delenv(PLAYBOOK_PATH_ENV)
    without = inventory(tmp_path / "plain", "patches: [cpu-timing]\n")
    assert [p.id for b in load_inventory_playbooks(load_inventory(without)) for p in b.patches] == ["cpu-timing"]


def test_a_bench_plan_is_found_in_the_inventorys_playbook_dirs(tmp_path):
    (tmp_path / "plans").mkdir()
    text = (REPO_ROOT / "playbooks" / "mini-ddtree-bench.yaml").read_text()
    (tmp_path / "plans" / "team-bench.yaml").write_text(text.replace("name: mini-ddtree-bench", "name: team-bench"))
    path = inventory(tmp_path, "playbook_dirs: [plans]\n")
    assert load_plan("team-bench", load_inventory(path)).name == "team-bench"


def test_an_unknown_name_in_patches_is_an_error_at_its_line_with_a_suggestion(tmp_path):
    path = inventory(tmp_path, "patches:\n  - hybrid-cache\n  - hybrid-cahce\n")
    with pytest.raises(PlaybookError) as caught:
        load_inventory_playbooks(load_inventory(path))
    assert str(caught.value).startswith(f"{path}:4: patches[1]: no playbook named 'hybrid-cahce'")
    assert "(did you mean 'hybrid-cache'?)" in str(caught.value)


def test_a_playbook_dir_that_is_not_a_folder_is_an_error_at_its_line(tmp_path):
    path = inventory(tmp_path, "playbook_dirs:\n  - nowhere\n")
    with pytest.raises(InventoryError, match=r"inventory.yaml:3: playbook_dirs\[0\]: 'nowhere' is not a folder"):
        load_inventory(path)


def test_inventory_check_loads_every_playbook_in_patches_and_names_a_bad_one_at_file_and_line(tmp_path):
    good = inventory(tmp_path / "good", "patches: [hybrid-cache, cpu-timing]\n")
    proc = run_ddops("inventory", "check", inventory=good)
    assert proc.returncode == 0 and "patches: hybrid-cache, cpu-timing" in proc.stdout, proc.stderr
    bad = inventory(tmp_path / "bad", "patches: [hybrid-cache, cpu-timng]\n")
    proc = run_ddops("inventory", "check", inventory=bad)
    assert proc.returncode == 2
    assert f"{bad}:2: patches[1]: no playbook named 'cpu-timng'" in proc.stderr
    assert "did you mean 'cpu-timing'?" in proc.stderr
    broken = tmp_path / "broken" / "mine.yaml"
    broken.parent.mkdir()
    broken.write_text(OWN_PLAYBOOK.format(name="mine", id="x").replace("kind: wrap_statement_in_if",
                                                                       "kind: wrap_statment_in_if"))
    proc = run_ddops("inventory", "check", inventory=inventory(tmp_path / "broken", "patches: [./mine.yaml]\n"))
    assert proc.returncode == 2 and f"patches[0]: {broken}:" in proc.stderr and "wrap_statement_in_if" in proc.stderr


def test_playbook_lint_checks_the_schema_without_hosts(tmp_path):
    broken = tmp_path / "mine.yaml"
    broken.write_text(OWN_PLAYBOOK.format(name="mine", id="x").replace("in_function:", "in_functon:"))
    proc = run_ddops("playbook", "lint", str(broken))
    assert proc.returncode == 2 and f"{broken}:8:" in proc.stderr and "did you mean 'in_function'?" in proc.stderr
    proc = run_ddops("playbook", "lint", str(REPO_ROOT / "playbooks" / "mini-ddtree-bench.yaml"))
    assert proc.returncode == 0 and "ok (bench plan mini-ddtree-bench)" in proc.stdout


def test_playbook_lint_tries_the_transform_and_checks_on_a_sample_file(tmp_path):
    playbook = REPO_ROOT / "playbooks" / "cpu-timing.yaml"
    proc = run_ddops("playbook", "lint", str(playbook), "--sample", str(MINI_DDTREE / "dflash.py"), "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cpu-timing: pending" in proc.stdout and "+    if torch.cuda.is_available():" in proc.stdout
    upstream = tmp_path / "upstream-dflash.py"  # upstream renamed the function the patch is anchored in
    upstream.write_text((MINI_DDTREE / "dflash.py").read_text().replace("def cuda_time", "def gpu_time"))
    proc = run_ddops("playbook", "lint", str(playbook), "--sample", f"dflash.py={upstream}")
    assert proc.returncode == 1 and "FAIL" in proc.stdout and "cpu-timing: drifted" in proc.stdout
    proc = run_ddops("playbook", "lint", str(playbook), "--sample", str(MINI_DDTREE / "ddtree.py"))
    assert proc.returncode == 2 and "none of the files cpu-timing patches is named ddtree.py" in proc.stderr


@pytest.mark.parametrize("source", ["playbook_dirs", "DDOPS_PLAYBOOK_PATH", "a path in patches"])
def test_bench_checks_a_required_patch_of_a_teams_own_playbook_against_the_files_not_the_journal(tmp_path, source):
    from tests.conftest import git_seed

    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "team-timing.yaml").write_text(OWN_PLAYBOOK.format(name="team-timing", id="team-timing"))
    checkout = git_seed(MINI_DDTREE, tmp_path / "checkout")
    plan = tmp_path / "needs-team-timing.yaml"
    plan.write_text("name: needs-team-timing\nsummarizer: ddtree\nresults: '*.pt'\ncommand: 'true'\n"
                    "requires_patches: [team-timing]\n")
    head = {"playbook_dirs": "playbook_dirs: [ours]\npatches: [team-timing]\n",
            "DDOPS_PLAYBOOK_PATH": "patches: [team-timing]\n",
            "a path in patches": "patches: [ours/team-timing.yaml]\n"}[source]
    path = tmp_path / "inventory.yaml"
    path.write_text(f"ssh_config: /dev/null\nknown_hosts: {tmp_path / 'known_hosts'}\n{head}"
                    f"hosts:\n  here: {{connection: local, repo: {json.dumps(str(checkout))}}}\n")
    env = {"SSH_AUTH_SOCK": ""}
    if source == "DDOPS_PLAYBOOK_PATH":
        env[PLAYBOOK_PATH_ENV] = str(tmp_path / "ours")

    def check() -> tuple[int, dict]:
        proc = run_ddops("--json", "bench", str(plan), "--check", "--all", inventory=path, env=env)
        return proc.returncode, json.loads(proc.stdout)["hosts"][0]

    code, host = check()
    assert code == 1 and host["data"]["patches"] == {"team-timing": "pending"}, host  # read from the files
    assert run_ddops("patch", "--all", inventory=path, env=env).returncode == 0
    code, host = check()
    assert code == 0 and host["status"] == "ok", host
    dflash = checkout / "dflash.py"
    dflash.write_text(dflash.read_text().replace("if torch.cuda.is_available():", "if True:", 1))
    code, host = check()
    assert code == 1 and host["data"]["patches"]["team-timing"] not in ("applied", "pending"), host


@pytest.mark.parametrize("folder_mode, file_mode, culprit, mode", [
    (0o777, 0o644, "ours", "0777"),  # anyone may add a cpu-timing.yaml there
    (0o775, 0o644, "ours", "0775"),  # the group may
    (0o755, 0o666, "ours/mine.yaml", "0666"),  # anyone may rewrite this playbook
    (0o755, 0o664, "ours/mine.py", "0664"),  # or the module a playbook ships to the hosts
])
def test_a_playbook_dir_or_file_others_may_write_is_refused_at_its_line(tmp_path, folder_mode, file_mode, culprit,
                                                                         mode):
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "mine.yaml").write_text(OWN_PLAYBOOK.format(name="mine", id="mine"))
    (tmp_path / "ours" / "mine.py").write_text("x = 1\n")
    (tmp_path / "ours").chmod(folder_mode)
    (tmp_path / "ours" / Path(culprit).name if "/" in culprit else tmp_path / "ours" / "mine.yaml").chmod(file_mode)
    path = inventory(tmp_path / "inv", "playbook_dirs: [../ours]\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value).startswith(f"{path}:2: playbook_dirs[0]: {tmp_path / culprit} is writable by others "
                                        f"(mode {mode}): ddops takes playbooks and plans only from folders and files "
                                        "no other user can change")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to give a folder to another user")
def test_a_playbook_dir_of_another_user_is_refused(tmp_path):
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(InventoryError, match=r"playbook_dirs\[0\]: .*theirs belongs to nobody \(uid 65534\)"):
        load_inventory(inventory(tmp_path / "inv", "playbook_dirs: [../theirs]\n"))


def test_ddops_playbook_path_refuses_a_folder_others_may_write(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared").chmod(0o1777)  # sticky or not: anyone may add a playbook of a built-in's name
    proc = run_ddops("inventory", "check", inventory=inventory(tmp_path / "inv", "patches: [cpu-timing]\n"),
                     env={PLAYBOOK_PATH_ENV: str(tmp_path / "shared")})
    assert proc.returncode == 2
    assert (f"{PLAYBOOK_PATH_ENV}: {tmp_path / 'shared'} is writable by others (mode 1777): ddops takes playbooks"
            in proc.stderr)


def test_a_playbook_or_plan_that_shadows_a_built_in_is_said_once(tmp_path):
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "cpu-timing.yaml").write_text(OWN_PLAYBOOK.format(name="cpu-timing", id="our-timing"))
    plan = (REPO_ROOT / "playbooks" / "mini-ddtree-bench.yaml").read_text()
    (tmp_path / "ours" / "mini-ddtree-bench.yaml").write_text(plan)
    path = inventory(tmp_path / "inv", "playbook_dirs: [../ours]\npatches: [cpu-timing, hybrid-cache]\n")
    proc = run_ddops("inventory", "check", inventory=path)
    assert proc.returncode == 0, proc.stderr
    note = f"ddops: note: {tmp_path / 'ours' / 'cpu-timing.yaml'} shadows the built-in cpu-timing"
    assert proc.stderr.count(note) == 1 and "hybrid-cache" not in proc.stderr
    code = "from ddops.bench.preflight import load_plan; from ddops.inventory import load_inventory; " \
           f"load_plan('mini-ddtree-bench', load_inventory({str(path)!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert f"{tmp_path / 'ours' / 'mini-ddtree-bench.yaml'} shadows the built-in mini-ddtree-bench" in done.stderr
