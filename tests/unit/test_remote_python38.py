"""The agent claims Python >= 3.8 on the hosts, which no test runs: every file under remote/ is checked statically
instead, by vermin (the standard library's modules, functions and members, and the syntax, by the version that
brought them) and by one rule vermin only guesses at (`X | Y` of types, evaluated at run time: 3.10)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REMOTE = Path(__file__).resolve().parents[2] / "remote"
MINIMUM = "3.8"
# Names whose `|` is a union of types, not a bitwise or (os.O_RDONLY | os.O_NOFOLLOW is fine on 3.8).
TYPE_NAMES = {"int", "float", "complex", "str", "bytes", "bytearray", "bool", "list", "dict", "tuple", "set",
              "frozenset", "type", "object", "None"}


def vermin_violations(*paths: Path) -> list[str]:
    """vermin's report lines for what needs a Python newer than MINIMUM (exit 0: none)."""
    argv = [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())",
            f"-t={MINIMUM}-", "--no-tips", "--violations", "--eval-annotations", "--no-parse-comments",
            *map(str, paths)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "No module named" not in done.stderr, "vermin is in the test extra: pip install -e '.[test]'"
    if done.returncode == 0:
        return []
    return [line for line in done.stdout.splitlines() if "require" in line] or [done.stdout]


def is_type_operand(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Name) and node.id in TYPE_NAMES:
        return True
    if isinstance(node, ast.Subscript):  # list[int] | None
        return is_type_operand(node.value)
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and is_type_union(node)


def is_type_union(node: ast.BinOp) -> bool:
    return is_type_operand(node.left) or is_type_operand(node.right)


def runtime_type_unions(source: str, name: str) -> list[str]:
    """`X | Y` of types that Python evaluates: anywhere in code, and in annotations unless the module defers them
    (`from __future__ import annotations`)."""
    tree = ast.parse(source, name)
    deferred = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                   any(a.name == "annotations" for a in n.names) for n in tree.body)
    annotations: set[int] = set()
    if deferred:
        for node in ast.walk(tree):
            for annotation in annotation_nodes(node):
                annotations.update(id(sub) for sub in ast.walk(annotation))
    return [f"{name}:{node.lineno}: `{ast.unparse(node)}` (a union of types needs 3.10)"
            for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in annotations
            and is_type_union(node)]


def annotation_nodes(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        return [a.annotation for a in every if a.annotation] + ([node.returns] if node.returns else [])
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


def remote_files() -> list[Path]:
    # The fault injection the reliability tests ship with the agent runs on the hosts too.
    files = sorted(REMOTE.rglob("*.py")) + [REMOTE.parent / "tests" / "reliability" / "agent_faults.py"]
    assert len(files) > 5 and REMOTE / "ddops_agent" / "journal.py" in files
    return files


def test_nothing_under_remote_needs_a_python_newer_than_3_8():
    assert vermin_violations(*remote_files()) == []
    found = [hit for path in remote_files() for hit in runtime_type_unions(path.read_text(), str(path))]
    assert found == []


def test_the_check_finds_what_3_8_lacks(tmp_path):
    """The check itself can fail: each of these needs 3.9 or later."""
    cases = {
        "removeprefix.py": 'x = "ab".removeprefix("a")\n',
        "lcm.py": "import math\nmath.lcm(2, 3)\n",
        "zoneinfo_.py": "import zoneinfo\n",
        "dict_union.py": "d = {} | {}\n",
        "generic.py": "x = list[int]\n",
        "with_parens.py": 'with (open("a") as f, open("b") as g):\n    pass\n',
        "match_.py": "match 1:\n    case 1:\n        pass\n",
    }
    for name, source in cases.items():
        (tmp_path / name).write_text(source)
        assert vermin_violations(tmp_path / name), name
    (tmp_path / "walrus.py").write_text("if (n := 3):\n    pass\n")
    assert vermin_violations(tmp_path / "walrus.py") == []  # 3.8 has it
    assert runtime_type_unions("def f(a: int | None): pass\n", "f.py")
    assert runtime_type_unions("isinstance(1, int | str)\n", "g.py")
    assert runtime_type_unions("from __future__ import annotations\ndef f(a: int | None): pass\n", "h.py") == []
    assert runtime_type_unions("import os\nflags = os.O_RDONLY | os.O_NOFOLLOW\n", "i.py") == []
