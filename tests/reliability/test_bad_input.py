"""Bad input, end to end on sshd hosts: each is refused with exit 2 (before any host is touched) or fails its host
only, with a one-line message naming the file, line or host, and nothing is written anywhere."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.conftest import one_json, requires_sshd
from tests.reliability.conftest import FILES, host_statuses, messages

pytestmark = [pytest.mark.sshd, requires_sshd]


@pytest.fixture(scope="module")
def fleet(make_fleet):
    return make_fleet(2)


def untouched(fleet) -> None:
    """No host had anything written: originals in place, no .ddops state."""
    for h in fleet.bed.hosts:
        fleet.assert_original(h.name)
        assert not (fleet.repo(h.name) / ".ddops").exists(), h.name


def error_line(proc) -> str:
    """The one `ddops: error:` line of a usage error (exit 2), and nothing on stdout."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ddops: error: ")
    return lines[0]


def inventory(fleet, tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(fleet.bed.inventory_path.read_text() + text)
    return path


def playbook(tmp_path: Path, text: str, name: str = "pb.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TEXT_PATCH = ("name: t\npatches:\n  - id: t\n    files: [dflash.py]\n"
              "    transform: {kind: text_replace, old: 'import torch', new: 'import torch  # t'}\n")


# -- refused before any host is touched (exit 2) -----------------------------------------------------------------


# Each line is appended to the testbed's inventory; the error names that line (the one after it: end of stream).
@pytest.mark.parametrize("case, text, after, says", [
    ("malformed YAML", "  host9: {address: [1, 2\n", 1, "invalid YAML: expected ',' or ']'"),
    ("unknown key", "  host9: {address: 127.0.0.9, prot: 22}\n", 0,
     "hosts.host9.prot: unknown key (did you mean 'port'?)"),
    ("wrong type", "  host9: {address: 127.0.0.9, port: '22'}\n", 0,
     "hosts.host9.port: must be an integer, not a string"),
    ("duplicate host name", "  host1: {address: 127.0.0.9}\n", 0, "hosts.host1: duplicate key"),
    ("duplicate address", "  host9: {address: HOST1, port: 2222}\n", 0, "hosts.host9: same address"),
    ("hostile host name", "  'h;touch x': {address: 127.0.0.9}\n", 0, "host names use letters, digits"),
    ("repo with a newline", "  host9: {address: 127.0.0.9, repo: \"/root/dd\\ntree\"}\n", 0,
     "must not contain newlines"),
    ("repo with ..", "  host9: {address: 127.0.0.9, repo: /root/../etc}\n", 0,
     "must not contain newlines, NUL bytes or '..'"),
])
def test_a_bad_inventory_is_exit_2_naming_file_line_and_key_and_nothing_runs(clean, tmp_path, case, text, after, says):
    text = text.replace("HOST1", clean.bed.hosts[0].address)
    path = inventory(clean, tmp_path, text)
    where = len(path.read_text().splitlines()) + after
    line = error_line(clean.cli("patch", "--all", inventory=path))
    assert line.startswith(f"ddops: error: {path}:{where}: ") and says in line, line
    untouched(clean)


@pytest.mark.parametrize("case, text, where, says", [
    ("malformed YAML", "name: t\npatches:\n  - id: t\n    files: [dflash.py\n", 5, "invalid YAML"),
    ("unknown key", TEXT_PATCH + "    chekcs: []\n", 6, "patches[0].chekcs: unknown key (did you mean 'checks'?)"),
    ("wrong type", TEXT_PATCH.replace("[dflash.py]", "dflash.py"), 4, "patches[0].files: must be a list, not a string"),
    ("transform with an unknown parameter",
     "name: t\npatches:\n  - id: t\n    files: [dflash.py]\n    transform:\n      kind: set_call_kwarg\n"
     "      calee: DynamicCache\n      keyword: config\n      value: cfg\n", 7,
     "patches[0].transform.calee: unknown param for set_call_kwarg (did you mean 'callee'?)"),
    ("path traversal", TEXT_PATCH.replace("[dflash.py]", "['../../etc/passwd']"), 4,
     "'../../etc/passwd' contains '..': paths must stay inside the repo"),
    ("absolute path", TEXT_PATCH.replace("[dflash.py]", "[/etc/passwd]"), 4, "is absolute"),
    ("state directory", TEXT_PATCH.replace("[dflash.py]", "[.ddops/journal.jsonl]"), 4, "inside .ddops/"),
])
def test_a_bad_playbook_is_exit_2_naming_file_line_and_key_and_nothing_runs(clean, tmp_path, case, text, where, says):
    path = playbook(tmp_path, text)
    line = error_line(clean.cli("patch", "--all", str(path)))
    assert line.startswith(f"ddops: error: {path}:{where}: ") and says in line, line
    untouched(clean)


@pytest.mark.parametrize("args, says", [
    ((), "no hosts selected: use --host NAME, --group NAME, --all or --limit PATTERN"),
    (("--limit", "gpu-*"), "--limit gpu-*: matches no selected host"),
    (("--group", "h200"), "--group h200: no such group"),
    (("--host", "hots1"), "--host hots1: no such host in"),
])
def test_an_empty_selection_is_exit_2_never_a_silent_no_op(clean, args, says):
    line = error_line(clean.cli("patch", *args))
    assert says in line, line
    untouched(clean)


def test_a_playbook_that_is_not_there_is_exit_2_naming_it(clean, tmp_path):
    line = error_line(clean.cli("patch", "--all", str(tmp_path / "nope.yaml")))
    assert line == f"ddops: error: {tmp_path / 'nope.yaml'}: no such file"
    untouched(clean)


# -- a host's files are bad: that host fails, alone, and nothing is written to it ---------------------------------


def test_a_playbook_naming_a_missing_file_fails_every_host_and_writes_nothing(clean, tmp_path):
    path = playbook(tmp_path, TEXT_PATCH.replace("[dflash.py]", "[dflash.py, 'not;here $(touch x).py']"))
    proc = clean.cli("--json", "patch", "--all", str(path))
    assert proc.returncode == 1
    for h in one_json(proc)["hosts"]:
        assert h["status"] == "drifted"
        assert h["message"] == ("nothing written: not;here $(touch x).py: t drifted: not;here $(touch x).py: "
                                "no such file in the repo (removed or renamed upstream?)")
    untouched(clean)


def test_a_target_with_a_syntax_error_fails_that_host_only_naming_file_and_line(clean):
    bad = clean.repo("host1") / "ddtree.py"
    lines = bad.read_text().count("\n")
    bad.write_text(bad.read_text() + "def broken(:\n")
    results = clean.patch()
    assert host_statuses(results) == {"host1": "failed", "host2": "changed"}, messages(results)
    assert f"ddtree.py: hybrid-cache error: ddtree.py:{lines + 1}:1: syntax error" in results["host1"].message
    assert "\n" not in results["host1"].message
    assert (clean.repo("host1") / "dflash.py").read_bytes() == (clean.seed / "dflash.py").read_bytes()
    assert not (clean.repo("host1") / ".ddops").exists()


def test_non_utf8_bytes_fail_that_host_only_naming_file_and_line(clean):
    bad = clean.repo("host2") / "dflash.py"
    lines = bad.read_bytes().count(b"\n")
    bad.write_bytes(bad.read_bytes() + b"# caf\xe9 latin-1\n")
    results = clean.patch()
    assert host_statuses(results) == {"host1": "changed", "host2": "failed"}, messages(results)
    assert f"dflash.py:{lines + 1}: not valid UTF-8" in results["host2"].message
    assert (clean.repo("host2") / "ddtree.py").read_bytes() == (clean.seed / "ddtree.py").read_bytes()
    assert not (clean.repo("host2") / ".ddops").exists()


def to_tabs(text: str) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        out.append("\t" * (indent // 4) + " " * (indent % 4) + stripped)
    return "".join(out)


def test_crlf_line_endings_and_tab_indentation_are_kept_by_patch_and_rollback(clean):
    crlf, tabs = clean.repo("host1"), clean.repo("host2")
    for f in FILES:
        (crlf / f).write_bytes((clean.seed / f).read_bytes().replace(b"\n", b"\r\n"))
        (tabs / f).write_text(to_tabs((clean.seed / f).read_text()))
        compile((tabs / f).read_bytes(), f, "exec")
    before = {(h, f): (clean.repo(h) / f).read_bytes() for h in ("host1", "host2") for f in FILES}
    results = clean.patch()
    assert host_statuses(results) == {"host1": "changed", "host2": "changed"}, messages(results)
    for f in FILES:
        patched = (crlf / f).read_bytes()
        assert patched != before[("host1", f)]
        assert re.search(rb"(?<!\r)\n", patched) is None, f"{f}: a bare LF in a CRLF file"
        compile(patched, f, "exec")
        patched = (tabs / f).read_text()
        assert not [line for line in patched.splitlines() if line.startswith("    ")], f"{f}: space indentation"
        compile(patched, f, "exec")
    assert host_statuses(clean.rollback()) == {"host1": "changed", "host2": "changed"}
    assert {(h, f): (clean.repo(h) / f).read_bytes() for h in ("host1", "host2") for f in FILES} == before


def test_a_symlinked_target_is_refused_and_neither_link_nor_target_changes(clean):
    repo = clean.repo("host1")
    (repo / "dflash.py").rename(repo / "dflash-real.py")
    (repo / "dflash.py").symlink_to("dflash-real.py")
    results = clean.patch()
    assert host_statuses(results) == {"host1": "failed", "host2": "changed"}, messages(results)
    assert "dflash.py: refusing dflash.py: it is a symlink (ddops never writes through symlinks)" \
        in results["host1"].message, results["host1"].message
    assert (repo / "dflash.py").is_symlink() and os.readlink(repo / "dflash.py") == "dflash-real.py"
    assert (repo / "dflash-real.py").read_bytes() == (clean.seed / "dflash.py").read_bytes()
    assert (repo / "ddtree.py").read_bytes() == (clean.seed / "ddtree.py").read_bytes()
    assert not (repo / ".ddops").exists()


def test_a_symlinked_directory_leading_out_of_the_repo_is_refused(clean, tmp_path):
    from ddops.patching.playbook import load_playbooks
    from ddops.tasks.patch import patch_host

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dflash.py").write_bytes((clean.seed / "dflash.py").read_bytes())
    (clean.repo("host1") / "vendor").symlink_to(outside)
    books = load_playbooks([str(playbook(tmp_path, TEXT_PATCH.replace("[dflash.py]", "[vendor/dflash.py]")))])
    result = clean.run(lambda h, s: patch_host(h, s, books, planner=clean.planner), clean.hosts("host1"))["host1"]
    assert result.status == "failed"
    assert "vendor/dflash.py: refusing path 'vendor/dflash.py': it resolves outside the repo" in result.message
    assert (outside / "dflash.py").read_bytes() == (clean.seed / "dflash.py").read_bytes()
    assert not (clean.repo("host1") / ".ddops").exists()


def test_a_5_mb_python_file_and_one_over_16_mib_fail_their_host_quickly_naming_the_file(clean):
    big = clean.repo("host1") / "dflash.py"
    big.write_bytes(big.read_bytes() + b"DATA = [\n" + b"    1,\n" * 750_000 + b"]\n")  # 5.3 MB of code
    huge = clean.repo("host2") / "dflash.py"
    huge.write_bytes(huge.read_bytes() + b"#" * (17 << 20) + b"\n")
    started = time.monotonic()
    results = clean.patch()
    assert time.monotonic() - started < 30  # libcst would need minutes for the 5 MB file
    assert host_statuses(results) == {"host1": "failed", "host2": "failed"}, messages(results)
    assert re.search(r"dflash\.py: \d+ bytes, over the 1048576 byte limit for Python transforms",
                     results["host1"].message), results["host1"].message
    assert results["host2"].message.startswith("dflash.py: dflash.py is 17"), results["host2"].message
    assert "over the 16777216 byte limit" in results["host2"].message
    for h in ("host1", "host2"):
        assert (clean.repo(h) / "ddtree.py").read_bytes() == (clean.seed / "ddtree.py").read_bytes()
        assert not (clean.repo(h) / ".ddops").exists()
