"""The package's layers, read from its imports: every folder of ddops imports only downward, and each third-party
dependency has one home. Imports inside functions and under TYPE_CHECKING count like any other."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import ddops

PACKAGE = Path(ddops.__file__).resolve().parent

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("values", frozenset({"ddops", "ddops.settings", "ddops.errors", "ddops.strenum", "ddops.cache", "ddops.yamlsrc",
                          "ddops.sshconfig", "ddops.slurm_options", "ddops.inventory", "ddops.inventory_import",
                          "ddops.resources", "ddops.pins", "ddops.jsonvalue", "ddops.ownership",
                          "ddops.safe_text", "ddops.grouping"})),
    ("patching", frozenset({"ddops.patching"})),  # pure: libcst, plans, checks, journal, playbooks
    ("bench", frozenset({"ddops.bench"})),  # pure: bench plans, run values, result files, report
    ("transport", frozenset({"ddops.transport", "ddops.testbed", "ddops.fabric"})),
    ("fleet", frozenset({"ddops.fleet"})),
    ("tasks", frozenset({"ddops.tasks"})),  # the only layer that talks to hosts through a session
    ("cli", frozenset({"ddops.cli", "ddops.__main__"})),
)

# Third-party packages and the one place each may be imported from (a module, or a folder and all below it).
HOMES = {
    "paramiko": ("ddops.transport",),
    "typer": ("ddops.cli",),
    "rich": ("ddops.cli",),
    "libcst": ("ddops.patching",),
    "torch": ("ddops.bench.results",),
    "matplotlib": ("ddops.bench.plot",),
    "yaml": ("ddops.yamlsrc",),
    "packaging": ("ddops.bench.environment",),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=1)
def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def imports_of(name: str, path: Path) -> frozenset[str]:
    # `from ddops.testbed import namespace` inside ddops/testbed/__init__.py names the package itself: not a cycle
    return frozenset(imports_in(path.read_text(), name, is_package=path.name == "__init__.py") - {name})


def imports_in(source: str, name: str, *, is_package: bool = False) -> set[str]:
    """Every module name the module `name` imports, anywhere in its body (relative imports resolved)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from ddops.patching import journal` imports the module ddops.patching.journal
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in all_modules())
    return found


def layer_of(module: str) -> int:
    """The layer of a module: named itself, or inside a named folder (the package `ddops` names only itself)."""
    for rank, (_, members) in enumerate(LAYERS):
        if any(module == m or (m != "ddops" and module.startswith(m + ".")) for m in members):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


@functools.lru_cache(maxsize=1)
def internal_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: {i for i in imports_of(name, path) if i in modules} for name, path in modules.items()}


def test_every_module_of_ddops_belongs_to_a_layer():
    for name in all_modules():
        layer_of(name)


def test_imports_between_layers_only_go_down():
    upward = []
    for name, imported in internal_graph().items():
        for other in imported:
            if layer_of(other) > layer_of(name):
                upward.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {other} ({LAYERS[layer_of(other)][0]})")
    assert not upward, "imports that go up a layer:\n" + "\n".join(sorted(upward))


def test_the_pure_layers_never_reach_a_host():
    """patching/ and bench/ decide; only tasks/ (through a session) and the fleet runner act."""
    for name, imported in internal_graph().items():
        if name.startswith(("ddops.patching", "ddops.bench")):
            reaching = {i for i in imported if i.startswith(("ddops.transport", "ddops.fleet", "ddops.tasks"))}
            assert not reaching, f"{name} imports {sorted(reaching)}"


def test_no_module_of_ddops_imports_itself_back_through_others():
    graph = internal_graph()
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # A package's __init__ imported by its own submodule is Python importing the parent first, not a cycle
            # of ours, unless the __init__ imports the submodule back (then the walk below finds it).
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_each_third_party_dependency_is_imported_from_its_one_home():
    strays = []
    for name, path in all_modules().items():
        for imported in imports_of(name, path):
            home = HOMES.get(imported.split(".")[0])
            if home and not any(name == h or name.startswith(h + ".") for h in home):
                strays.append(f"{name} imports {imported} (its home: {', '.join(home)})")
    assert not strays, "\n".join(strays)


def test_the_gpu_session_scripts_import_nothing_of_the_controller():
    """They run under the GPU machine's image, which has no libcst or paramiko (issue 36); gpu_prepare.py, which
    runs here, is the one that may use ddops."""
    folder = PACKAGE.parent / "benchmarks" / "hybrid-tree-verify"
    for script in ("gpu.py", "gpu_session.py"):
        found = {name.split(".")[0] for name in imports_in((folder / script).read_text(), script[:-3])}
        assert not found & {"ddops", "libcst", "paramiko", "typer", "rich", "yaml"}, (script, sorted(found))


def test_the_layer_check_sees_imports_inside_functions_and_relative_ones():
    source = "import os\n\ndef f():\n    from ddops.tasks import patch\n    from ..fleet import run_fleet\n"
    found = imports_in(source, "ddops.bench.x")
    assert {"ddops.tasks", "ddops.tasks.patch", "ddops.fleet", "os"} <= found
    assert layer_of("ddops.tasks.patch") > layer_of("ddops.bench.x")


# DDOPS_* names that are no setting of ddops but what the host agent puts in a run's environment, which one controller
# module must spell too: name -> (that module, the agent module and constant that are the name's home).
HOST_NAMES = {"DDOPS_SERVER_PORT": ("ddops.bench.plan", "servers.py", "PORT_ENV")}


def test_names_the_agent_sets_for_runs_are_spelled_as_the_agent_spells_them():
    from ddops.resources import remote_dir

    for value, (_, agent_file, constant) in HOST_NAMES.items():
        tree = ast.parse((remote_dir() / "ddops_agent" / agent_file).read_text())
        assigned = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
        assert assigned.get(constant) == value, f"{agent_file} {constant} is not {value}"


def test_ddops_environment_settings_are_named_and_read_only_in_ddops_settings():
    """One home per fact: a DDOPS_* variable is a Setting in ddops/settings.py, and the README lists each one."""
    import re

    from ddops.settings import SETTINGS

    named = re.compile(r"DDOPS_[A-Z0-9_]+\Z")
    strays = []
    for name, path in all_modules().items():
        if name == "ddops.settings":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and named.match(node.value) \
                    and HOST_NAMES.get(node.value, (None,))[0] != name:
                strays.append(f"{name}:{node.lineno}: {node.value}")
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"environ(\.get)?[\[(]\s*f?[\"']DDOPS_", line):
                strays.append(f"{name}:{line_no}: reads the environment itself")
    assert not strays, "DDOPS_* settings outside ddops/settings.py:\n" + "\n".join(strays)
    readme = (PACKAGE.parent / "README.md").read_text()
    assert [s.name for s in SETTINGS if f"`{s.name}`" not in readme] == []


def cli_sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in all_modules().items() if name.startswith("ddops.cli")}


def test_the_cli_builds_no_per_host_task_and_reads_no_run_document():
    # Tasks (what a command does on one host) and the values they return live below the CLI: a command parses,
    # calls, renders.
    for name, source in cli_sources().items():
        built = {node.func.id for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert not built & {"TaskOutcome", "RunRecord", "HostRun"}, name


def test_the_cli_renders_report_values_and_never_indexes_a_result():
    # A task's report is a value: the CLI reads its fields (r.report.files, r.report.run), never keys of its JSON
    # (r.data["files"][0]["patches"]...); the JSON is the report's own to_json(), written at the edge.
    indexed = []
    for name, source in cli_sources().items():
        indexed += [f"{name}: .data[" for _ in range(source.count(".data["))]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Subscript):
                base = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                base = node.func.value
            else:
                continue
            while isinstance(base, ast.Attribute) and base.attr != "report":
                base = base.value
            if isinstance(base, ast.Attribute):
                indexed.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert indexed == []


def test_tasks_return_report_values_not_dicts():
    # The one place a report's keys are spelled is its type (its fields, its to_json); TaskOutcome refuses a dict
    # when run, and no task builds one for it.
    dicts = []
    for name, path in all_modules().items():
        if not name.startswith("ddops.tasks"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "TaskOutcome":
                given = node.args[2:3] + [k.value for k in node.keywords if k.arg == "report"]
                if any(isinstance(g, (ast.Dict, ast.DictComp)) or getattr(getattr(g, "func", None), "id", None)
                       == "dict" for g in given):
                    dicts.append(f"{name}:{node.lineno}")
    assert dicts == []


def test_the_host_selection_and_global_options_are_declared_once():
    # One declaration of --host/--group/--all/--limit and of the global options (ddops.cli.options); every command
    # gets them from there, with the selection as one `Selection` value.
    for name, source in cli_sources().items():
        if name == "ddops.cli.options":
            continue
        for option in ('"--host"', '"--group"', '"--limit"', '"--json"', '"--forks"', '"--inventory"',
                       '"--accept-new"', '"--verbose"'):
            assert option not in source, f"{name} declares {option}"
        assert "Selection(" not in source, name


def test_the_planner_is_pure_and_its_disk_cache_lives_beside_it():
    """patching/plan.py plans; what outlives a run (the cache dir) is plan_store.py, handed to the Planner."""
    imported = imports_of("ddops.patching.plan", all_modules()["ddops.patching.plan"])
    assert not imported & {"ddops.cache", "os", "pathlib", "shutil", "tempfile"}, sorted(imported)


def test_the_inventory_package_reads_values_parses_them_and_selects_among_them_in_that_order():
    """ddops/inventory/: schema.py holds the values and imports neither of the others; parsing.py (the file) and
    selection.py (the command line) each build on the schema alone; the package re-exports all three."""
    graph = internal_graph()
    inside = {name: {i for i in imported if i.startswith("ddops.inventory.")}
              for name, imported in graph.items() if name.startswith("ddops.inventory.")}
    assert inside == {"ddops.inventory.schema": set(), "ddops.inventory.parsing": {"ddops.inventory.schema"},
                      "ddops.inventory.selection": {"ddops.inventory.schema"}}
    # Only parsing reads files and the environment (the inventory, ssh_config, DDOPS_INVENTORY).
    readers = {"ddops.sshconfig", "ddops.settings"}
    assert not graph["ddops.inventory.schema"] & readers and not graph["ddops.inventory.selection"] & readers


def test_sync_modes_no_run_kinds_and_slurm_formats_are_each_defined_once():
    """One home per fact: the sync modes (inventory), the no-run error kinds (bench/runs), and squeue's and sacct's
    formats (the agent, which sends them with the output; ddops/ only knows what the codes mean)."""
    import ast

    tuples = {("auto", "remote", "push"): [], ("no_run", "no_repo"): []}
    formats = []
    for name, path in all_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                values = tuple(e.value for e in node.elts)
                if values in tuples:
                    tuples[values].append(name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value.startswith("%i|") or node.value.startswith("JobID,")):
                formats.append(name)
    assert tuples == {("auto", "remote", "push"): ["ddops.inventory.schema"],
                      ("no_run", "no_repo"): ["ddops.bench.runs"]}
    assert formats == []


def test_the_production_agent_bundle_ships_no_fault_injection():
    # Fault injection can SIGKILL the host's sshd session: it lives in tests/ (only the reliability tests' bundles
    # add it), and no shipped module imports it (the agent reaches it through protocol.fault_hook, a no-op without it).
    import json
    import zlib

    from ddops.resources import remote_dir
    from ddops.transport.agent import build_program

    # build_program() is what agent_program() caches (the reliability tests swap agent_program for their run).
    shipped = {entry[0] for entry in json.loads(zlib.decompress(build_program().bundle))["modules"]}
    assert "ddops_agent.protocol" in shipped and "ddops_agent.faults" not in shipped
    for path in sorted((remote_dir() / "ddops_agent").glob("*.py")):
        assert "ddops_agent.faults" not in imports_in(path.read_text(), f"ddops_agent.{path.stem}"), path.name


def agent_error_kinds() -> dict[str, str]:
    """protocol.ERROR_KINDS, read from the agent's source (the controller never imports the agent)."""
    from ddops.resources import remote_dir

    tree = ast.parse((remote_dir() / "ddops_agent" / "protocol.py").read_text())
    (table,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["ERROR_KINDS"]]
    return ast.literal_eval(table)


def kinds_raised_by_the_agent() -> dict[str, str]:
    """Each error kind the agent's code names (AgentFault/failure/fail's first argument, a `kind=` argument or
    default, a {"kind": ...} record) -> where."""
    from ddops.resources import remote_dir

    found: dict[str, str] = {}
    for path in [remote_dir() / "bootstrap.py", *sorted((remote_dir() / "ddops_agent").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            named = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("AgentFault", "failure", "fail"):
                named += node.args[:1]
            if isinstance(node, ast.Call):
                named += [k.value for k in node.keywords if k.arg == "kind"]
            if isinstance(node, ast.Dict):
                named += [v for k, v in zip(node.keys, node.values)
                          if isinstance(k, ast.Constant) and k.value == "kind"]
            if isinstance(node, (ast.FunctionDef, ast.Lambda)):
                arguments = node.args.args[len(node.args.args) - len(node.args.defaults):]
                named += [d for a, d in zip(arguments, node.args.defaults) if a.arg == "kind"]
            for value in named:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.setdefault(value.value, f"{path.name}:{value.lineno}")
    return found


def kinds_the_controller_matches() -> dict[str, str]:
    """Each string the controller compares an error's `.kind` with (directly or through a module-level constant,
    its own or one it imports)."""
    found: dict[str, str] = {}
    trees = {name: ast.parse(path.read_text()) for name, path in all_modules().items()
             if not name.startswith("ddops.patching")}  # transform and check kinds, not agent errors
    constants = {t.id: node.value for tree in trees.values() for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "kind":
                for other in node.comparators:
                    other = constants.get(other.id, other) if isinstance(other, ast.Name) else other
                    values = other.elts if isinstance(other, (ast.Tuple, ast.List, ast.Set)) else [other]
                    for value in values:
                        if isinstance(value, ast.Constant) and isinstance(value.value, str):
                            found.setdefault(value.value, f"{name}:{node.lineno}")
    return found


def test_agent_error_kinds_come_from_one_table_that_the_agent_raises_and_the_controller_matches():
    table, raised, matched = agent_error_kinds(), kinds_raised_by_the_agent(), kinds_the_controller_matches()
    assert {k: w for k, w in raised.items() if k not in table} == {}, "kinds raised but not in protocol.ERROR_KINDS"
    assert [k for k in table if k not in raised] == [], "kinds in protocol.ERROR_KINDS that nothing raises"
    assert matched and {k: w for k, w in matched.items() if k not in table} == {}, "kinds matched, never raised"


def test_host_errors_get_their_host_as_a_field_not_baked_into_the_message():
    # HostError.__str__ adds `host: ` once; a message that starts with `{host}: ` would show it twice.
    from ddops import errors

    classes = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.HostError)}
    baked = []
    for name, path in all_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in classes and node.args:
                first = node.args[0]
                if isinstance(first, ast.JoinedStr) and len(first.values) >= 2 \
                        and isinstance(first.values[0], ast.FormattedValue) \
                        and isinstance(first.values[1], ast.Constant) and str(first.values[1].value).startswith(": "):
                    baked.append(f"{name}:{node.lineno}")
    assert classes >= {"TransportError", "AgentError", "CommandTimeout"} and baked == []
