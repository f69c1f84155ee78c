"""The transformers support matrix of the hybrid playbooks: each release in playbooks/hybrid-support.yaml, in a venv of
its own (torch 2.13.0 CPU, that transformers, nothing else), does what the file says it does.

On a supported release the route (the one-forward verify, or the reference where it cannot be taken) equals
forwards without any cache, and the mini DDTree patched with the playbooks the README recommends for hybrids runs
every method (baseline, DFlash, DDTree at budgets 4-64, spec_generate) on the hybrid and the pure-attention target,
each output equal to the target's cache-free greedy decoding, with the verify path the file names recorded in the
results. An unsupported release fails the way the file says. The default suite runs the oldest, a middle and the
newest release; DDOPS_HYBRID_MATRIX=all runs them all (the README says how).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import hybrid_matrix as matrix
from tests.unit.test_hybrid_tree_verify import MINI, patch_repo
from tests.unit.test_mini_ddtree import bench_env, trained_models  # noqa: F401 - a fixture: the trained mini models

PROBE = Path(__file__).resolve().parents[1] / "hybrid_probe.py"
MODULE = matrix.REPO_ROOT / "playbooks" / "hybrid_verify.py"
RECOMMENDED = ("hybrid-cache", "crop-relative", "cpu-timing", "hybrid-tree-verify")
SAMPLES, TOKENS, BUDGETS = 2, 32, "4,8,16,32,64"

pytestmark = pytest.mark.torch


def probe(version: str, *args: str) -> dict:
    done = subprocess.run([str(matrix.venv_python(version)), str(PROBE), *args], env=bench_env(), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@functools.cache
def observed(version: str, repo: Path, models: Path) -> dict:
    """What the probe saw on version: the route and the patched mini DDTree, from one run (shared by two tests)."""
    return probe(version, "both", str(MODULE), str(repo), str(models), str(SAMPLES), str(TOKENS), BUDGETS)


def record(version: str, **found: object) -> None:
    """What this run saw on version, for `tests/hybrid_matrix.py --write` (only when DDOPS_HYBRID_MATRIX_RECORD)."""
    where = os.environ.get(matrix.RECORD_ENV)
    if where:
        path = Path(where) / f"{version}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        seen = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**seen, **found}))


def expected_verify(version: str, seen: str) -> str:
    """The verify path the support file names for version (while recording: the one seen)."""
    return seen if os.environ.get(matrix.RECORD_ENV) else matrix.entry(version)["verify"]


@pytest.fixture(scope="module")
def patched_repo(tmp_path_factory, trained_models) -> Path:  # noqa: F811
    """mini-DDTree with the playbooks the README recommends for hybrids, as `ddops patch` leaves it, and its models."""
    repo = tmp_path_factory.mktemp("hybrid-matrix") / "ddtree"
    shutil.copytree(MINI, repo, ignore=shutil.ignore_patterns("models", "runs", "logs", "__pycache__"))
    patch_repo(repo, *RECOMMENDED)
    return repo


def supported(version: str) -> bool:
    return bool(matrix.entry(version)["supported"])


@pytest.mark.parametrize("version", matrix.selected())
def test_the_route_equals_cache_free_forwards_and_takes_the_path_the_support_file_names(version, patched_repo,
                                                                                        trained_models):  # noqa: F811
    if not supported(version):
        pytest.skip(f"transformers {version} is not supported: {matrix.entry(version)['why']}")
    seen_by_probe = observed(version, patched_repo, trained_models)
    assert seen_by_probe["transformers"] == version
    found = seen_by_probe["route"]
    assert found["logit_gap"] <= 1e-4 and found["state_gap"] <= 1e-5, found
    assert len(found["paths"]) == 1, found["paths"]  # one path for every round on one release
    seen = next(iter(found["paths"]))
    assert seen == expected_verify(version, seen) and found["paths"][seen] == found["rounds"]
    record(version, supported=True, verify=seen)


@pytest.mark.parametrize("version", matrix.selected())
def test_every_method_of_the_patched_mini_ddtree_equals_cache_free_greedy(version, patched_repo, trained_models):  # noqa: F811
    if not supported(version):
        pytest.skip(f"transformers {version} is not supported: {matrix.entry(version)['why']}")
    found = observed(version, patched_repo, trained_models)["mini"]
    methods = {"baseline", "dflash", "spec_generate", *(f"ddtree_tb{b}" for b in BUDGETS.split(","))}
    for target in ("qwen3.5-hybrid", "qwen3-attn"):
        rows = found[target]
        assert set(rows) == methods
        unequal = {key: row for key, row in rows.items() if not row["equal"] == row["responses"] == SAMPLES}
        assert not unequal, (target, unequal)
    hybrid, attention = found["qwen3.5-hybrid"], found["qwen3-attn"]
    seen = next(iter(hybrid["dflash"]["verify_paths"]))
    for key in methods - {"baseline", "spec_generate"}:
        assert set(hybrid[key]["verify_paths"]) == {expected_verify(version, seen)}, (key, hybrid[key])
    # The baseline verifies one token at a time and the pure-attention target has no linear layer: no hybrid verify
    # ran, and the results say nothing about one.
    assert hybrid["baseline"]["verify_paths"] == {} and all(not row["verify_paths"] for row in attention.values())
    record(version, supported=True, verify=seen)


@pytest.mark.parametrize("version", [v for v in matrix.selected() if not matrix.entry(v)["supported"]])
def test_an_unsupported_release_fails_as_the_support_file_says(version):
    done = subprocess.run([str(matrix.venv_python(version)), str(PROBE), "route", str(MODULE)], env=bench_env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode != 0 and matrix.entry(version)["error"] in done.stderr, done.stderr[-2000:]


def test_the_readme_table_is_the_support_file():
    text = matrix.README.read_text()
    table = text.split(matrix.TABLE_BEGIN)[1].split(matrix.TABLE_END)[0].strip()
    assert table == matrix.readme_table(matrix.entries())


def test_the_support_file_names_every_release_line_once_oldest_first():
    versions = [tuple(int(part) for part in v.split(".")) for v in matrix.releases()]
    assert versions == sorted(versions) and len({v[:2] for v in versions}) == len(versions)
    for row in matrix.entries():
        assert set(row) == ({"version", "supported", "verify"} if row["supported"]
                            else {"version", "supported", "why", "error"}), row


def test_the_mini_extra_asks_for_exactly_the_releases_the_support_file_covers():
    import tomllib

    supported = [row["version"] for row in matrix.entries() if row["supported"]]
    newest = [int(part) for part in supported[-1].split(".")]
    bound = f"transformers>={supported[0]},<{newest[0]}.{newest[1] + 1}"
    extras = tomllib.loads((matrix.REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert bound in extras["mini"], (bound, extras["mini"])
