"""Slurm as a bench executor, the pure part: inventory keys, the job array's sbatch options and batch script, and
squeue/scontrol/sacct output (as Slurm 22.05 prints it) turned into one state per array task."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest

from ddops.bench.slurm import SlurmOptions, SlurmQuery, batch_script, build_state, run_status, sbatch_args, task_states
from ddops.errors import InventoryError
from ddops.inventory import load_inventory
from ddops.tasks.slurm import gres_gpus

# --- inventory ----------------------------------------------------------------------------------------------------


def inventory(tmp_path, text: str):
    path = tmp_path / "inventory.yaml"
    path.write_text("ssh_config: /dev/null\n" + textwrap.dedent(text))
    return load_inventory(path)


def error_of(tmp_path, text: str) -> str:
    with pytest.raises(InventoryError) as info:
        inventory(tmp_path, text)
    return str(info.value)


def test_slurm_options_merge_key_by_key_host_over_group_over_defaults(tmp_path):
    inv = inventory(tmp_path, """\
        defaults: {slurm: {time: "1:00:00", account: lab}}
        groups:
          cluster: {executor: slurm, slurm: {partition: gpu, gres: "gpu:h200:2", extra: [--mem=64G]}}
        hosts:
          login: {address: 10.0.0.1, groups: [cluster], slurm: {partition: debug}}
          box: {address: 10.0.0.2}
        """)
    login, box = inv.host("login"), inv.host("box")
    assert login.executor == "slurm"
    assert login.slurm == SlurmOptions(partition="debug", gres="gpu:h200:2", time="1:00:00", account="lab",
                                       extra=("--mem=64G",))
    assert box.executor == "bare" and box.slurm is None


@pytest.mark.parametrize("body, where, says", [
    ("executor: slrum", "hosts.login.executor", "must be one of bare, slurm (did you mean 'slurm'?)"),
    ("slurm: {partiton: gpu}", "hosts.login.slurm.partiton", "unknown key (did you mean 'partition'?)"),
    ("slurm: {gres: 'gpu 2'}", "hosts.login.slurm.gres", "is not a Slurm gres"),
    ("slurm: {time: '2 hours'}", "hosts.login.slurm.time", "is not a Slurm time limit"),
    ("slurm: {time: 0}", "hosts.login.slurm.time", "at least 1 minute"),
    ("slurm: {partition: 'a b'}", "hosts.login.slurm.partition", "not a plain Slurm value"),
    ("slurm: {extra: [mem=4G]}", "hosts.login.slurm.extra[0]", "must be an sbatch option"),
    ("slurm: {extra: [--qos=x, --array=0-9]}", "hosts.login.slurm.extra[1]", "--array is set by ddops"),
    ("slurm: {extra: [-o, out.txt]}", "hosts.login.slurm.extra[0]", "-o is set by ddops"),
    ("slurm: {conf: etc/slurm.conf}", "hosts.login.slurm.conf", "must be an absolute path"),
    ("slurm: [gpu]", "hosts.login.slurm", "must be a mapping"),
])
def test_bad_slurm_settings_are_errors_with_file_line(tmp_path, body, where, says):
    message = error_of(tmp_path, f"hosts:\n  login:\n    address: 10.0.0.1\n    {body}\n")
    assert message.startswith(f"{tmp_path / 'inventory.yaml'}:") and f": {where}: " in message, message
    assert says in message


def test_good_slurm_time_limits_are_accepted(tmp_path):
    for time in ("30", "10:00", "1:00:00", "2-0", "2-12:00", "1-00:00:00", "UNLIMITED"):
        body = f"hosts:\n  login: {{address: 10.0.0.1, executor: slurm, slurm: {{time: '{time}'}}}}\n"
        inv = inventory(tmp_path, body)
        assert inv.host("login").slurm.time == time


# --- the job array ------------------------------------------------------------------------------------------------


def test_sbatch_args_ask_for_one_array_task_per_run_with_the_hosts_options():
    options = SlurmOptions(partition="gpu", gres="gpu:1", account="lab", qos="high", constraint="h200", nodes="1",
                           extra=("--mem=64G",))
    args = sbatch_args(options, run_id="r1", total=40, run_dir="/repo/.ddops/runs/r1", plan_minutes=90.5)
    assert args == ["--parsable", "--job-name=ddops-r1", "--array=0-39", "--output=/repo/.ddops/runs/r1/task-%a.out",
                    "--chdir=/repo/.ddops/runs/r1", "--open-mode=append", "--export=ALL", "--time=91",
                    "--partition=gpu", "--gres=gpu:1", "--account=lab", "--qos=high", "--constraint=h200",
                    "--nodes=1", "--mem=64G"]
    assert "--time=2:00:00" in sbatch_args(SlurmOptions(time="2:00:00"), run_id="r", total=1, run_dir="/d",
                                           plan_minutes=5)


def test_batch_script_starts_the_runs_agent_copy_with_the_hosts_python():
    script = batch_script("/opt/py 3/bin/python", "/repo/.ddops/runs/r1", "r1")
    assert script.startswith("#!/bin/sh\n")
    words = shlex.split(script, comments=True)
    assert words[:3] == ["exec", "/opt/py 3/bin/python", "-S"] and words[3] == "-c"
    assert words[5:] == ["/repo/.ddops/runs/r1"]
    compile(words[4], "<boot>", "exec")


def test_gres_gives_the_gpus_per_task():
    assert gres_gpus("gpu:2") == 2 and gres_gpus("gpu:h200:4") == 4 and gres_gpus("gpu") == 1
    assert gres_gpus("shard:1") is None and gres_gpus(None) is None


# --- task states --------------------------------------------------------------------------------------------------



def _agent_constant(name: str) -> str:
    """A constant of the agent's Slurm module (read, not imported: the agent is a package for the hosts)."""
    import ast

    source = (Path(__file__).resolve().parents[2] / "remote" / "ddops_agent" / "slurm.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"the agent has no {name}")


# What the agent asks squeue and sacct for (the one place they are defined)
SLURM_SQUEUE_FORMAT, SLURM_SACCT_FIELDS = _agent_constant("SLURM_SQUEUE_FORMAT"), _agent_constant("SLURM_SACCT_FIELDS")

SQUEUE = """\
7_3|7|3|PENDING|Resources|
7_2|7|2|PENDING|Priority|
10|7|1|RUNNING|None|node4
"""
SCONTROL = (
    "JobId=9 ArrayJobId=7 ArrayTaskId=0 JobName=ddops-r UserId=root(0) JobState=COMPLETED Reason=None "
    "ExitCode=0:0 NodeList=node3 StdOut=/r/task-0.out\n"
    "JobId=10 ArrayJobId=7 ArrayTaskId=1 JobState=RUNNING Reason=None ExitCode=0:0 NodeList=node4\n"
    "JobId=7 ArrayJobId=7 ArrayTaskId=2-3 JobState=PENDING Reason=Resources ExitCode=0:0 NodeList=\n"
)


def test_squeue_wins_then_scontrol_fills_in_finished_tasks():
    tasks = task_states(4, "7", squeue=SQUEUE, squeue_format=SLURM_SQUEUE_FORMAT, scontrol=SCONTROL)
    assert [(t.state, t.source) for t in tasks] == [("COMPLETED", "scontrol"), ("RUNNING", "squeue"),
                                                    ("PENDING", "squeue"), ("PENDING", "squeue")]
    assert tasks[2].detail == "PENDING (Priority)" and tasks[3].detail == "PENDING (Resources)"
    assert tasks[1].detail == "RUNNING on node4" and tasks[0].node == "node3"
    assert run_status(tasks) == "running"


def test_finished_tasks_failed_cancelled_timeout_node_fail_and_oom_from_scontrol():
    text = "\n".join(f"JobId={20 + i} ArrayJobId=7 ArrayTaskId={i} JobState={state} Reason=x ExitCode={code} "
                     f"NodeList=node1" for i, (state, code) in enumerate([
                         ("COMPLETED", "0:0"), ("FAILED", "3:0"), ("CANCELLED", "0:15"), ("TIMEOUT", "0:0"),
                         ("NODE_FAIL", "0:0"), ("OUT_OF_MEMORY", "0:125")]))
    tasks = task_states(6, "7", scontrol=text)
    assert [t.status for t in tasks] == ["ok", "failed", "cancelled", "timeout", "node_fail", "out_of_memory"]
    assert tasks[1].exit_code == 3 and tasks[1].detail == "FAILED exit 3"
    assert tasks[2].signal == 15 and tasks[2].detail == "CANCELLED on node1"
    assert tasks[3].detail == "TIMEOUT on node1"
    assert run_status(tasks) == "failed"


def test_sacct_with_accounting_reads_array_ids_and_skips_steps():
    sacct = "7_0|COMPLETED|0:0|node1\n7_0.batch|COMPLETED|0:0|node1\n7_1|CANCELLED by 0|0:0|node2\n" \
            "8_1|FAILED|1:0|node9\n"
    tasks = task_states(2, "7", sacct=sacct, sacct_fields=SLURM_SACCT_FIELDS)
    assert [(t.state, t.node) for t in tasks] == [("COMPLETED", "node1"), ("CANCELLED", "node2")]
    assert run_status(tasks) == "stopped"


def test_sacct_completion_log_maps_own_job_ids_through_the_task_records():
    # `sacct -c` (no accounting database) knows tasks only by their own job id, which each task recorded.
    sacct = "31|COMPLETED|0:0|node1\n32|FAILED|2:0|node1\n99|FAILED|1:0|node1\n"
    records = {0: {"job_id": "31", "ended": "t", "exit_code": 0}, 1: {"job_id": "32", "ended": "t", "exit_code": 2}}
    tasks = task_states(2, "30", sacct=sacct, sacct_fields=SLURM_SACCT_FIELDS, records=records)
    assert [(t.state, t.exit_code, t.source) for t in tasks] == [("COMPLETED", 0, "sacct"), ("FAILED", 2, "sacct")]


def test_when_slurm_has_forgotten_a_task_its_record_says_how_it_ended_or_that_it_was_lost():
    records = {0: {"job_id": "5", "node": "n1", "started": "a", "ended": "b", "exit_code": 0},
               1: {"job_id": "6", "node": "n2", "started": "a", "ended": None}}
    tasks = task_states(3, "4", records=records)
    assert [t.status for t in tasks] == ["ok", "lost", "unknown"]
    assert tasks[1].node == "n2"
    assert run_status(tasks) == "failed"


def test_a_timeout_is_slurms_word_even_when_the_record_has_an_exit_code():
    scontrol = "JobId=5 ArrayJobId=4 ArrayTaskId=0 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 NodeList=n1\n"
    tasks = task_states(1, "4", scontrol=scontrol, records={0: {"ended": "b", "exit_code": 143, "signal": 15}})
    assert tasks[0].status == "timeout"


def test_build_state_is_what_the_bare_executors_readers_expect():
    from ddops.bench.runs import HostRun

    records = {0: {"job_id": "9", "node": "node3", "started": "2026-12-01T10:00:00.000000Z",
                   "ended": "2026-12-01T10:00:05.000000Z", "seconds": 5.0, "exit_code": 0,
                   "cuda_visible_devices": "0", "slurm_job_gpus": "1"}}
    tasks = task_states(4, "7", squeue=SQUEUE, squeue_format=SLURM_SQUEUE_FORMAT, scontrol=SCONTROL,
                        records=records)
    state = build_state("r1", "7", ["a", "b", "c", "d"], tasks, records, plan="p", host="login")
    run = HostRun.from_state("login", state)
    assert run.status == "running" and run.done == 1 and run.total == 4 and run.current == 1
    assert run.runs[0].status == "ok" and run.runs[0].slurm["slurm_job_gpus"] == "1"
    assert run.runs[0].slurm["job_id"] == "9" and run.runs[0].slurm["array_index"] == 0
    assert state["message"] == "job 7: 1 completed, 1 running, 1 pending (priority), 1 pending (resources)"
    assert run.to_json()["runs"][3]["slurm"]["detail"] == "PENDING (Resources)"


def test_query_from_agent_result_ignores_commands_that_failed():
    result = {"slurm": {"job_id": "7", "total": 1, "labels": ["a"], "records": {},
                        "queries": {"squeue": {"rc": 0, "stdout": ""},
                                    "scontrol": {"rc": 1, "stdout": "", "stderr": "Invalid job id specified"},
                                    "sacct": {"rc": 1, "stdout": "", "stderr": "accounting storage is disabled"},
                                    "sacct_completions": {"rc": 0, "stdout": "12|COMPLETED|0:0|n\n",
                                                          "format": SLURM_SACCT_FIELDS}}}}
    query = SlurmQuery.from_result(result)
    assert query.scontrol == "" and query.sacct == "12|COMPLETED|0:0|n\n"
    assert query.sacct_fields == SLURM_SACCT_FIELDS
    assert query.tasks()[0].status == "unknown"


# --- the agent's slurm verbs without a cluster ----------------------------------------------------------------------


def test_submit_without_sbatch_fails_naming_the_login_node_and_records_the_error(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from ddops.transport.agent import agent_program

    repo = tmp_path / "repo"
    repo.mkdir()
    program = agent_program()
    payload = {"repo": str(repo), "run_id": "r1", "sbatch_args": ["--parsable", "--array=0-0"],
               "script": "#!/bin/sh\ntrue\n", "spec": {"runs": [{"index": 0, "label": "a", "command": "true"}]}}
    request = json.dumps({"verb": "slurm_submit", "payload": payload}).encode()
    done = subprocess.run(program.argv(sys.executable, cache=False), input=program.bundle + request,
                          capture_output=True, timeout=30, env={**os.environ, "PATH": str(tmp_path / "nothing")})
    answer = json.loads(done.stdout)
    assert answer["error"]["kind"] == "slurm" and "sbatch: not found on this host" in answer["error"]["message"]
    state = json.loads((repo / ".ddops" / "runs" / "r1" / "state.json").read_text())
    assert state["status"] == "error" and "sbatch refused the job" in state["message"]
    assert (repo / ".ddops" / "runs" / "r1" / "job.sh").read_text() == payload["script"]
    # what each array task will load: the agent exactly as shipped
    assert (repo / ".ddops" / "runs" / "r1" / "agent.bundle").read_bytes() == program.bundle


@pytest.mark.parametrize("option, means", [
    ("--arr=0-99", "--array"), ("--outp=/tmp/x", "--output"), ("--wra=id", "--wrap"), ("--parsabl", "--parsable"),
    ("--job=x", "--job-name"), ("--ch=/tmp", "--chdir"), ("--open=truncate", "--open-mode"),
    ("--expo=NONE", "--export"),
    ("-Qo/x", "-o"), ("-Ha0-9", "-a"), ("-vvJname", "-J"), ("--", "the end of sbatch's options"),
])
def test_sbatch_abbreviations_and_clustered_short_options_of_ddops_own_options_are_refused(tmp_path, option, means):
    message = error_of(tmp_path, f"hosts:\n  login:\n    address: 10.0.0.1\n    slurm: {{extra: ['{option}']}}\n")
    assert ": hosts.login.slurm.extra[0]: " in message and means in message and "set by ddops" in message, message


@pytest.mark.parametrize("option", ["--mem=64G", "--export-file=env", "--partition=gpu", "-c4", "-Qc2", "-po/x",
                                    "--gpus-per-task=1"])
def test_sbatch_options_ddops_does_not_set_pass_the_guard(tmp_path, option):
    body = f"hosts:\n  login: {{address: 10.0.0.1, executor: slurm, slurm: {{extra: ['{option}']}}}}\n"
    assert inventory(tmp_path, body).host("login").slurm.extra == (option,)


def test_a_percent_in_the_repo_path_is_literal_in_slurms_output_pattern():
    args = sbatch_args(SlurmOptions(), run_id="r1", total=2, run_dir="/data/100%j/.ddops/runs/r1", plan_minutes=5)
    assert "--output=/data/100%%j/.ddops/runs/r1/task-%a.out" in args
    assert "--chdir=/data/100%j/.ddops/runs/r1" in args  # --chdir is a path, not a pattern


def test_the_controller_reads_squeue_and_sacct_columns_by_the_format_the_agent_says_it_used():
    """The format is defined once, by the agent that runs squeue; reordering it there needs nothing here."""
    result = {"slurm": {"job_id": "7", "total": 2, "labels": ["a", "b"], "records": {}, "queries": {
        "squeue": {"rc": 0, "stdout": "RUNNING|1|node4|7|10|None\n", "format": "%T|%K|%N|%F|%i|%r"},
        "sacct": {"rc": 0, "stdout": "node1|7_0|0:0|COMPLETED\n", "format": "NodeList,JobID,ExitCode,State"}}}}
    tasks = SlurmQuery.from_result(result).tasks()
    assert [(t.state, t.source, t.node) for t in tasks] == [("COMPLETED", "sacct", "node1"),
                                                            ("RUNNING", "squeue", "node4")]
    assert tasks[1].job_id == "10"
