"""Views that scale with the fleet, through the CLI on real sshd hosts: identical lines and rows shown once with
their hosts, every distinct one shown, hosts in natural order, nothing cut short at 80 columns."""

from __future__ import annotations

import pytest

from tests.conftest import requires_sshd, run_ddops, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]

PATCHES = ("cpu-timing", "hybrid-cache", "crop-relative")


@pytest.fixture(scope="module")
def bed(tmp_path_factory, seed):
    from tests.conftest import testbeds

    with testbeds(tmp_path_factory) as start:
        yield start(3, seed=seed, patches=PATCHES)


def test_verify_prints_each_line_once_with_the_hosts_that_share_it(bed):
    assert run_ddops_json("patch", "--all", inventory=bed.inventory_path)[0] == 0
    one = run_ddops("verify", "--host", "host1", inventory=bed.inventory_path).stdout
    per_host = [line for line in one.splitlines() if line.startswith(("ok ", "FAIL "))]
    grouped = run_ddops("verify", "--all", inventory=bed.inventory_path)
    assert grouped.returncode == 0, grouped.stdout + grouped.stderr
    lines = [line for line in grouped.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    # no more lines than one host prints, not three times as many: each names all three hosts
    assert len(lines) == len(set(per_host)) and all(" all 3 hosts  " in line for line in lines)
    assert any("ddtree.py:" in line and "DynamicCache(config=" in line for line in lines)
    assert run_ddops_json("rollback", "--host", "host2", inventory=bed.inventory_path)[0] == 0
    mixed = run_ddops("verify", "--all", inventory=bed.inventory_path).stdout.splitlines()
    assert any(line.startswith("ok   host[1,3]\u00a0(2)  ddtree.py:") for line in mixed)
    assert any(line.startswith("FAIL host2  ") for line in mixed)
    assert not any(" all 3 hosts " in line for line in mixed if "ddtree.py:" in line)
    assert run_ddops_json("patch", "--host", "host2", inventory=bed.inventory_path)[0] == 0


def header_of(table: str) -> list[str]:
    """The column titles of a rich table's header line."""
    line = next(line for line in table.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


def test_status_has_a_column_per_playbook_not_per_patch_id(bed, tmp_path):
    assert run_ddops_json("patch", "--all", inventory=bed.inventory_path)[0] == 0
    proc = run_ddops("status", "--all", inventory=bed.inventory_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert header_of(proc.stdout) == ["host", "commit", "pin", "cpu-timing", "hybrid-cache", "crop-relative", "note"]
    assert all("applied" in line for line in proc.stdout.splitlines() if line.startswith("│ host"))
    # With no playbook named (an inventory without `patches:`), the journal's patch ids under their playbooks.
    bare = tmp_path / "bare.yaml"
    bare.write_text("\n".join(line for line in bed.inventory_path.read_text().splitlines()
                              if not line.startswith("patches:")) + "\n")
    journal = run_ddops("status", "--all", inventory=bare)
    assert journal.returncode == 0, journal.stdout + journal.stderr
    assert sorted(header_of(journal.stdout)[3:-1]) == ["cpu-timing", "crop-relative", "hybrid-cache"]
    # JSON keeps each patch id's state
    code, doc = run_ddops_json("status", "--all", inventory=bed.inventory_path)
    assert set(doc["hosts"][0]["data"]["patches"]) >= {"crop-helper", "crop-relative", "crop-recording"}


@pytest.fixture(scope="module")
def big_bed(tmp_path_factory):
    """22 hosts: 20 alike, one with 4 busy H100s and one with 8 idle ones (fake nvidia-smi from the fixtures)."""
    from tests.conftest import testbeds
    from tests.gpu_fixtures import fake_gpus_on_testbed_host

    with testbeds(tmp_path_factory) as start:
        bed = start(22)
        fake_gpus_on_testbed_host(bed, "host5", "h100-busy")
        fake_gpus_on_testbed_host(bed, "host17", "h100-idle")
        yield bed


def table_rows(stdout: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in stdout.splitlines()
            if line.lstrip().startswith("│")]


def test_ping_past_a_screenful_shows_every_distinct_row_with_alike_hosts_on_one(big_bed):
    proc = run_ddops("ping", "--all", inventory=big_bed.inventory_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    hosts = [row[0] for row in rows if row[0]]
    assert hosts == ["host[1-4,6-16,18-22]\u00a0(20)", "host5", "host17"], proc.stdout
    assert "22 hosts: 22 ok" in proc.stdout and "more host" not in proc.stdout
    first_lines = [row for row in rows if row[0]]  # a wrapped cell goes on below: its first line is enough here
    assert [row[6].split(" NVIDIA")[0] for row in first_lines] == ["no GPU", "4x", "8x"]
    assert [row[7].split(" ")[0] for row in first_lines] == ["-", "550.54.15", "550.54.15"]
    assert [row[-1].startswith("GPU 1 busy") for row in rows if row[0] == "host5"] == [True]
    every = run_ddops("ping", "--all", "--all-rows", inventory=big_bed.inventory_path)
    assert [row[0] for row in table_rows(every.stdout) if row[0]] == [f"host{i}" for i in range(1, 23)]


def test_at_80_columns_no_cell_is_cut_short(big_bed):
    for argv in (["ping", "--all"], ["status", "-v", "--all", "cpu-timing"], ["ping", "--all", "--all-rows"]):
        proc = run_ddops(*argv, inventory=big_bed.inventory_path, env={"COLUMNS": "80"})
        assert "…" not in proc.stdout, (argv, proc.stdout)
        assert all(len(line) <= 80 for line in proc.stdout.splitlines()), (argv, proc.stdout)
