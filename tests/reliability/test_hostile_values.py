"""Hostile values — `;`, `$(...)`, backticks, quotes, spaces, newlines — in a repo path, a host's address, user,
python or vars, and in playbook parameters: they are carried as data (JSON on stdin, shell-quoted words, file
bytes), never reach a shell, and never write outside the repo."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from tests.conftest import one_json, requires_sshd

pytestmark = [pytest.mark.sshd, requires_sshd]

MARKER = Path(f"/tmp/ddops-pwned-{uuid.uuid4().hex[:12]}")
# Each of these would create MARKER if any of it reached a shell unquoted.
EVIL = f";touch {MARKER};$(touch {MARKER})`touch {MARKER}`'\"&|<>"


@pytest.fixture(scope="module")
def hostile(make_fleet):
    """Four hosts whose repo lives at a path full of shell syntax (it exists: the patch really runs there)."""
    base = Path(f"/tmp/ddops-hostile-{uuid.uuid4().hex[:8]}")
    try:
        fleet = make_fleet(4, repo_path=f"{base}/re po{EVIL}/ddtree")
        yield fleet
    finally:
        shutil.rmtree(base, ignore_errors=True)
        assert not MARKER.exists()


@pytest.fixture(autouse=True)
def never_runs():
    yield
    assert not MARKER.exists(), "a hostile value reached a shell"


def test_a_repo_path_full_of_shell_syntax_is_patched_checked_verified_and_rolled_back_as_data(hostile, tmp_path):
    hostile.reset()
    text_new = f"import torch  # {EVIL}\n# a second line: {EVIL}"
    book = tmp_path / "hostile.yaml"
    book.write_text(
        "name: hostile\npatches:\n  - id: hostile-text\n    files: [dflash.py]\n"
        f"    transform: {{kind: text_replace, old: \"import torch\", new: {json.dumps(text_new)}}}\n"
        + "    checks:\n      - {kind: command, name: in the repo, run: 'test -f dflash.py && test -f ddtree.py'}\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(hostile.bed.inventory_path.read_text().replace(
        "  python:", f"  vars: {{tag: {json.dumps(EVIL)}, note: \"$(touch {MARKER})\"}}\n  python:"))
    patched = hostile.cli("--json", "patch", "--all", "hybrid-cache", str(book), inventory=inventory)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    doc = one_json(patched)
    assert {h["status"] for h in doc["hosts"]} == {"changed"}
    assert all(c["ok"] for h in doc["hosts"] for c in h["data"]["checks"] if c["kind"] == "command")
    for h in hostile.bed.hosts:
        assert hostile.repo(h.name) == Path(h.dir) / "repo"
        assert text_new in (hostile.repo(h.name) / "dflash.py").read_text()  # the text itself, byte for byte
    verified = hostile.cli("verify", "--all", "hybrid-cache", str(book), inventory=inventory)  # `cd <repo> && ...`
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert hostile.cli("status", "--all", "hybrid-cache", str(book), inventory=inventory).returncode == 0
    back = hostile.cli("--json", "rollback", "--all", inventory=inventory)
    assert back.returncode == 0, back.stdout + back.stderr
    for h in hostile.bed.hosts:
        hostile.assert_original(h.name)


def test_hostile_addresses_users_pythons_and_key_paths_fail_their_host_alone_and_run_nothing(hostile, tmp_path):
    hostile.reset()
    h2, h3, h4 = hostile.bed.hosts[1:]
    text = hostile.bed.inventory_path.read_text()
    hosts_at = text.index("hosts:\n")
    inventory = tmp_path / "inventory.yaml"
    # A key file that exists (a missing one stops the whole run before anything connects), named like a command.
    evil_key = Path(f"{tmp_path}/k$(touch {MARKER})")
    evil_key.parent.mkdir(parents=True)
    evil_key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nbm90IGEga2V5\n-----END OPENSSH PRIVATE KEY-----\n")
    inventory.write_text(text[:hosts_at] + "hosts:\n" + "\n".join([
        f"  host1: {{address: {hostile.bed.hosts[0].address}, port: 2222}}",
        f"  evil-user: {{address: {h2.address}, port: 2222, user: {json.dumps('root' + EVIL)}}}",
        f"  evil-python: {{address: {h3.address}, port: 2222, python: {json.dumps('python3' + EVIL)}}}",
        f"  evil-address: {{address: \"127.0.0.1;touch${{IFS}}{MARKER}\", port: 2222}}",
        f"  evil-key: {{address: {h4.address}, port: 2222, identity_file: {json.dumps(str(evil_key))}}}",
    ]) + "\n")
    proc = hostile.cli("--json", "patch", "--all", inventory=inventory)
    assert proc.returncode == 1
    hosts = {h["host"]: h for h in one_json(proc)["hosts"]}
    assert hosts["host1"]["status"] == "changed"
    assert hosts["evil-user"]["status"] == "unreachable" and "authentication failed" in hosts["evil-user"]["message"]
    assert hosts["evil-python"]["status"] == "failed" and "agent could not start" in hosts["evil-python"]["message"]
    assert hosts["evil-address"]["status"] == "unreachable" and "cannot connect" in hosts["evil-address"]["message"]
    assert hosts["evil-key"]["status"] == "unreachable" and "not a usable private key" in hosts["evil-key"]["message"]
    for name, h in hosts.items():
        assert "\n" not in h["message"] and not h["message"].startswith(f"{name}: ")  # the host is shown beside it
    for name in ("host2", "host3", "host4"):  # the hosts behind the hostile entries were not touched
        hostile.assert_original(name)
        assert not (hostile.repo(name) / ".ddops").exists()
