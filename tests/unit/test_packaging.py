"""pyproject.toml lists ddops' packages by hand (package-dir maps two of them): it must list every one."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]


def requirement_name(requirement: str) -> str:
    """The distribution a requirement line names: 'transformers>=5.0,<5.25' -> 'transformers'."""
    return re.split(r"[<>=\[; ]", requirement, maxsplit=1)[0].lower()


def test_every_package_of_ddops_and_the_shipped_folders_are_in_the_wheel_s_package_list():
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    inits = (REPO_ROOT / "ddops").rglob("__init__.py")
    on_disk = {".".join(init.parent.relative_to(REPO_ROOT).parts) for init in inits}
    assert set(config["packages"]) == on_disk | {"ddops._remote", "ddops._playbooks", "ddops._examples"}
    assert config["package-dir"] == {"ddops._remote": "remote", "ddops._playbooks": "playbooks",
                                     "ddops._examples": "examples"}


def test_the_wheel_ships_every_file_of_the_playbooks_folder_the_modules_of_add_module_too():
    import fnmatch

    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = patterns["ddops._playbooks"]
    assert "*.py" in shipped  # a playbook's add_module source lies beside it, and must travel with it
    for path in (REPO_ROOT / "playbooks").iterdir():
        if path.is_file():
            assert any(fnmatch.fnmatch(path.name, p) for p in shipped), f"playbooks/{path.name} is not in the wheel"


def test_the_bench_extra_installs_exactly_the_result_readers_ddops_imports():
    # `pip install ddops[bench]` is for reading results on the controller: what ddops itself imports beyond its
    # dependencies (torch for .pt files, matplotlib for --plot), and nothing that only runs models (transformers).
    import ast

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {requirement_name(r) for r in requirements}

    core = names(project["dependencies"]) | {"yaml", "pyyaml", "fabric", "invoke"}
    imported: set[str] = set()
    for path in (REPO_ROOT / "ddops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    import sys

    third_party = {n for n in imported if n not in sys.stdlib_module_names and n != "ddops"} - core
    assert names(extras["bench"]) == third_party == {"torch", "matplotlib"}
    assert "transformers" in names(extras["mini"])  # mini-DDTree's models, installed by scripts/setup
    assert "[bench,mini,test,fabric]" in (REPO_ROOT / "scripts" / "setup").read_text()


def test_the_wheel_metadata_names_its_license_and_urls():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and (REPO_ROOT / "LICENSE").read_text().startswith("MIT License")
    assert {"Homepage", "Documentation", "Issues"} <= set(project["urls"])
    assert all(url.startswith("https://") for url in project["urls"].values())


def test_mini_ddtree_s_requirements_ask_for_the_torch_and_transformers_that_the_mini_extra_pins():
    # Two audiences, one fact: `pip install ddops[mini]` on this machine, `pip install -r requirements.txt` on a
    # host running mini-DDTree by hand. A bound raised in one place only (transformers<5.25: pyproject's comment)
    # would leave the other installing what the playbooks fail on.
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lines = (REPO_ROOT / "examples" / "mini-ddtree" / "requirements.txt").read_text().split()
    by_name = {requirement_name(line): line for line in lines}
    for requirement in extras["mini"]:
        name = requirement_name(requirement)
        assert by_name.get(name) == requirement, (name, by_name.get(name), requirement)


def test_the_builtin_plans_require_the_torch_and_transformers_that_the_mini_extra_pins():
    # What a host needs to run a built-in plan is what this machine installs to run mini-DDTree: one bound, held
    # equal here, so that raising it in pyproject.toml alone fails until the plans follow.
    from packaging.specifiers import SpecifierSet

    from ddops.bench.plan import load_bench_plan

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = {requirement_name(r): SpecifierSet(r[len(requirement_name(r)):]) for r in extras["mini"]}
    for name in ("ddtree-bench", "ddtree-smoke", "mini-ddtree-bench"):
        declared = dict(load_bench_plan(REPO_ROOT / "playbooks" / f"{name}.yaml").requires_packages)
        assert {k: SpecifierSet(declared[k]) if k in declared else None for k in pinned} == pinned, name
