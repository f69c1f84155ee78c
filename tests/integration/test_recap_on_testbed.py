"""The folded recap through the real CLI: past a screenful of hosts (ddops.fleet.FOLD_OVER, 20) the recap shows the
hosts to look at (failed, unreachable, drifted, changed) in full, hosts with identical rows on one row (their names
as ranges, `host[1-2] (2)`), and folds the rest into one count line; `--all-rows` shows every host. Rows come in
natural order of their first host. (The folding logic itself: tests/unit/test_recap_folding.py.)

21 hosts without 21 sshd: 3 testbed hosts (host3 lacks the file hybrid-cache patches, so it drifts) and 18 inventory
entries on the testbed's own loopback /24 where nothing listens (the inventory refuses two names for one
address:port, so they cannot share an sshd)."""

from __future__ import annotations

import re

import pytest

from ddops.fleet import FOLD_OVER
from tests import conftest
from tests.conftest import requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]

GONE = [f"gone{i:02d}" for i in range(1, 19)]
ALL = ["host1", "host2", "host3", *GONE]


@pytest.fixture(scope="module")
def bed(tmp_path_factory, seed):
    with conftest.testbeds(tmp_path_factory) as start:
        bed = start(3, seed=seed, patches=("hybrid-cache",))
        (bed.host("host3").repo_dir / "ddtree.py").unlink()
        prefix, port = bed.hosts[0].address.rsplit(".", 1)[0], bed.hosts[0].port
        with bed.inventory_path.open("a") as fh:
            for i, name in enumerate(GONE, 1):
                fh.write(f"  {name}: {{address: {prefix}.{200 + i}, port: {port}, groups: [testbed]}}\n")
        assert len(ALL) > FOLD_OVER
        yield bed


@pytest.fixture(scope="module")
def first_patch(bed):
    """`ddops patch --all` once: host1 and host2 change, host3 drifts, the gone hosts are unreachable."""
    return run_ddops("patch", "--all", inventory=bed.inventory_path)


def recap_rows(stdout: str) -> list[tuple[str, str]]:
    """(host cell, status) of each row of the recap table (rich's box drawing, one line per row at 200 columns)."""
    rows = []
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if line.lstrip().startswith("│") and len(cells) > 2:
            rows.append((cells[0], cells[1]))
    return rows


def test_a_big_run_groups_identical_rows_and_shows_every_host_that_needs_a_look(first_patch):
    assert first_patch.returncode == 1, first_patch.stdout + first_patch.stderr
    rows = recap_rows(first_patch.stdout)
    # rows in natural order of their first host; alike hosts share a row, their names as a range
    assert rows == [*((g, "unreachable") for g in GONE), ("host[1-2]\u00a0(2)", "changed"), ("host3", "drifted")]
    assert "more host" not in first_patch.stdout  # nothing ok or skipped: nothing folded
    assert "21 hosts: 2 changed, 18 unreachable, 1 drifted" in first_patch.stdout


def test_the_ok_hosts_fold_into_one_count_line_and_all_rows_shows_every_host(bed, first_patch):
    proc = run_ddops("patch", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = recap_rows(proc.stdout)
    assert rows == [*((g, "unreachable") for g in GONE), ("host3", "drifted")]
    assert "drifted: ddtree.py: no such file" in " ".join(proc.stdout.split())
    assert re.search(r"^2 more hosts ok \(--all-rows shows every host\)$", proc.stdout, re.M), proc.stdout
    assert "21 hosts: 2 ok, 18 unreachable, 1 drifted" in proc.stdout

    proc = run_ddops("patch", "--all", "--all-rows", inventory=bed.inventory_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = recap_rows(proc.stdout)
    assert [host for host, _ in rows] == [*GONE, "host1", "host2", "host3"]
    assert dict(rows)["host1"] == dict(rows)["host2"] == "ok" and dict(rows)["host3"] == "drifted"
    assert "more host" not in proc.stdout
