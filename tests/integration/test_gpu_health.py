"""GPU health through the CLI on real sshd hosts whose PATH finds a fake nvidia-smi (and dmesg) answering from the
hand-written fixtures of tests/fixtures/nvidia-smi: ping names each GPU's trouble per host."""

from __future__ import annotations

import pytest

from tests.conftest import requires_sshd, run_ddops_json
from tests.gpu_fixtures import fake_gpus_on_testbed_host

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture(scope="module")
def gpu_bed(tmp_path_factory):
    from tests.conftest import testbeds

    with testbeds(tmp_path_factory) as start:
        bed = start(4)
        for name, fixture in zip(("host1", "host2", "host3", "host4"),
                                 ("h100-idle", "h100-busy", "a100-unhealthy", "legacy-driver")):
            fake_gpus_on_testbed_host(bed, name, fixture)
        yield bed


def test_ping_reports_each_gpus_trouble_per_host(gpu_bed):
    code, doc = run_ddops_json("ping", "--all", inventory=gpu_bed.inventory_path)
    assert code == 0, doc
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["host1"]["message"] == "" and hosts["host1"]["data"]["gpu_issues"] == []
    assert len(hosts["host1"]["data"]["gpus"]) == 8 and hosts["host1"]["data"]["cuda_driver"] == "12.4"
    assert hosts["host2"]["data"]["gpu_issues"] == [
        "GPU 1 busy: pid 48213 /usr/bin/python3 (38.0 GiB)",
        "GPU 2 busy: 20.0 GiB in use by a process nvidia-smi does not list (another container?)"]
    issues = hosts["host3"]["data"]["gpu_issues"]
    assert [i.split(":")[0] for i in issues] == ["GPU 1 ecc", "GPU 2 throttled", "GPU 3 xid", "GPU 3 unlike siblings"]
    assert "GPU 1 ecc: 2 uncorrected ECC errors" in hosts["host3"]["message"]
    legacy = hosts["host4"]["data"]
    assert legacy["gpu_issues"] == [] and legacy["xid_events"] is None and legacy["cuda_driver"] == "11.4"
    assert [g["name"] for g in legacy["gpus"]] == ["Tesla V100-SXM2-16GB"] * 2
