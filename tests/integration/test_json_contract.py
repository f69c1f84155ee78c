"""--json is one contract (docs/json.md): every command prints exactly one document with the same envelope
(schema_version, command, exit_code, interrupted), compact when piped, also when the command fails; and
`--check --exit-code` tells CI whether anything would change."""

from __future__ import annotations

import json

import pytest

from tests.conftest import requires_sshd, run_ddops

pytestmark = [pytest.mark.sshd, requires_sshd]

ENVELOPE = ("schema_version", "command", "exit_code", "interrupted")


def document(proc) -> dict:
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"not one compact line (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    doc = json.loads(lines[0])
    assert list(doc)[:4] == list(ENVELOPE) and doc["schema_version"] == 1 and doc["interrupted"] is False
    assert doc["exit_code"] == proc.returncode, proc.stderr
    return doc


def test_every_command_prints_one_enveloped_document_even_those_that_did_not(make_testbed, seed, tmp_path):
    bed = make_testbed(2, seed=seed, patches=("hybrid-cache",))
    inv = str(bed.inventory_path)
    commands = {
        "hosts": ["hosts"], "inventory check": ["inventory", "check"], "ping": ["ping", "--all"],
        "testbed status": ["testbed", "status"], "exec": ["exec", "--all", "-i", inv, "--json", "--", "true"],
        "patch": ["patch", "--all", "--check"], "status": ["status"],
        "bench logs": ["bench", "logs", "20260101-0000-abcd", "--all", "--results-dir", str(tmp_path)],
        "bench list": ["bench", "list"],
    }
    for name, argv in commands.items():
        doc = document(run_ddops(*argv) if "--" in argv else run_ddops(*argv, "-i", inv, "--json"))
        assert doc["command"] == name
    assert [h["host"] for h in document(run_ddops("hosts", "-i", inv, "--json"))["hosts"]] == ["host1", "host2"]
    assert document(run_ddops("inventory", "check", "-i", inv, "--json"))["inventory"]["hosts"] == 2
    testbed = document(run_ddops("testbed", "status", "-i", inv, "--json"))
    assert [(h["host"], h["running"]) for h in testbed["hosts"]] == [("host1", True), ("host2", True)]
    logs = run_ddops("bench", "logs", "20260101-0000-abcd", "--all", "--results-dir", str(tmp_path), "-i", inv,
                     "--json")
    assert logs.returncode == 1 and document(logs)["summary"] == {"skipped": 2}  # no host has that run


def test_a_command_that_fails_before_any_host_still_prints_its_document(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  a: {prot: 1}\n")
    doc = document(run_ddops("inventory", "check", "-i", str(bad), "--json"))
    assert doc["exit_code"] == 2 and doc["error"].startswith(f"{bad}:2: hosts.a.prot: unknown key")
    report = document(run_ddops("--json", "bench", "report", "--results-dir", str(tmp_path / "none")))
    assert report["command"] == "bench report" and "nothing collected" in report["error"]


def test_check_exit_code_is_3_while_anything_would_change_and_0_once_nothing_would(make_testbed, seed):
    bed = make_testbed(2, seed=seed, patches=("hybrid-cache",))
    pending = run_ddops("patch", "--all", "--check", "--exit-code", inventory=bed.inventory_path)
    assert pending.returncode == 3, pending.stderr
    assert document(run_ddops("--json", "patch", "--all", "--check", "--exit-code",
                              inventory=bed.inventory_path))["exit_code"] == 3
    assert run_ddops("patch", "--all", "--check", inventory=bed.inventory_path).returncode == 0  # without the flag
    assert run_ddops("patch", "--all", inventory=bed.inventory_path).returncode == 0
    assert run_ddops("patch", "--all", "--check", "--exit-code", inventory=bed.inventory_path).returncode == 0
