"""pyproject.toml lists ddops' packages by hand (package-dir maps two of them): it must list every one."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_every_package_of_ddops_and_the_shipped_folders_are_in_the_wheel_s_package_list():
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    inits = (REPO_ROOT / "ddops").rglob("__init__.py")
    on_disk = {".".join(init.parent.relative_to(REPO_ROOT).parts) for init in inits}
    assert set(config["packages"]) == on_disk | {"ddops._remote", "ddops._playbooks"}
    assert config["package-dir"] == {"ddops._remote": "remote", "ddops._playbooks": "playbooks"}
