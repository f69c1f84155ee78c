"""Bench plans: the format, its file:line errors, matrix expansion, and shell quoting of every substituted value."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ddops.bench.plan import BenchPlan, check_host, expand_runs, load_bench_plan, template_names
from ddops.errors import EXIT_USAGE, PlaybookError

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO_ROOT / "playbooks"
MINI_DDTREE = REPO_ROOT / "examples" / "mini-ddtree"
HOST = {"gpus": 8, "host": "h200-a", "repo": "/root/ddtree", "python": "python3"}

MINIMAL = """\
name: t
summarizer: ddtree
results: "*.pt"
command: run {x}
vars:
  x: 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, **kw) -> BenchPlan:
    return load_bench_plan(write(tmp_path, text), **kw)


def error_of(tmp_path: Path, text: str, **kw) -> str:
    with pytest.raises(PlaybookError) as info:
        load(tmp_path, text, **kw)
    assert info.value.exit_code == EXIT_USAGE
    return str(info.value)


# --- the shipped plans --------------------------------------------------------------------------------------------


def test_reference_plan_expands_to_every_dataset_temperature_and_target_attention():
    plan = load_bench_plan(PLAYBOOKS / "ddtree-bench.yaml")
    runs = expand_runs(plan, HOST, "/r")
    assert plan.summarizer == "ddtree" and plan.gpus >= 1
    assert len(runs) == 10 * 2 * 2
    first = runs[0].command
    assert first.startswith("python3 -m torch.distributed.run --nproc_per_node=8 ")
    assert "--dataset gsm8k --max-samples 128" in first and "--temperature 0.0" in first
    assert "--flash-attn" not in first and "--save-path /r/gsm8k__t0.0__sdpa.pt" in first
    assert "--flash-attn --save-path /r/gsm8k__t0.0__flash_attn.pt" in runs[1].command
    assert {r.params["dataset"] for r in runs} >= {"gsm8k", "math500", "aime24", "humaneval", "mt-bench"}
    assert len({r.command for r in runs}) == len(runs)


def test_the_example_inventorys_default_plan_is_one_short_greedy_run_of_the_reference_benchmark(tmp_path):
    from ddops.bench.preflight import resolve_plan_path
    from ddops.inventory import load_inventory

    edited = tmp_path / "inventory.yaml"  # the example, as a user makes it theirs: without its `example:` line
    edited.write_text((REPO_ROOT / "inventory.yaml").read_text().replace("example: true\n", ""))
    plan = load_bench_plan(resolve_plan_path(load_inventory(edited).bench))
    (run,) = expand_runs(plan, HOST, "/r")  # `ddops bench --all` on a fresh fleet launches one run, not forty
    reference = expand_runs(load_bench_plan(PLAYBOOKS / "ddtree-bench.yaml"), HOST, "/r")[0].command
    assert plan.name == "ddtree-smoke" and plan.timeout_minutes <= 60 and "--temperature 0.0 " in run.command
    # The same launch as the reference's first run, only smaller.
    flags = lambda command: re.findall(r"(--[a-z-]+)", command)  # noqa: E731
    assert flags(run.command) == [f for f in flags(reference) if f != "--flash-attn"]
    assert "--max-samples 16" in run.command and "--tree-budget 16,64" in run.command


def test_mini_plan_is_a_cpu_plan_and_uses_only_flags_benchmark_py_accepts():
    plan = load_bench_plan(PLAYBOOKS / "mini-ddtree-bench.yaml")
    assert plan.gpus == 0 and plan.summarizer == "ddtree" and plan.timeout_minutes <= 15
    runs = expand_runs(plan, {"python": "python3"}, "/r")
    assert [(r.params["target"], r.params["temperature"]) for r in runs] == [("qwen3.5-hybrid", 0.0),
                                                                           ("qwen3-attn", 0.0)]
    used = set(re.findall(r"(--[a-z-]+)", runs[0].command.split("benchmark.py", 1)[1]))
    real_flags = {"--model-name-or-path", "--draft-name-or-path", "--dataset", "--max-samples", "--max-new-tokens",
                  "--temperature", "--tree-budget", "--flash-attn", "--save-path"}
    assert used <= real_flags
    if (MINI_DDTREE / "benchmark.py").exists():
        accepted = set(re.findall(r'add_argument\("(--[a-z-]+)"', (MINI_DDTREE / "benchmark.py").read_text()))
        assert used <= accepted
        assert (MINI_DDTREE / "make_models.py").exists()


def test_shipped_plans_require_only_patches_the_builtin_playbooks_define():
    from ddops.patching.playbook import list_playbooks, load_playbooks

    known = {p.id for book in load_playbooks(list_playbooks()) for p in book.patches}
    for name in ("ddtree-bench", "mini-ddtree-bench"):
        plan = load_bench_plan(PLAYBOOKS / f"{name}.yaml", known_patches=known)
        assert plan.requires_patches


# --- expansion ----------------------------------------------------------------------------------------------------


def test_runs_are_the_cartesian_product_in_yaml_order(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: run {a} {b}
        matrix:
          a: [1, 2]
          b: [x, y]
        """)
    runs = expand_runs(plan, {})
    assert [r.command for r in runs] == ["run 1 x", "run 1 y", "run 2 x", "run 2 y"]
    assert [r.index for r in runs] == [0, 1, 2, 3]
    assert runs[1].params == {"a": 1, "b": "y"} and runs[1].label == "a=1 b=y"


def test_a_matrix_entry_that_is_a_mapping_sets_several_placeholders(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: bench {dataset} {n} {flags} --out {result_dir}/{dataset}.pt
        matrix:
          task:
            - {dataset: gsm8k, n: 128, flags: []}
            - {dataset: aime24, n: 30, flags: [--flash-attn, --fast]}
        """)
    runs = expand_runs(plan, {}, "/res")
    assert runs[0].command == "bench gsm8k 128  --out /res/gsm8k.pt"
    assert runs[1].command == "bench aime24 30 --flash-attn --fast --out /res/aime24.pt"


def test_matrix_beats_host_vars_which_beat_plan_vars(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: run {a} {b} {c} {gpus}
        vars: {b: plan-b, c: plan-c}
        matrix: {a: [matrix-a]}
        """)
    (run,) = expand_runs(plan, {"a": "host-a", "b": "host-b", "gpus": 4})
    assert run.command == "run matrix-a host-b plan-c 4"


def test_a_required_var_the_host_does_not_set_is_an_error_naming_it(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: run {model}
        vars: {model: null}
        """)
    with pytest.raises(PlaybookError, match=r"\{model\} is a required plan var, and h1 does not set it"):
        expand_runs(plan, {"host": "h1"})
    assert expand_runs(plan, {"model": "/m"})[0].command == "run /m"


def test_a_builtin_the_launcher_did_not_give_is_an_error(tmp_path):
    plan = load(tmp_path, MINIMAL.replace("run {x}", "torchrun --nproc_per_node={gpus} {x}"))
    with pytest.raises(PlaybookError, match=r"\{gpus\} is a host value"):
        expand_runs(plan, {})


def test_two_runs_with_the_same_command_are_refused(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: run --out {result_dir}/x.pt
        matrix: {temperature: [0.0, 1.0]}
        """)
    with pytest.raises(PlaybookError, match="runs 0 and 1 expand to the same command"):
        expand_runs(plan, {})


def test_env_values_are_templates_rendered_raw_and_quoted_only_in_shell_line(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: run {x}
        env: {HF_HOME: "{cache}/hf", N: 3}
        vars: {x: 1, cache: "/data/my cache"}
        """)
    (run,) = expand_runs(plan, {})
    assert run.env == {"HF_HOME": "/data/my cache/hf", "N": "3"}


def test_double_braces_are_literal_braces(tmp_path):
    plan = load(tmp_path, MINIMAL.replace("run {x}", "echo ${{HOME}} {x}"))
    assert expand_runs(plan, {})[0].command == "echo ${HOME} 1"
    assert template_names("a {b} {{c}} {d}") == ["b", "d"]


def test_check_host_lists_every_reason_a_host_cannot_run_the_plan(tmp_path):
    plan = load(tmp_path, MINIMAL + "gpus: 8\nmin_free_disk_gb: 50\nrequires_patches: [hybrid-cache, crop-relative]\n")
    problems = check_host(plan, gpus=4, free_disk_gb=10.0, applied_patches=["hybrid-cache"])
    assert problems == ["needs 8 GPU(s), host has 4", "needs 50 GB free disk, host has 10.0 GB",
                        "patches not applied: crop-relative (run `ddops patch crop-relative`)"]
    assert check_host(plan, gpus=8, free_disk_gb=None, applied_patches=None) == []


# --- hostile values cannot inject shell -----------------------------------------------------------------------------

HOSTILE = [
    "gsm8k; touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "x' ; touch PWNED ; echo '",
    'x" ; touch PWNED ; echo "',
    "a && touch PWNED || touch PWNED",
    "> PWNED",
    "$HOME ${HOME} \\ * ?",
    "-rf --",
    "",
]


def plan_with_v(command: list[str], where: str, value: Any) -> str:
    """A plan whose command lines use {v}, given `value` by its matrix or its vars; "host_var": left to the host."""
    yaml_value = json.dumps(value)  # JSON strings are YAML strings
    lines = ["summarizer: ddtree", 'results: "*.pt"', *command]
    if where == "matrix":
        lines += ["matrix:", f"  v: [{yaml_value}]"]
    elif where == "plan_var":
        lines += ["vars:", f"  v: {yaml_value}"]
    else:
        lines += ["vars:", "  v: null"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["matrix", "plan_var", "host_var"])
@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_value_reaches_the_program_as_exactly_one_argument_and_runs_nothing(tmp_path, where, value):
    text = plan_with_v(["command: >-", "  {python} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' {v} "
                                       "--out {result_dir}/r.pt"], where, value)
    plan = load(tmp_path, text)
    host = {"python": sys.executable}
    if where == "host_var":
        host["v"] = value
    (run,) = expand_runs(plan, host, result_dir=str(tmp_path / "res; touch PWNED"))
    out = subprocess.run(["sh", "-c", run.command], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={**os.environ, **run.env})
    assert json.loads(out.stdout) == [value, "--out", str(tmp_path / "res; touch PWNED") + "/r.pt"]
    assert not (tmp_path / "PWNED").exists()


def test_a_hostile_list_value_becomes_one_argument_per_item(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: printf '%s\\n' {flags}
        vars: {flags: null}
        """)
    (run,) = expand_runs(plan, {"flags": ["--a", "$(touch PWNED)", "b c"]})
    out = subprocess.run(["sh", "-c", run.command], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["--a", "$(touch PWNED)", "b c"]
    assert not (tmp_path / "PWNED").exists()


def test_hostile_env_values_reach_the_command_unchanged(tmp_path):
    plan = load(tmp_path, """\
        summarizer: ddtree
        results: "*.pt"
        command: printf '%s' "$V"
        env: {V: "{v}"}
        vars: {v: null}
        """)
    value = "'; touch PWNED; echo '$(touch PWNED)"
    (run,) = expand_runs(plan, {"v": value})
    # The runner passes env as the process environment (remote/ddops_agent/bench.py), never through a shell line.
    out = subprocess.run(["sh", "-c", run.command], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={**os.environ, **run.env})
    assert out.stdout == value
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("command, what", [
    ("run '{x}'", "is inside single quotes"),
    ('run "--name={x}"', "is inside double quotes"),
    ("run \\{x}", "follows a backslash"),
    ("cat <<EOF\n{x}\nEOF", "here-documents are not supported"),
    ("run 'unclosed {x}", "inside single quotes"),
    ("run 'unclosed", "unbalanced ' quote"),
])
def test_placeholders_where_quoting_would_not_hold_are_refused(tmp_path, command, what):
    text = MINIMAL.replace("command: run {x}", "command: " + json.dumps(command))
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'plan.yaml'}:4: command: ") and what in msg


@pytest.mark.parametrize("command, context", [
    ("[[ {x} -gt 0 ]] && run {x}", "`[[ ]]`"),
    ("run $(( {x} + 1 ))", "`$(( ))`"),
    ("run \"$(( {x} + 1 ))\"", "`$(( ))`"),
    ("(( {x} > 1 )) && run", "`(( ))`"),
    ("for (( i = 0; i < {x}; i++ )); do run; done", "`(( ))`"),
    ("run $(( (2 + {x}) * 3 ))", "`$(( ))`"),
    ("run $[ {x} + 1 ]", "`$[ ]`"),
    ("run ${{arr[{x}]}}", "an array subscript"),
    ("run ${{v:{x}:2}}", "`${ }`"),
    ("arr[{x}]=1; run", "an array subscript"),
    ("let n={x}+1; run $n", "the arguments of `let`"),
    ("run; declare -i n={x}; run $n", "the arguments of `declare`"),
    ("f() {{ local -i n={x}; }}; f", "the arguments of `local`"),
])
def test_a_placeholder_where_bash_evaluates_arithmetic_is_refused(tmp_path, command, context):
    # With /bin/sh as bash, a value there is an expression: `--var 'x=a[$(touch /tmp/p)]'` ran the touch.
    text = MINIMAL.replace("command: run {x}", "command: " + json.dumps(command))
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'plan.yaml'}:4: command: ") and f"{{x}} is inside {context}" in msg


@pytest.mark.parametrize("command", [
    "run $(( 1 + 2 )) {x}", "[ {x} -gt 0 ] && run {x}", "run {x} a[0]", "(( 1 )) && run {x}", "let n=1; run {x}",
    "run {x}; n=$(( 2 * 3 ))", "run ${{HOME}} {x}", "[[ -n $HOME ]] && run {x}", "run --opt=[{x}]",
    "declare -i n=2\nrun {x}", "run '$(( 1 ))' {x}", "run $( (echo) ) {x}",
])
def test_placeholders_outside_arithmetic_contexts_are_allowed(tmp_path, command):
    text = MINIMAL.replace("command: run {x}", "command: " + json.dumps(command))
    assert load(tmp_path, text).command == command.strip()


# --- validation: file:line: key.path: message -------------------------------------------------------------------------


@pytest.mark.parametrize("text, line, keypath, fragment", [
    (MINIMAL + "gpu: 1\n", 7, "gpu", "unknown key (did you mean 'gpus'?)"),
    (MINIMAL + "gpus: two\n", 7, "gpus", "must be an integer, not a string"),
    (MINIMAL + "gpus: -1\n", 7, "gpus", "must be 0 (a CPU plan) or more"),
    (MINIMAL + "gpus: true\n", 7, "gpus", "must be an integer"),
    (MINIMAL + "timeout_minutes: 0\n", 7, "timeout_minutes", "must be a positive number of minutes"),
    (MINIMAL + "min_free_disk_gb: -5\n", 7, "min_free_disk_gb", "must not be negative"),
    (MINIMAL.replace("summarizer: ddtree", "summarizer: ddtre"), 2, "summarizer", "(did you mean 'ddtree'?)"),
    (MINIMAL + "workdir: /abs\n", 7, "workdir", "must be a relative path inside the repo"),
    (MINIMAL + "workdir: a/../../b\n", 7, "workdir", "without '..'"),
    (MINIMAL.replace('"*.pt"', '"{x}/*.pt"'), 3, "results", "placeholders are not allowed"),
    (MINIMAL.replace("command: run {x}", "command: run {y}"), 4, "command", "unknown placeholder {y}"),
    (MINIMAL.replace("command: run {x}", "command: run {xx}"), 4, "command", "(did you mean 'x'?)"),
    (MINIMAL.replace("command: run {x}", "command: run {x.__class__}"), 4, "command", "bad placeholder"),
    (MINIMAL.replace("command: run {x}", "command: run {0}"), 4, "command", "bad placeholder '{0}'"),
    (MINIMAL.replace("command: run {x}", "command: run {x} }"), 4, "command", "single '}'"),
    (MINIMAL + "env:\n  HOME: \"{nope}\"\n", 8, "env.HOME", "unknown placeholder {nope}"),
    (MINIMAL + "env:\n  1BAD: x\n", 8, "env.1BAD", "names use letters"),
    (MINIMAL + "env:\n  A: [1]\n", 8, "env.A", "must be a string or number"),
    (MINIMAL + "matrix:\n  t: []\n", 8, "matrix.t", "non-empty list"),
    (MINIMAL + "matrix:\n  t: [1, 1]\n", 8, "matrix.t[1]", "duplicate entry"),
    (MINIMAL + "matrix:\n  t: [{a: 1}, {b: 2}]\n", 8, "matrix.t[1]", "sets b; earlier entries set a"),
    (MINIMAL + "matrix:\n  x: [1, 2]\n", 8, "matrix.x", "set both here and in `vars:`"),
    (MINIMAL + "matrix:\n  t: [{a: {b: 1}}]\n", 8, "matrix.t[0].a", "must be a string, number"),
    (MINIMAL + "matrix:\n  result_dir: [a]\n", 8, "matrix.result_dir", "filled in by ddops"),
    (MINIMAL + "  gpus: 2\n", 7, "vars.gpus", "filled in by ddops"),
    (MINIMAL + "requires_patches: [hybrid-cash]\n", 7, "requires_patches[0]", "(did you mean 'hybrid-cache'?)"),
    (MINIMAL.replace("name: t", "name: bad name"), 1, "name", "letters, digits"),
])
def test_invalid_plans_say_file_line_and_key_path(tmp_path, text, line, keypath, fragment):
    msg = error_of(tmp_path, text, known_patches=["hybrid-cache", "crop-relative"])
    assert msg.startswith(f"{tmp_path / 'plan.yaml'}:{line}: {keypath}: "), msg
    assert fragment in msg, msg


@pytest.mark.parametrize("missing", ["command", "results", "summarizer"])
def test_missing_required_keys_are_named(tmp_path, missing):
    text = "\n".join(line for line in MINIMAL.splitlines() if not line.startswith(missing)) + "\n"
    assert error_of(tmp_path, text) == f"{tmp_path / 'plan.yaml'}:1: missing `{missing}:`"


def test_empty_and_malformed_files_are_playbook_errors(tmp_path):
    assert "the bench plan is empty" in error_of(tmp_path, "")
    assert ":1: (top level): must be a mapping" in error_of(tmp_path, "- a\n- b\n")
    assert "invalid YAML" in error_of(tmp_path, "command: [unclosed\n")
    with pytest.raises(PlaybookError, match="no such file"):
        load_bench_plan(tmp_path / "absent.yaml")


def test_name_defaults_to_the_file_stem(tmp_path):
    text = MINIMAL.replace("name: t\n", "")
    assert load(tmp_path, text).name == "plan"


@pytest.mark.parametrize("command", ["run {x} # {x}", "run {x}; #{x}", "run {x} #note {x}", "run {x}\n# {x}\n"])
def test_a_placeholder_inside_a_shell_comment_is_refused(tmp_path, command):
    text = MINIMAL.replace("command: run {x}", "command: " + json.dumps(command))
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'plan.yaml'}:4: command: ") and "{x} is inside a shell comment" in msg


@pytest.mark.parametrize("command", ["run {x} '#' {x}", "run {x}#{x}", "run ${{#}} {x}", "run {x} # note\nrun {x}"])
def test_a_hash_that_does_not_start_a_comment_leaves_placeholders_alone(tmp_path, command):
    text = MINIMAL.replace("command: run {x}", "command: " + json.dumps(command))
    assert load(tmp_path, text).command == command.strip()


@pytest.mark.parametrize("where", ["matrix", "plan_var", "host_var"])
@pytest.mark.parametrize("value", ["gsm8k\ntouch PWNED", "a\rb", ["ok", "x\ntouch PWNED"]])
def test_a_value_with_a_newline_is_refused_wherever_it_comes_from(tmp_path, where, value):
    text = plan_with_v(["command: run {v} --out {result_dir}/r.pt"], where, value)
    if where != "host_var":
        msg = error_of(tmp_path, text)
        assert msg.startswith(f"{tmp_path / 'plan.yaml'}:5: ") and "must be one line" in msg, msg
        return
    with pytest.raises(PlaybookError, match=r"\{v\}: the value for h1 must be one line"):
        expand_runs(load(tmp_path, text), {"host": "h1", "v": value})


# --- a smoke run: --var and --only -------------------------------------------------------------------------------

SMOKE = """\
name: smoke
summarizer: ddtree
results: "*.pt"
command: run --dataset {dataset} --t {temperature} --n {max_samples} --out {result_dir}/{dataset}.pt
vars:
  max_samples: 128
matrix:
  dataset: [gsm8k, math500, humaneval]
  temperature: [0.0, 1.0]
"""


def test_only_keeps_the_matrix_entries_with_the_given_values_and_var_sets_a_placeholder(tmp_path):
    from ddops.bench.plan import narrow_plan, parse_assignments

    plan = load(tmp_path, SMOKE)
    smoke = narrow_plan(plan, {"max_samples": "2"}, parse_assignments(["dataset=gsm8k", "temperature=0.0"], "--only"))
    (run,) = expand_runs(smoke, {"max_samples": 64})  # --var beats the host's vars too
    assert run.command == "run --dataset gsm8k --t 0.0 --n 2 --out results/gsm8k.pt"
    two = narrow_plan(plan, only=parse_assignments(["dataset=gsm8k,humaneval"], "--only"))
    assert [r.label for r in expand_runs(two, {})] == [
        "dataset=gsm8k temperature=0.0", "dataset=gsm8k temperature=1.0", "dataset=humaneval temperature=0.0",
        "dataset=humaneval temperature=1.0"]


@pytest.mark.parametrize("variables, only, says", [
    ({"dataset": "x"}, {}, "--var dataset: dataset is a matrix value of smoke; pick values with --only dataset=..."),
    ({"max_sample": "2"}, {}, "--var max_sample: smoke has no placeholder {max_sample} (did you mean 'max_samples'?)"),
    ({"result_dir": "/tmp"}, {}, "--var result_dir: 'result_dir' is filled in by ddops"),
    ({}, {"dataset": ("gsm9k",)}, "--only dataset=gsm9k: no such value in smoke (it has gsm8k, math500, humaneval)"),
    ({}, {"datset": ("gsm8k",)}, "--only datset: smoke's matrix has no datset (did you mean 'dataset'?)"),
])
def test_var_and_only_refuse_what_the_plan_does_not_have_in_one_line(tmp_path, variables, only, says):
    from ddops.bench.plan import narrow_plan
    from ddops.errors import UsageError

    with pytest.raises(UsageError) as info:
        narrow_plan(load(tmp_path, SMOKE), variables, only)
    assert str(info.value) == says


@pytest.mark.parametrize("item, option, says", [
    ("max_samples", "--var", "--var 'max_samples': write NAME=VALUE"),
    ("=2", "--var", "--var '=2': write NAME=VALUE"),
    ("x=a\nb", "--var", "--var x: the value must be one line"),
])
def test_malformed_assignments_are_usage_errors(item, option, says):
    from ddops.bench.plan import parse_assignments
    from ddops.errors import UsageError

    with pytest.raises(UsageError) as info:
        parse_assignments([item], option)
    assert str(info.value).startswith(says)


def test_a_metrics_plan_names_its_key_paths_and_bad_ones_are_file_line_errors(tmp_path):
    text = ('summarizer: metrics\nresults: "*.json"\ncommand: run {result_dir}\nmetrics:\n'
            '  tokens_per_s: stats.tok_s\n  method: name\n')
    assert load(tmp_path, text).metrics == {"tokens_per_s": "stats.tok_s", "method": "name"}
    msg = error_of(tmp_path, text.replace("  method: name\n", "  methd: name\n"))
    assert msg.startswith(f"{tmp_path / 'plan.yaml'}:6: metrics.methd: unknown key (did you mean 'method'?)")
    msg = error_of(tmp_path, text.replace("  tokens_per_s: stats.tok_s\n", ""))
    assert "metrics: needs tokens_per_s or tpot_s" in msg
    assert "needs a `metrics:` mapping" in error_of(tmp_path, text.split("metrics:\n")[0])


# --- servers ------------------------------------------------------------------------------------------------------

SERVED = """\
name: t
summarizer: vllm
results: "*.json"
server:
  command: serve --model {model} --port {server_port} {spec}
  ready: /health
command: bench --port {server_port} --data {dataset} --out {result_dir}/{method}-{dataset}.json
vars:
  model: m
matrix:
  method:
    - {method: baseline, spec: []}
    - {method: ngram, spec: [--speculative-config.method=ngram]}
  dataset: [gsm8k, math500]
"""


def test_runs_whose_server_renders_alike_share_one_and_learn_its_port_from_the_shell(tmp_path):
    runs = expand_runs(load(tmp_path, SERVED), {}, "/r")
    assert [r.server.group for r in runs] == [0, 0, 2, 2]
    assert runs[0].server.command == 'serve --model m --port "$DDOPS_SERVER_PORT" '
    assert runs[2].server.command == 'serve --model m --port "$DDOPS_SERVER_PORT" --speculative-config.method=ngram'
    assert runs[3].command == 'bench --port "$DDOPS_SERVER_PORT" --data math500 --out /r/ngram-math500.json'
    assert runs[0].server.to_json() == {"group": 0, "command": runs[0].server.command, "env": {}, "ready": "/health",
                                        "ready_timeout_s": 600.0, "version": None}
    # The port is a shell expansion, run by the shell: a server named by the runner, nothing a value can inject.
    port = subprocess.run(["sh", "-c", "echo " + runs[0].command.split()[2]], capture_output=True, text=True,
                          env={**os.environ, "DDOPS_SERVER_PORT": "8123"}).stdout
    assert port == "8123\n"


def test_scope_run_gives_every_run_a_server_of_its_own_and_a_plan_without_one_has_none(tmp_path):
    runs = expand_runs(load(tmp_path, SERVED.replace("  ready: /health", "  ready: /health\n  scope: run")), {})
    assert [r.server.group for r in runs] == [0, 1, 2, 3]
    assert all(r.server is None for r in expand_runs(load(tmp_path, MINIMAL), {}))


def test_server_env_is_rendered_per_run_and_its_placeholders_are_the_plans(tmp_path):
    plan = load(tmp_path, SERVED.replace("  ready: /health", "  ready: /health\n  env:\n    CACHE: /c/{model}\n"
                                                         "  ready_timeout_minutes: 0.5\n  version: /version"))
    (run, *_) = expand_runs(plan, {"model": "host-model"})
    assert run.server.env == {"CACHE": "/c/host-model"} and run.server.ready_timeout_s == 30
    assert run.server.version == "/version" and "model" in plan.placeholders


@pytest.mark.parametrize("text,line,keypath,fragment", [
    (SERVED.replace("  ready: /health", "  redy: /health"), 6, "server.redy", "unknown key (did you mean 'ready'?)"),
    (SERVED.replace("  ready: /health", "  ready: health"), 6, "server.ready", "an HTTP path like /health"),
    (SERVED.replace("  ready: /health", "  ready: /health\n  scope: grop"), 7, "server.scope",
     "(did you mean 'group'?)"),
    (SERVED.replace("  ready: /health", "  ready: /health\n  ready_timeout_minutes: 0"), 7,
     "server.ready_timeout_minutes", "must be a positive number of minutes"),
    (SERVED.replace("  ready: /health", "  ready: /health\n  version: v"), 7, "server.version", "an HTTP path"),
    (SERVED.replace("  ready: /health", "  ready: /health\n  env:\n    A: '{server_port}'"), 8, "server.env.A",
     "known only on the host, once the server starts"),
    (SERVED.replace("{spec}", "{spek}"), 5, "server.command", "unknown placeholder {spek} (did you mean 'spec'?)"),
    (SERVED.replace("{spec}", "'{spec}'"), 5, "server.command", "inside single quotes"),
    (SERVED.replace("  command: serve", "  comand: serve"), 5, "server.comand", "(did you mean 'command'?)"),
    (SERVED.replace("server:\n  command: serve --model {model} --port {server_port} {spec}\n  ready: /health\n",
                    "server: {ready: /health}\n"), 4, "server", "missing `command:`"),
    (SERVED.replace("server:\n  command: serve --model {model} --port {server_port} {spec}\n  ready: /health\n",
                    ""), 4, "command", "{server_port} is the port of the plan's `server:`, and this plan has none"),
    (MINIMAL + "  server_port: 80\n", 7, "vars.server_port", "filled in by ddops"),
])
def test_invalid_servers_say_file_line_and_key_path(tmp_path, text, line, keypath, fragment):
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'plan.yaml'}:{line}: {keypath}: "), msg
    assert fragment in msg, msg


def test_playbook_lint_checks_a_server_with_its_line(tmp_path):
    path = write(tmp_path, SERVED.replace("  ready: /health", "  redy: /health"))
    done = subprocess.run([sys.executable, "-m", "ddops", "playbook", "lint", str(path)], capture_output=True,
                          text=True, cwd=REPO_ROOT)
    assert done.returncode == EXIT_USAGE
    assert f"{path}:6: server.redy: unknown key (did you mean 'ready'?)" in done.stderr


# --- the vLLM plans -----------------------------------------------------------------------------------------------


def test_vllm_plans_run_the_ddtree_plans_prompts_sizes_and_temperatures():
    ddtree, vllm = load_bench_plan(PLAYBOOKS / "ddtree-bench.yaml"), load_bench_plan(PLAYBOOKS / "vllm-spec-bench.yaml")
    assert dict(vllm.matrix)["task"] == dict(ddtree.matrix)["task"]
    assert dict(vllm.matrix)["temperature"] == dict(ddtree.matrix)["temperature"]
    assert {k: vllm.vars[k] for k in ("model", "draft", "max_new_tokens")} == {
        k: ddtree.vars[k] for k in ("model", "draft", "max_new_tokens")}
    smoke = load_bench_plan(PLAYBOOKS / "ddtree-smoke.yaml")
    vsmoke = load_bench_plan(PLAYBOOKS / "vllm-spec-smoke.yaml")
    shared = ("model", "draft", "dataset", "max_samples", "max_new_tokens", "temperature")
    assert {k: vsmoke.vars[k] for k in shared} == {k: smoke.vars[k] for k in shared}
    # The smoke plan is the full one at the smoke's sizes: same server, command, helpers and methods.
    assert (vsmoke.server, vsmoke.command, dict(vsmoke.matrix)["spec"]) == (vllm.server, vllm.command,
                                                                           dict(vllm.matrix)["spec"])
    assert all(vsmoke.vars[k] == vllm.vars[k] for k in ("export_prompts", "bench_client", "vllm_python"))


def test_vllm_plan_starts_one_server_per_method_and_saves_every_output_with_its_dataset_and_temperature():
    plan = load_bench_plan(PLAYBOOKS / "vllm-spec-bench.yaml")
    runs = expand_runs(plan, HOST, "/r")
    assert len(runs) == 4 * 10 * 2 and len({r.server.group for r in runs}) == 4
    assert plan.server.ready == "/health" and plan.server.version == "/version"
    for run in runs:
        p = run.params
        assert "--save-result --save-detailed" in run.command and "--max-concurrency 1" in run.command
        assert (f"--metadata dataset={p['dataset']} temperature={p['temperature']} method={p['method']}"
                in run.command)
        assert f"--result-filename {p['dataset']}__t{p['temperature']}__{p['method']}.vllm.json" in run.command
        assert '--port "$DDOPS_SERVER_PORT"' in run.command and '--port "$DDOPS_SERVER_PORT"' in run.server.command


@pytest.mark.parametrize("method,flags", [
    ("baseline", []),
    ("dflash", ["--speculative-config.method=dflash", "--speculative-config.num_speculative_tokens=15",
                "--speculative-config.model=z-lab/Qwen3-8B-DFlash-b16"]),
    ("ngram", ["--speculative-config.method=ngram", "--speculative-config.num_speculative_tokens=3",
               "--speculative-config.prompt_lookup_max=3", "--speculative-config.prompt_lookup_min=1"]),
    ("mtp", ["--speculative-config.method=mtp", "--speculative-config.num_speculative_tokens=2"]),
])
def test_vllm_plan_serves_each_method_with_its_speculative_config_and_dflash_with_ddtrees_draft(tmp_path, method,
                                                                                               flags):
    # The server command, run by a shell as the runner runs it, with a stand-in python that prints its arguments.
    show = tmp_path / "python"
    show.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    show.chmod(0o755)
    plan = load_bench_plan(PLAYBOOKS / "vllm-spec-smoke.yaml")
    (run,) = [r for r in expand_runs(plan, {**HOST, "vllm_python": str(show), "serve_flags": ["--max-model-len", "64"]})
              if r.params["method"] == method]
    argv = subprocess.run(["sh", "-c", run.server.command], capture_output=True, text=True, check=True,
                          env={**os.environ, "DDOPS_SERVER_PORT": "8123"}).stdout.splitlines()
    assert argv == ["-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", "8123", "--model",
                    "Qwen/Qwen3-8B", "--seed", "0", "--generation-config", "vllm", *flags, "--max-model-len", "64"]
