"""Where the files ddops ships beside its code are: the host agent, the built-in playbooks and bench plans, and the
examples (mini-ddtree, the CI workflow).

In the checkout they are the top-level `remote/`, `playbooks/` and `examples/` folders (the one copy); the wheel
carries the same folders as package data, `ddops/_remote`, `ddops/_playbooks` and `ddops/_examples` (pyproject.toml
maps them), read through importlib.resources. An editable install runs from the checkout, where the package has neither.
"""

from __future__ import annotations

import functools
from pathlib import Path


def _shipped(installed: str, checkout: str) -> Path:
    from importlib import resources  # slow to import (RESULTS.md): only commands that touch hosts or playbooks pay it

    folder = resources.files("ddops") / installed
    if isinstance(folder, Path) and folder.is_dir():
        return folder
    return Path(__file__).resolve().parent.parent / checkout


@functools.lru_cache(maxsize=1)
def remote_dir() -> Path:
    """The host agent's folder: bootstrap.py and the ddops_agent package."""
    return _shipped("_remote", "remote")


@functools.lru_cache(maxsize=1)
def playbooks_dir() -> Path:
    """The built-in patch playbooks and bench plans."""
    return _shipped("_playbooks", "playbooks")


@functools.lru_cache(maxsize=1)
def examples_dir() -> Path:
    """The shipped examples: mini-ddtree (a testbed seed) and ci/ (a workflow to copy)."""
    return _shipped("_examples", "examples")


def example_names() -> list[str]:
    """The examples a testbed can be seeded with (`--seed NAME`)."""
    return sorted(p.name for p in examples_dir().iterdir() if p.is_dir() and p.name != "ci")
