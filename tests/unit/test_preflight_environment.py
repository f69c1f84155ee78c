"""Before a launch: the packages a plan declares against the host's versions, the hybrid playbooks' tested
transformers, and the GPUs' health, as the preflight decides them (pure: facts in, refusals and warnings out)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddops.bench.environment import Support, canonical, transformers_verdict, unmet
from ddops.bench.plan import BenchPlan, load_bench_plan
from ddops.bench.preflight import environment_check, facts_request, provenance_of
from ddops.errors import PlaybookError
from ddops.inventory import Host

PLAN = BenchPlan(name="p", command="true", results="*.pt", summarizer="ddtree", gpus=1,
                 requires_packages=(("torch", ">=2.4"), ("transformers", ">=5.16,<5.25")))
HOST = Host(name="host24", address="10.0.0.24")
SUPPORT = Support(("5.2.0", "5.16.1", "5.17.0", "5.24.0"))
IDLE_GPU = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-a", "bus_id": "00000000:18:00.0",
            "memory_total_mib": 81559, "memory_used_mib": 0, "utilization_pct": 0, "driver_version": "550.54.15",
            "clock_event_reasons": 1}


def facts(transformers: str | None = "5.24.0", torch: str | None = "2.5.1", **more) -> dict:
    return {"versions": {"torch": torch, "transformers": transformers}, "python_executable": "/usr/bin/python3",
            "gpus": [IDLE_GPU], "gpu_processes": [], "xid_events": [], **more}


def test_a_transformers_outside_the_plans_range_is_refused_in_one_line_saying_what_to_install_where():
    assert unmet(PLAN.requires_packages, facts("5.25.0")["versions"], "/usr/bin/python3") == [
        "transformers 5.25.0, plan needs >=5.16,<5.25 (install it for /usr/bin/python3: "
        "/usr/bin/python3 -m pip install 'transformers>=5.16,<5.25')"]


def test_a_missing_package_is_refused_and_a_met_range_is_not():
    assert unmet([("torch", ">=2.4")], {"torch": None}, "python3") == [
        "torch is not installed, plan needs >=2.4 (install it for python3: python3 -m pip install 'torch>=2.4')"]
    assert unmet([("torch", ">=2.4")], {"torch": "2.13.0+cpu"}, "python3") == []
    assert unmet([("torch", "")], {"torch": "1.0"}, "python3") == []


def test_package_names_compare_as_pep_503_and_prereleases_by_their_number():
    assert canonical("Flash_Linear.Attention") == "flash-linear-attention"
    assert unmet([("flash_linear_attention", ">=0.3")], {"flash-linear-attention": "0.3.2"}, "p") == []
    assert unmet([("transformers", ">=5.16,<5.25")], {"transformers": "5.24.0.dev0"}, "p") == []
    assert unmet([("transformers", ">=5.16,<5.25")], {"transformers": "5.25.0rc1"}, "p") != []


def test_the_support_matrix_tells_tested_its_release_line_and_untested_apart():
    assert SUPPORT.verdict("5.24.0") == (True, "transformers 5.24.0 (tested)")
    assert SUPPORT.verdict("5.17.2") == (True, "transformers 5.17.2 (its release line is tested: 5.17.0)")
    assert SUPPORT.verdict("5.26.0") == (
        False, "transformers 5.26.0 (untested: the hybrid playbooks are tested with 5.2.0-5.24.0)")
    assert SUPPORT.verdict(None) == (False, "transformers is not installed")


def test_a_release_the_matrix_proved_unsupported_says_why():
    support = Support(("5.5.4", "5.25.0"), unsupported=(("5.3.0", "its Qwen3.5 brings its own cache class"),))
    assert support.verdict("5.3.1") == (
        False, "transformers 5.3.1 (not supported by the hybrid playbooks: its Qwen3.5 brings its own cache class)")


def test_the_shipped_matrix_is_read_without_torch_and_covers_the_mini_extras_range():
    from ddops.bench.environment import hybrid_support

    support = hybrid_support()
    assert support is not None and support.verdict(support.releases[-1])[0] is True
    assert all(not support.verdict(version)[0] for version, _ in support.unsupported)


def test_the_matrix_speaks_only_where_a_hybrid_playbook_is_involved():
    versions = {"transformers": "5.26.0"}
    assert transformers_verdict(["cpu-timing"], versions, SUPPORT) is None
    assert transformers_verdict(["cpu-timing", "crop-relative"], versions, SUPPORT)[0] is False


def test_preflight_refuses_unmet_packages_and_warns_of_an_untested_transformers(monkeypatch):
    monkeypatch.setattr("ddops.bench.environment.hybrid_support", lambda: SUPPORT)
    check = environment_check(PLAN, HOST, facts("5.15.1"), ["hybrid-cache"])
    assert check.refusals == ("transformers 5.15.1, plan needs >=5.16,<5.25 (install it for /usr/bin/python3: "
                              "/usr/bin/python3 -m pip install 'transformers>=5.16,<5.25')",)
    assert check.warnings == ("transformers 5.15.1 (untested: the hybrid playbooks are tested with 5.2.0-5.24.0)",)
    fine = environment_check(PLAN, HOST, facts("5.24.0"), ["hybrid-cache"])
    assert fine.refusals == () and fine.warnings == () and fine.seen == ("transformers 5.24.0 (tested)",)


def test_a_busy_gpu_is_refused_unless_allowed_by_flag_or_plan():
    held = facts(gpu_processes=[{"gpu_uuid": "GPU-a", "pid": 7, "name": "python3", "used_memory_mib": 2048}])
    (refusal,) = environment_check(PLAN, HOST, held).refusals
    assert refusal == "GPU 0 busy: pid 7 python3 (2.0 GiB) (--allow-busy-gpus runs anyway)"
    allowed = environment_check(PLAN, HOST, held, allow_busy_gpus=True)
    assert allowed.refusals == () and allowed.warnings == ("GPU 0 busy: pid 7 python3 (2.0 GiB)",)
    by_plan = BenchPlan(**{**{f: getattr(PLAN, f) for f in PLAN.__slots__}, "allow_busy_gpus": True})
    assert environment_check(by_plan, HOST, held).refusals == ()


def test_a_cpu_plan_and_a_slurm_login_node_never_look_at_the_gpus():
    held = facts(gpus=[{**IDLE_GPU, "ecc_uncorrected": 3}])
    cpu = BenchPlan(name="p", command="true", results="*.pt", summarizer="ddtree", gpus=0)
    assert environment_check(cpu, HOST, held).refusals == ()
    login = Host(name="login", address="l", executor="slurm")
    assert environment_check(PLAN, login, held).refusals == ()
    assert facts_request(PLAN, login) == {"packages": ["torch", "transformers"], "gpu_health": False}
    assert facts_request(PLAN, HOST)["gpu_health"] is True and facts_request(cpu, HOST)["gpu_health"] is False


def test_the_launch_provenance_keeps_the_gpus_state():
    prov = provenance_of({**facts(), "cuda_driver": "12.4", "torch_cuda": "12.4"}, {})
    assert prov["gpu_state"]["cuda_driver"] == "12.4" and prov["gpu_state"]["torch_cuda"] == "12.4"
    assert prov["gpu_state"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and prov["gpu_state"]["issues"] == []


def plan_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("command: python x.py --out {result_dir}/a.pt\nresults: '*.pt'\nsummarizer: ddtree\n"
                    + textwrap.dedent(body))
    return path


def test_a_plan_declares_its_packages_with_version_ranges(tmp_path):
    plan = load_bench_plan(plan_file(tmp_path, """\
        requires_packages:
          torch: ">= 2.4"
          transformers: ">=5.16,<5.25"
          flash-linear-attention:
        allow_busy_gpus: true
        """))
    assert plan.requires_packages == (("torch", ">=2.4"), ("transformers", ">=5.16,<5.25"),
                                      ("flash-linear-attention", ""))
    assert plan.allow_busy_gpus is True


@pytest.mark.parametrize("body, message", [
    ("requires_packages: {torch: '>=two'}\n", "p.yaml:4: requires_packages.torch: '>=two' is not a version range"),
    ("requires_packages: {torch: 2.4}\n", "p.yaml:4: requires_packages.torch: must be a version range like"),
    ("requires_packages: {'-x': '>=1'}\n", "p.yaml:4: requires_packages.-x: must be a distribution name"),
    ("allow_busy_gpus: yes please\n", "p.yaml:4: allow_busy_gpus: must be"),
])
def test_a_bad_package_requirement_is_an_error_naming_its_line(tmp_path, body, message):
    with pytest.raises(PlaybookError) as error:
        load_bench_plan(plan_file(tmp_path, body))
    assert str(error.value).startswith(str(tmp_path / message.split(":")[0]) + ":" + message.split(":", 1)[1])


# -- patch --check: the host's transformers against the matrix, through the real agent ------------------------------


def test_patch_check_says_the_hosts_transformers_and_whether_the_matrix_covers_it(seed, tmp_path, monkeypatch):
    import shutil

    import transformers

    from ddops.patching.playbook import load_playbooks
    from ddops.patching.snapshot import make_planner
    from ddops.tasks.patch import patch_host
    from ddops.transport.local import LocalSession

    repo = tmp_path / "repo"
    shutil.copytree(seed, repo)
    host = Host(name="here", address="localhost", repo=str(repo), command_timeout=60)
    books = load_playbooks(["cpu-timing", "hybrid-cache"])
    here = transformers.__version__
    for support, tested, words in ((Support((here,)), True, f"transformers {here} (tested)"),
                                   (Support(("5.0.0",)), False, f"transformers {here} (untested: the hybrid "
                                                                  "playbooks are tested with 5.0.0-5.0.0)")):
        monkeypatch.setattr("ddops.bench.environment.hybrid_support", lambda support=support: support)
        with LocalSession(host) as session:
            outcome = patch_host(host, session, books, planner=make_planner(), check=True)
        assert outcome.status == "changed" and outcome.message.endswith(f"; {words}")
        assert (outcome.report.transformers_tested, outcome.report.transformers_support) == (tested, words)
    with LocalSession(host) as session:  # cpu-timing alone is no hybrid playbook: not a word about transformers
        alone = patch_host(host, session, load_playbooks(["cpu-timing"]), planner=make_planner(), check=True)
    assert "transformers" not in alone.message and alone.report.transformers_support is None
