"""Controller-side trust over real sshd hosts: `repo: ~/...` means the host's home, collect downloads within limits."""

from __future__ import annotations

import json

import pytest

from tests.conftest import requires_sshd, run_ddops

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


def test_collect_refuses_files_listed_over_the_size_limit_and_takes_the_rest(make_testbed, tmp_path):
    from ddops.bench.collect import write_manifest
    from ddops.bench.plan import load_bench_plan
    from ddops.fleet import run_fleet
    from ddops.inventory import load_inventory
    from ddops.tasks.bench import collect_task, launch_task, manifest_entries, status_task
    from ddops.transport import Connector
    from tests.conftest import wait_until

    bed = make_testbed(1)
    inv = load_inventory(bed.inventory_path)
    host, connect = inv.hosts[0], Connector(inv.known_hosts).connect
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text("summarizer: ddtree\nresults: '*.pt'\n"
                         "command: printf abc > {result_dir}/a.pt; head -c 5000 /dev/zero > {result_dir}/big.pt\n")
    (launched,) = run_fleet([host], launch_task(load_bench_plan(plan_path), "r-big"), connect)
    assert launched.status == "changed", launched.message

    def finished():
        with connect(host) as session:
            return status_task("r-big")(host, session).report.run.status == "completed"

    wait_until(finished, timeout=60)
    root = tmp_path / "results"
    (result,) = run_fleet([host], collect_task("r-big", root, max_file_bytes=1024), connect)
    assert result.status == "failed"
    assert "refused: big.pt (4.88 KiB, over the 1 KiB limit (--max-file-size))" in result.message
    assert sorted(p.name for p in (root / "r-big" / host.name).iterdir()) == ["a.pt"]
    entry = json.loads(write_manifest(root, "r-big", manifest_entries([result])).read_text())["hosts"][host.name]
    assert [f["path"] for f in entry["files"]] == ["a.pt"] and entry["refused"][0]["path"] == "big.pt"


def test_a_download_stops_at_its_limit_when_the_file_is_bigger_than_listed(make_testbed, tmp_path):
    from ddops.errors import DdopsError
    from ddops.inventory import load_inventory
    from ddops.transport import Connector

    bed = make_testbed(1)
    (bed.hosts[0].repo_dir / "grown.pt").write_bytes(b"x" * 100_000)
    inv = load_inventory(bed.inventory_path)
    local = tmp_path / "grown.pt"
    with Connector(inv.known_hosts).connect(inv.hosts[0]) as session:
        with pytest.raises(DdopsError, match=r"grown.pt: refused: more than 1000 bytes arrived"):
            session.get_file(f"{inv.hosts[0].repo}/grown.pt", local, max_bytes=1000)
        assert local.stat().st_size <= 1000
        session.get_file(f"{inv.hosts[0].repo}/grown.pt", local, max_bytes=100_000)
        assert local.read_bytes() == b"x" * 100_000
