"""The host agent, driven exactly as the transport drives it: the bootstrap, with the bundle + request on stdin."""

from __future__ import annotations

import ast
import base64
import fcntl
import glob
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.transport.agent import AgentProgram, agent_program, build_program, remote_dir

ORIGINAL = b"past_key_values_target = DynamicCache()\n"
PATCHED = b"past_key_values_target = DynamicCache(config=model.config)\n"
PATCHED_AGAIN = b"past_key_values_target = DynamicCache(config=model.config)  # twice\n"
ACTOR = "alice@laptop"


def sha(data: bytes) -> str:
    """Hex sha256, as the agent names contents."""
    return hashlib.sha256(data).hexdigest()


def run_agent(verb: str, payload: dict, *, python: str = sys.executable, program: AgentProgram | None = None) -> dict:
    """The agent's whole response document; the process must print one JSON line and exit 0."""
    program = agent_program() if program is None else program
    request = json.dumps({"verb": verb, "payload": payload}).encode()
    done = subprocess.run(program.argv(python, cache=False), input=program.bundle + request,
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0])


def ok(verb: str, payload: dict, **kwargs) -> dict:
    """The result of a verb that must succeed."""
    response = run_agent(verb, payload, **kwargs)
    assert response["ok"], response
    return response["result"]


def fails(verb: str, payload: dict, **kwargs) -> dict:
    """The error of a verb that must fail."""
    response = run_agent(verb, payload, **kwargs)
    assert not response["ok"], response
    return response["error"]


def change(path: str, before: bytes, after: bytes, patch_ids=("hybrid-cache",)) -> dict:
    """One commit change, as the controller sends it."""
    return {"path": path, "patch_ids": list(patch_ids), "expected_sha256": sha(before),
            "new_content_b64": base64.b64encode(after).decode(), "new_sha256": sha(after)}


def commit_payload(repo: Path, *changes: dict, checks=(), lock_timeout=2) -> dict:
    """A commit request for `repo`."""
    return {"repo": str(repo), "actor": ACTOR, "ddops_version": "0.1.0", "changes": list(changes),
            "post_checks": list(checks), "lock_timeout": lock_timeout}


def rollback_payload(repo: Path, path: str, expected: bytes, restore: bytes, force=False) -> dict:
    """A rollback request restoring `path` to `restore`, believing it holds `expected`."""
    return {"repo": str(repo), "actor": ACTOR, "ddops_version": "0.1.0", "lock_timeout": 2,
            "restores": [{"path": path, "patch_ids": ["hybrid-cache"], "expected_sha256": sha(expected),
                          "restore_sha256": sha(restore), "force": force}]}


def journal(repo: Path) -> list[dict]:
    """The journal entries as the agent reads them."""
    return ok("journal", {"repo": str(repo)})["entries"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A DDTree-shaped repo with a git directory, holding ddtree.py = ORIGINAL."""
    root = tmp_path / "ddtree"
    (root / ".git" / "info").mkdir(parents=True)
    (root / "ddtree.py").write_bytes(ORIGINAL)
    return root


# -- snapshot ----------------------------------------------------------------------------------------------------


def test_snapshot_reports_hash_mode_size_and_content_of_each_file(repo):
    (repo / "ddtree.py").chmod(0o640)
    result = ok("snapshot", {"repo": str(repo), "files": ["ddtree.py", "absent.py"]})
    present, absent = result["files"]["ddtree.py"], result["files"]["absent.py"]
    assert present == {"exists": True, "sha256": sha(ORIGINAL), "mode": 0o640, "size": len(ORIGINAL),
                       "content_b64": base64.b64encode(ORIGINAL).decode(), "error": None}
    assert absent["exists"] is False and absent["sha256"] is None and absent["error"] is None
    assert result["journal"] == [] and result["lock"] is None and result["facts"] is None


def test_snapshot_reports_symlinked_file_as_error_kind_symlink(repo):
    (repo / "link.py").symlink_to(repo / "ddtree.py")
    record = ok("snapshot", {"repo": str(repo), "files": ["link.py"]})["files"]["link.py"]
    assert record["error"]["kind"] == "symlink" and record["content_b64"] is None


def test_snapshot_refuses_files_over_16_mib_as_too_large(repo):
    with open(repo / "weights.bin", "wb") as big:
        big.truncate(16 * 1024 * 1024 + 1)
    record = ok("snapshot", {"repo": str(repo), "files": ["weights.bin"]})["files"]["weights.bin"]
    assert record["error"]["kind"] == "too_large"


def test_snapshot_of_a_missing_repo_fails_with_no_repo(tmp_path):
    assert fails("snapshot", {"repo": str(tmp_path / "nope"), "files": ["a.py"]})["kind"] == "no_repo"


def test_snapshot_includes_facts_only_when_asked(repo):
    result = ok("snapshot", {"repo": str(repo), "files": [], "facts": True})
    assert result["facts"]["repo_exists"] is True


# -- commit ------------------------------------------------------------------------------------------------------


def test_commit_writes_new_bytes_backs_up_original_and_journals_each_patch(repo):
    payload = commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED, ["hybrid-cache", "cuda-sync"]))
    result = ok("commit", payload)
    assert result == {"written": ["ddtree.py"], "checks": [], "reverted": False}
    assert (repo / "ddtree.py").read_bytes() == PATCHED
    backup = repo / ".ddops" / "backups" / sha(ORIGINAL)
    assert backup.read_bytes() == ORIGINAL
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert stat.S_IMODE((repo / ".ddops").stat().st_mode) == 0o700
    entries = journal(repo)
    assert [(e["event"], e["patch"], e["file"]) for e in entries] == [
        ("apply", "hybrid-cache", "ddtree.py"), ("apply", "cuda-sync", "ddtree.py")]
    assert all(e["before"] == sha(ORIGINAL) and e["after"] == sha(PATCHED) for e in entries)
    assert all(e["actor"] == ACTOR and e["ddops_version"] == "0.1.0" and e["time"] for e in entries)
    assert len({e["id"] for e in entries}) == 2


def test_second_commit_keeps_the_first_backup_holding_the_original_bytes(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    first_backup = repo / ".ddops" / "backups" / sha(ORIGINAL)
    inode = first_backup.stat().st_ino
    ok("commit", commit_payload(repo, change("ddtree.py", PATCHED, PATCHED_AGAIN)))
    assert (repo / "ddtree.py").read_bytes() == PATCHED_AGAIN
    assert first_backup.read_bytes() == ORIGINAL and first_backup.stat().st_ino == inode
    assert (repo / ".ddops" / "backups" / sha(PATCHED)).read_bytes() == PATCHED


def test_commit_keeps_the_files_mode_bits(repo):
    (repo / "ddtree.py").chmod(0o751)
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    assert stat.S_IMODE((repo / "ddtree.py").stat().st_mode) == 0o751


def test_commit_conflict_writes_nothing_when_any_file_changed_since_snapshot(repo):
    (repo / "dflash.py").write_bytes(b"edited by someone\n")
    payload = commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED),
                             change("dflash.py", ORIGINAL, PATCHED))
    error = fails("commit", payload)
    assert error["kind"] == "conflict" and "dflash.py" in error["message"]
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL
    assert (repo / "dflash.py").read_bytes() == b"edited by someone\n"
    assert list((repo / ".ddops" / "backups").iterdir()) == [] and journal(repo) == []


def test_commit_reverts_to_the_original_bytes_when_a_post_check_fails(repo):
    checks = [{"name": "imports", "command": "echo checking; exit 3", "timeout": 5}]
    result = ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED), checks=checks))
    assert result["reverted"] is True and result["written"] == ["ddtree.py"]
    assert result["checks"][0]["ok"] is False and result["checks"][0]["exit_code"] == 3
    assert "checking" in result["checks"][0]["output"]
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL
    events = [(e["event"], e["before"], e["after"]) for e in journal(repo)]
    assert events == [("apply", sha(ORIGINAL), sha(PATCHED)), ("revert", sha(PATCHED), sha(ORIGINAL))]


def test_commit_runs_post_checks_in_the_repo_and_keeps_the_change_when_they_pass(repo):
    checks = [{"name": "grep", "command": "grep -q config= ddtree.py && pwd", "timeout": 5}]
    result = ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED), checks=checks))
    assert result["reverted"] is False and result["checks"][0]["ok"] is True
    assert result["checks"][0]["output"].strip() == os.path.realpath(repo)
    assert (repo / "ddtree.py").read_bytes() == PATCHED


def test_post_check_past_its_timeout_fails_and_reverts(repo):
    checks = [{"name": "slow", "command": "sleep 30", "timeout": 0.3}]
    result = ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED), checks=checks))
    check = result["checks"][0]
    assert check["ok"] is False and check["timed_out"] is True and check["exit_code"] is None
    assert result["reverted"] is True and (repo / "ddtree.py").read_bytes() == ORIGINAL


def test_a_post_checks_background_writer_is_ended_before_the_revert_and_outlives_nothing(repo):
    # The check fails, leaving a writer in the background (its output let go, so the check itself returns) that
    # waits for the revert to put the original back and then writes the file again: it used to race the revert
    # ("putting the originals back failed ... still patched") and outlive the commit.
    writer = f"sleep 0.01 # ddops-check-writer-{os.getpid()}"
    command = (f"(while ! grep -q 'DynamicCache()$' ddtree.py; do {writer}\n done; echo late >> ddtree.py) "
               ">/dev/null 2>&1 & exit 1")
    checks = [{"name": "leaves a writer", "command": command, "timeout": 30}]
    result = ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED), checks=checks))
    assert result["reverted"] is True
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL
    left = [p for p in glob.glob("/proc/[0-9]*/cmdline") if _reads(p).find(b"ddops-check-writer") >= 0]
    assert left == [], "a process of the check outlived the commit"


def _reads(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def test_commit_lists_state_dir_in_git_exclude_exactly_once(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    ok("commit", commit_payload(repo, change("ddtree.py", PATCHED, PATCHED_AGAIN)))
    lines = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert lines.count("/.ddops/") == 1


# Imported after the agent's own modules: every atomic write of dflash.py (through files.write_like) then fails.
DISK_FULL_ON_DFLASH = '''
from ddops_agent import files

_real_atomic_write = files.atomic_write


def atomic_write(path, data, mode, owner=None, durable=True):
    if path.endswith("dflash.py"):
        raise OSError(28, "No space left on device", path)
    return _real_atomic_write(path, data, mode, owner, durable)


files.atomic_write = atomic_write
'''


def test_commit_puts_back_files_already_written_when_a_later_write_fails(repo):
    (repo / "dflash.py").write_bytes(ORIGINAL)
    payload = commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED), change("dflash.py", ORIGINAL, PATCHED))
    error = fails("commit", payload, program=build_program({"ddops_agent.zz_disk_full": DISK_FULL_ON_DFLASH}))
    assert error["kind"] == "io" and "dflash.py" in error["message"]
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL and (repo / "dflash.py").read_bytes() == ORIGINAL
    assert [(e["event"], e["file"]) for e in journal(repo)] == [("apply", "ddtree.py"), ("revert", "ddtree.py")]


def test_commit_rejects_content_that_does_not_match_its_declared_hash(repo):
    bad = dict(change("ddtree.py", ORIGINAL, PATCHED), new_sha256=sha(b"other"))
    assert fails("commit", commit_payload(repo, bad))["kind"] == "bad_request"
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL


# -- lock --------------------------------------------------------------------------------------------------------


def test_commit_fails_as_locked_naming_the_holder_while_another_process_holds_the_lock(repo):
    state = repo / ".ddops"
    state.mkdir()
    info = {"user": "bob", "host": "h200-a", "pid": 4242, "since": "2024-05-01T12:00:00Z", "actor": "bob@desk"}
    (state / "lock.info").write_text(json.dumps(info))
    with open(state / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        error = fails("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED), lock_timeout=0.2))
        snapshot = ok("snapshot", {"repo": str(repo), "files": []})
    assert error["kind"] == "locked"
    assert "locked by bob@h200-a since 2024-05-01T12:00:00Z (pid 4242)" in error["message"]
    assert snapshot["lock"]["pid"] == 4242
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL


def test_lock_is_released_and_its_info_removed_after_a_commit(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    assert not (repo / ".ddops" / "lock.info").exists()
    assert ok("snapshot", {"repo": str(repo), "files": []})["lock"] is None


# -- paths -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "sub/../../x", "./ddtree.py", ".ddops/journal.jsonl",
                                  ".git/config"])
def test_commit_refuses_paths_that_are_not_plain_and_inside_the_repo(repo, path):
    error = fails("commit", commit_payload(repo, change(path, ORIGINAL, PATCHED)))
    assert error["kind"] == "unsafe_path" and path in error["message"]
    assert not (repo / ".ddops" / "backups").exists()


def test_commit_refuses_a_symlink_pointing_outside_and_leaves_its_target_alone(repo, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_bytes(ORIGINAL)
    (repo / "evil.py").symlink_to(outside)
    error = fails("commit", commit_payload(repo, change("evil.py", ORIGINAL, PATCHED)))
    assert error["kind"] == "symlink"
    assert outside.read_bytes() == ORIGINAL and (repo / "evil.py").is_symlink()


def test_commit_refuses_a_path_through_a_symlinked_directory_leading_outside(repo, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "ddtree.py").write_bytes(ORIGINAL)
    (repo / "vendor").symlink_to(tmp_path / "elsewhere")
    error = fails("commit", commit_payload(repo, change("vendor/ddtree.py", ORIGINAL, PATCHED)))
    assert error["kind"] == "unsafe_path"
    assert (tmp_path / "elsewhere" / "ddtree.py").read_bytes() == ORIGINAL


# -- rollback ----------------------------------------------------------------------------------------------------


def test_rollback_restores_the_byte_identical_original(repo):
    original = ORIGINAL + b"\x00\xffbinary tail without newline"
    (repo / "ddtree.py").write_bytes(original)
    (repo / "ddtree.py").chmod(0o700)
    ok("commit", commit_payload(repo, change("ddtree.py", original, PATCHED)))
    result = ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, original))
    assert result["restored"] == ["ddtree.py"] and result["refused"] == [] and result["saved"] == []
    assert (repo / "ddtree.py").read_bytes() == original
    assert stat.S_IMODE((repo / "ddtree.py").stat().st_mode) == 0o700
    last = journal(repo)[-1]
    assert (last["event"], last["before"], last["after"]) == ("rollback", sha(PATCHED), sha(original))


def test_rollback_refuses_when_file_was_edited_after_patch(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    edited = PATCHED + b"# local experiment\n"
    (repo / "ddtree.py").write_bytes(edited)
    result = ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL))
    assert result["restored"] == []
    assert result["refused"] == [{"path": "ddtree.py", "reason": "modified", "current_sha256": sha(edited)}]
    assert (repo / "ddtree.py").read_bytes() == edited
    assert [e["event"] for e in journal(repo)] == ["apply"]


def test_forced_rollback_saves_the_foreign_edit_then_restores_the_original(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    edited = PATCHED + b"# local experiment\n"
    (repo / "ddtree.py").write_bytes(edited)
    result = ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL, force=True))
    assert result["restored"] == ["ddtree.py"]
    assert result["saved"] == [{"path": "ddtree.py", "sha256": sha(edited)}]
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL
    assert ok("read_backup", {"repo": str(repo), "sha256": sha(edited)})["content_b64"] == \
        base64.b64encode(edited).decode()
    events = [(e["event"], e.get("sha256")) for e in journal(repo)]
    assert events == [("apply", None), ("save-foreign", sha(edited)), ("rollback", None)]


def test_rollback_with_a_missing_backup_fails_for_that_file_and_leaves_it_alone(repo):
    (repo / "ddtree.py").write_bytes(PATCHED)
    result = ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL))
    assert result["restored"] == [] and result["failed"][0]["kind"] == "no_backup"
    assert (repo / "ddtree.py").read_bytes() == PATCHED


def test_rollback_refuses_to_restore_from_a_corrupt_backup(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    (repo / ".ddops" / "backups" / sha(ORIGINAL)).write_bytes(b"bit rot\n")
    result = ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL))
    assert result["failed"][0]["kind"] == "corrupt_backup"
    assert (repo / "ddtree.py").read_bytes() == PATCHED


# -- backups and journal -----------------------------------------------------------------------------------------


def test_read_backup_returns_the_backed_up_bytes_and_rejects_names_that_are_not_hashes(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    result = ok("read_backup", {"repo": str(repo), "sha256": sha(ORIGINAL)})
    assert base64.b64decode(result["content_b64"]) == ORIGINAL and result["size"] == len(ORIGINAL)
    assert fails("read_backup", {"repo": str(repo), "sha256": "../journal.jsonl"})["kind"] == "bad_request"


def test_journal_only_grows_and_every_line_is_a_json_object(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    raw_before = (repo / ".ddops" / "journal.jsonl").read_bytes()
    ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL))
    raw_after = (repo / ".ddops" / "journal.jsonl").read_bytes()
    assert raw_after.startswith(raw_before) and len(raw_after) > len(raw_before)
    assert all(isinstance(json.loads(line), dict) for line in raw_after.splitlines())
    assert len({e["id"] for e in journal(repo)}) == 2


def test_journal_reports_corrupt_lines_and_later_entries_stay_readable(repo):
    ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED)))
    with open(repo / ".ddops" / "journal.jsonl", "ab") as torn:
        torn.write(b'{"event": "apply", "fi')  # a write cut off mid-line
    ok("commit", commit_payload(repo, change("ddtree.py", PATCHED, PATCHED_AGAIN)))
    result = ok("journal", {"repo": str(repo)})
    assert [e["after"] for e in result["entries"]] == [sha(PATCHED), sha(PATCHED_AGAIN)]
    assert [c["line"] for c in result["corrupt"]] == [2]


# -- facts and protocol ------------------------------------------------------------------------------------------


def test_facts_returns_the_documented_keys(repo):
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "init"], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    facts = ok("facts", {"repo": str(repo)})
    assert {"hostname", "os", "kernel", "python", "user", "gpus", "disk_free_bytes", "repo_exists",
            "git_commit", "versions"} <= facts.keys()
    assert facts["git_commit"] == head.strip() and facts["repo_exists"] is True
    assert isinstance(facts["gpus"], list) and facts["disk_free_bytes"] > 0
    assert set(facts["versions"]) == {"torch", "transformers"}


def test_facts_for_a_repo_not_yet_cloned_reports_free_space_of_its_parent(tmp_path):
    facts = ok("facts", {"repo": str(tmp_path / "not" / "yet")})
    assert facts["repo_exists"] is False and facts["git_commit"] is None and facts["disk_free_bytes"] > 0


def test_unknown_verbs_and_garbage_requests_are_answered_as_errors():
    assert fails("frobnicate", {})["kind"] == "unknown_verb"
    program = agent_program()
    done = subprocess.run(program.argv(sys.executable), input=program.bundle + b"not json", capture_output=True,
                          timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout)["error"]["kind"] == "bad_request"


EXTENSION = '''
from ddops_agent.protocol import shipped_bundle, verb


@verb("whoami_test")
def whoami_test(payload):
    print("stray output must not reach the JSON answer")
    bundle, bootstrap = shipped_bundle()
    return {"bundle_bytes": len(bundle), "bootstrap_lines": len(bootstrap.splitlines()), "echo": payload.get("x"),
            "file": __file__}
'''


def test_extensions_register_verbs_and_see_the_shipped_bundle():
    program = build_program({"ddops_agent.whoami_test": EXTENSION})
    result = ok("whoami_test", {"x": 7}, program=program)
    assert result == {"bundle_bytes": len(program.bundle), "bootstrap_lines": len(program.bootstrap.splitlines()),
                      "echo": 7, "file": "ddops_agent/whoami_test.py"}


FAILING_VERB = '''
import traceback

from ddops_agent.protocol import verb


@verb("traceback_test")
def traceback_test(payload):
    try:
        helper_that_fails()
    except ZeroDivisionError:
        return {"traceback": traceback.format_exc()}


def helper_that_fails():
    return 1 / 0
'''


def test_tracebacks_name_the_agent_module_file_and_show_its_source_line():
    program = build_program({"ddops_agent.traceback_test": FAILING_VERB})
    text = ok("traceback_test", {}, program=program)["traceback"]
    assert 'File "ddops_agent/traceback_test.py", line 16, in helper_that_fails' in text
    assert "return 1 / 0" in text and "<string>" not in text


def test_bootstrap_command_runs_through_a_shell(repo):
    program = agent_program()
    request = json.dumps({"verb": "journal", "payload": {"repo": str(repo)}}).encode()
    done = subprocess.run(["/bin/sh", "-c", shlex.join(program.argv(sys.executable, cache=False))],
                          input=program.bundle + request, capture_output=True, timeout=30)
    assert json.loads(done.stdout) == {"ok": True, "result": {"entries": [], "corrupt": []}}


def test_the_agent_also_runs_without_the_bootstrap_as_a_module(repo):
    request = json.dumps({"verb": "snapshot", "payload": {"repo": str(repo), "files": ["ddtree.py"]}})
    done = subprocess.run([sys.executable, "-m", "ddops_agent"], input=request.encode(), cwd=remote_dir(),
                          capture_output=True, timeout=30)
    assert json.loads(done.stdout)["result"]["files"]["ddtree.py"]["sha256"] == sha(ORIGINAL)


def test_agent_imports_nothing_but_the_standard_library_and_its_own_modules():
    for path in [remote_dir() / "bootstrap.py", *sorted((remote_dir() / "ddops_agent").glob("*.py"))]:
        tree = ast.parse(path.read_text(), feature_version=(3, 8))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names | {"ddops_agent"}, f"{path.name} imports {name}"


def oldest_python() -> str | None:
    """A Python 3.8 interpreter on this machine, if there is one."""
    candidates = [shutil.which("python3.8"), *glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 8))"],
                               capture_output=True, text=True)
        if probe.stdout.strip() == "True":
            return candidate
    return None


def test_commit_and_rollback_work_on_python_3_8(repo):
    python = oldest_python()
    if python is None:
        pytest.skip("no Python 3.8 interpreter here")
    checks = [{"name": "ok", "command": "true", "timeout": 5}]
    assert ok("commit", commit_payload(repo, change("ddtree.py", ORIGINAL, PATCHED), checks=checks),
              python=python)["written"] == ["ddtree.py"]
    assert ok("rollback", rollback_payload(repo, "ddtree.py", PATCHED, ORIGINAL), python=python)["restored"]
    assert ok("facts", {"repo": str(repo)}, python=python)["python"].startswith("3.8")
    assert (repo / "ddtree.py").read_bytes() == ORIGINAL
