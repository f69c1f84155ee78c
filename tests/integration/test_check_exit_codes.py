"""`sync` and `deploy` with `--check --exit-code` tell CI whether a host would change: 3 (EXIT_WOULD_CHANGE) while
one would, 0 once none would; and --check leaves the hosts as they were. (`patch --check --exit-code`:
tests/integration/test_json_contract.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddops.errors import EXIT_WOULD_CHANGE
from tests import conftest
from tests.conftest import git, requires_sshd, run_ddops
from tests.integration.test_sync import PATCHED, head, make_upstream, pin

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("upstream")
    commits = make_upstream(root / "work", root / "origin.git")
    return {**commits, "url": f"file://{root / 'origin.git'}"}


@pytest.fixture(scope="module")
def bed(tmp_path_factory, upstream):
    # Each test works on its own host (sync: host1, deploy: host2), so one testbed serves the module.
    with conftest.testbeds(tmp_path_factory) as start:
        bed = start(2)
        pin(bed, upstream["url"], "main", patches=["hybrid-cache"])
        yield bed


def files(repo: Path) -> dict[str, bytes]:
    """Every file of the checkout but git's own, with its bytes: what --check must leave as it was."""
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(repo).parts}


def ddops(bed, *args: str):
    return run_ddops(*args, inventory=bed.inventory_path)


def test_sync_check_exit_code_is_3_while_the_host_would_move_and_0_once_it_would_not(bed, upstream):
    host = bed.host("host1")
    proc = ddops(bed, "sync", "--host", "host1", "--check", "--exit-code")
    assert proc.returncode == EXIT_WOULD_CHANGE, proc.stdout + proc.stderr
    assert "would clone" in proc.stdout
    assert list(host.repo_dir.iterdir()) == []  # --check wrote nothing

    proc = ddops(bed, "sync", "--host", "host1", "--exit-code")  # it really moves: also 3
    assert proc.returncode == EXIT_WOULD_CHANGE, proc.stdout + proc.stderr
    assert head(host) == upstream["a"]
    proc = ddops(bed, "sync", "--host", "host1", "--check", "--exit-code")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    proc = ddops(bed, "--json", "sync", "--host", "host1", "--check", "--exit-code", "--commit", "b")
    assert proc.returncode == EXIT_WOULD_CHANGE, proc.stdout + proc.stderr
    assert conftest.one_json(proc)["exit_code"] == EXIT_WOULD_CHANGE
    assert head(host) == upstream["a"] and git(host.repo_dir, "status", "--porcelain") == ""


def test_deploy_check_exit_code_is_3_for_a_pending_sync_or_patch_and_0_once_deployed(bed, upstream):
    host = bed.host("host2")
    proc = ddops(bed, "deploy", "--host", "host2", "--check", "--exit-code")
    assert proc.returncode == EXIT_WOULD_CHANGE, proc.stdout + proc.stderr
    assert list(host.repo_dir.iterdir()) == []

    # At the pin but not patched: only the patch step would change something.
    assert ddops(bed, "sync", "--host", "host2", "--no-reapply").returncode == 0
    before = files(host.repo_dir)
    proc = ddops(bed, "deploy", "--host", "host2", "--check", "--exit-code")
    assert proc.returncode == EXIT_WOULD_CHANGE, proc.stdout + proc.stderr
    assert "would" in proc.stdout and files(host.repo_dir) == before
    assert PATCHED not in (host.repo_dir / "ddtree.py").read_text()

    proc = ddops(bed, "deploy", "--host", "host2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert PATCHED in (host.repo_dir / "ddtree.py").read_text()
    proc = ddops(bed, "deploy", "--host", "host2", "--check", "--exit-code")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert head(host) == upstream["a"]
