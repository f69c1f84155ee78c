"""The fleet-like mode's arithmetic (benchmarks/fleet-speed/fleet_mode.py): the fit, the idle estimate, the model."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO_ROOT

FOLDER = REPO_ROOT / "benchmarks" / "fleet-speed"


@pytest.fixture(scope="module")
def fleet_mode():
    sys.path.insert(0, str(FOLDER))
    try:
        spec = importlib.util.spec_from_file_location("fleet_mode", FOLDER / "fleet_mode.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(FOLDER))


def sample(wall: float, per_host: list[float], *, cpu: float = 0.5, host_cpu: float = 0.0, turns: float = 0.0,
           ok: bool = True) -> dict:
    return {"wall": wall, "cpu": cpu, "host_cpu": host_cpu, "ok": ok,
            "extra": {"per_host_s": per_host, "turns_per_host": turns}}


def test_the_fit_takes_each_host_s_own_time_and_leaves_the_rest_to_startup(fleet_mode):
    rows = {"1": [sample(0.5, [0.3]), sample(0.7, [0.3])], "4": [sample(1.6, [0.3, 0.3, 0.3, 0.3])],
            "bad": [sample(9.0, [9.0], ok=False)]}
    startup, per_host = fleet_mode.fit(rows)
    assert per_host == pytest.approx(0.3)
    assert startup == pytest.approx(0.4)  # the walls less their hosts: 0.2, 0.4 and 0.4
    assert fleet_mode.fit({"1": [sample(1.0, [0.5], ok=False)]}) is None


def test_a_cost_paid_once_in_the_first_host_s_time_is_startup_not_per_host_latency(fleet_mode):
    # A cold plan: 0.2 s of startup, hosts of 0.3 s, and the first host of every run waits 0.4 s more for libcst.
    rows = {"1": [sample(0.9, [0.7])] * 3, "4": [sample(1.8, [0.7, 0.3, 0.3, 0.3])] * 3}
    startup, per_host = fleet_mode.fit(rows)
    assert per_host == pytest.approx(0.3)
    assert startup == pytest.approx(0.6)  # paid once per run: 0.9 - 1 x 0.3 and 1.8 - 4 x 0.3


def test_the_idle_estimate_is_round_trips_times_rtt_plus_the_cpu_per_host(fleet_mode):
    rows = {"1": [sample(2.0, [0.5], cpu=0.61, host_cpu=0.03, turns=18)],
            "4": [sample(3.0, [0.5] * 4, cpu=0.64, host_cpu=0.12, turns=18)]}
    startup, per_host, waited = fleet_mode.idle_estimate(rows, 20, cpu_per_host=0.01)
    assert waited == 9
    assert per_host == pytest.approx(9 * 0.020 + 0.01 + 0.03)
    assert startup == pytest.approx(0.60)


def test_the_model_is_waves_of_latency_unless_the_controller_s_cpu_takes_longer(fleet_mode):
    # 200 hosts, 32 at a time: 7 waves.
    assert fleet_mode.model(0.5, 0.25, 1.0, "ddops") == (pytest.approx(0.5 + 7 * 0.25), "latency")
    assert fleet_mode.model(0.5, 0.25, 3.0, "ddops") == (3.0, "controller CPU")
    # ssh processes spread over every core; one Python process has one.
    cores = fleet_mode.usable_cores("floor")
    assert fleet_mode.model(0.0, 0.1, 4.0 * cores, "floor") == (4.0, "controller CPU")


def test_the_cpu_mode_puts_the_controller_on_a_core_of_its_own_and_the_hosts_on_the_others(fleet_mode):
    import os
    import subprocess
    from types import SimpleNamespace

    from run import Tool

    cores = sorted(os.sched_getaffinity(0))
    host = subprocess.Popen(["sleep", "60"])  # stands in for a host's sshd listener
    try:
        bed = SimpleNamespace(listeners=lambda: [host.pid])
        tool = Tool("ddops", "label", "ddops", lambda n: ["ddops", "patch", str(n)], lambda n: {})
        tools, split = fleet_mode.split_cores(bed, [tool])
        if len(cores) < 2:
            assert split is None and tools == [tool]
            return
        assert split == {"controller": cores[:1], "hosts": cores[1:]}
        assert sorted(os.sched_getaffinity(host.pid)) == cores[1:]
        assert tools[0].argv(3) == ["taskset", "-c", str(cores[0]), "ddops", "patch", "3"]
    finally:
        host.kill()
        host.wait()


def test_the_pair_with_an_earlier_checkout_shows_each_command_s_cpu_per_host_side_by_side(fleet_mode):
    def at(*cpus: float) -> list[dict]:
        return [{"cpu": c, "wall": 1.0, "ok": True} for c in cpus]

    doc = {"sizes": [32, 200], "repeats": 2, "baseline": {"repo": "/tmp/base-126d2e9", "playbook": "/x/hc.yaml"},
           "rows": {"ddops": {"32": at(0.5, 0.7), "200": at(2.2, 2.4)},
                    "baseline-warm": {"32": at(0.6, 0.6), "200": at(3.0, 3.0)}}}
    lines = fleet_mode.baseline_pair(doc)
    assert "base-126d2e9" in lines[0] and "`hc.yaml`" in lines[0]
    warm = next(line for line in lines if line.startswith("| first apply, warm plan |"))
    # (2.3 - 0.6) / 168 hosts = 10.1 ms this checkout; (3.0 - 0.6) / 168 = 14.3 ms the earlier one
    # every wall equal: at equal wall is the plain slope
    assert warm == "| first apply, warm plan | 0.60 (0.50–0.70) / 0.60 (0.60–0.60) " \
                   "| 2.30 (2.20–2.40) / 3.00 (3.00–3.00)" \
                   " | 10.1 / 14.3 | 10.1 / 14.3 | 1.00 / 1.00 | 1.00 / 1.00 |"
    assert any(line.startswith("| rerun | – | – | – | – | – | – |") for line in lines)  # rows not run say so


def test_at_equal_wall_two_rows_that_cost_the_same_at_the_same_wall_read_the_same(fleet_mode):
    """On this machine the controller's CPU grows with a run's wall: a row whose runs took longer (its hosts worked
    longer, or the machine was slow) must not read as a dearer controller."""
    def runs(per_host_ms: float, n: int, walls: list[float]) -> list[dict]:
        # CPU = a fixed start + per host + 0.3 s for every second of wall
        return [{"cpu": 0.2 + n * per_host_ms / 1000 + 0.3 * w, "wall": w, "ok": True} for w in walls]

    doc = {"sizes": [32, 200], "rows": {
        "ddops": {"32": runs(5, 32, [1.0, 1.2, 1.4]), "200": runs(5, 200, [6.0, 6.5, 7.0])},
        "baseline-warm": {"32": runs(5, 32, [0.9, 1.0, 1.1]), "200": runs(5, 200, [4.5, 5.0, 5.5])},
        "ddops-rerun": {"32": runs(4, 32, [0.8, 1.0, 1.2]), "200": runs(4, 200, [4.0, 4.2, 4.4])},
        "baseline-rerun": {"32": runs(3, 32, [0.8, 1.0, 1.2]), "200": runs(3, 200, [4.0, 4.2, 4.4])}}}
    plain, even = fleet_mode.cpu_figures(doc)[1], fleet_mode.cpu_at_equal_wall(doc, "ddops", "baseline-warm")
    assert plain["ddops"] > 1.1 * plain["baseline-warm"]  # the longer walls alone read as 13% dearer
    assert even[0] == pytest.approx(even[1])
    ours, theirs = fleet_mode.cpu_at_equal_wall(doc, "ddops-rerun", "baseline-rerun")
    assert ours - theirs == pytest.approx(0.001)  # what differs per host still shows
    assert fleet_mode.cpu_at_equal_wall(doc, "ddops", "ddops-check") is None  # a row not run


def test_a_run_on_the_first_hosts_leaves_larger_sizes_mixed_and_smaller_ones_in_its_state(fleet_mode):
    states_after = fleet_mode.run.states_after
    applied = {32: "applied", 200: "applied"}
    assert states_after(applied, 32, "pristine") == {32: "pristine", 200: "mixed"}
    assert states_after(applied, 32, "applied") == applied
    assert states_after({32: "pristine", 200: "mixed"}, 200, "applied") == applied
    assert states_after({32: "applied"}, 200, "pristine") == {32: "pristine", 200: "pristine"}
