"""`ddops exec`'s pure core: the remote command line and its quoting, sudo refusals, results, grouping."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ddops.errors import UsageError
from ddops.inventory import Host
from ddops.tasks.adhoc import (MAX_LINE_CHARS, STOP_LINE, ExecOutput, ExecSpec, LineSplitter, group_outputs,
                               guard_source, outcome_of, remote_command, sudo_refusal, timed_out, with_watchdog)
from tests.conftest import wait_until

ROOT = Host(name="a", address="127.0.0.2", repo="/root/my repo", command_timeout=120.0)
USER = Host(name="b", address="127.0.0.3", user="alice", repo="/home/alice/ddtree")


def words_after_timeout(line: str) -> list[str]:
    """What the host's shell would run as argv once `exec` and the guard (`PYTHON -S -c SOURCE T K`) are taken
    off; sudo, which runs the guard, stays in front."""
    words = shlex.split(line.split(" && ", 1)[1] if line.startswith("cd ") else line)
    assert words[0] == "exec", words
    sudo = words[1:4] if words[1] == "sudo" else []
    guard = words[1 + len(sudo):]
    assert guard[1:3] == ["-S", "-c"] and guard[3] == guard_source(), guard[:3]
    return sudo + guard[6:]


def test_each_argv_word_stays_one_argument_however_hostile():
    hostile = ("echo", "; touch /tmp/pwned", "$(id)", "`id`", "a'b\"c", "*", "", "x\ny")
    line = remote_command(ExecSpec(argv=hostile), ROOT)
    assert words_after_timeout(line) == list(hostile)


def test_hostile_words_reach_a_real_shell_as_plain_arguments(tmp_path):
    marker = tmp_path / "pwned"
    argv = ("printf", "%s\\n", f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", "$HOME")
    line = remote_command(ExecSpec(argv=argv), ROOT)
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == list(argv[2:])
    assert not marker.exists()


def test_a_shell_line_is_quoted_whole_and_run_by_the_users_shell():
    line = remote_command(ExecSpec(shell="ls | wc -l; echo 'done'"), ROOT)
    assert line.startswith('exec "$(command -v python3 || echo python3)" -S -c ')
    assert shlex.split(line)[5:7] == ["120", "5"]  # the guard's timeout and grace
    assert '"${SHELL:-/bin/sh}" -c ' + shlex.quote("ls | wc -l; echo 'done'") in line


def test_in_repo_changes_to_the_quoted_repo_first():
    line = remote_command(ExecSpec(argv=("pwd",), in_repo=True), ROOT)
    assert line.startswith(f"cd {shlex.quote('/root/my repo')} && exec ")


def test_timeout_defaults_to_the_hosts_command_timeout_and_can_be_set():
    assert " 120 5 true" in remote_command(ExecSpec(argv=("true",)), ROOT)
    assert " 2.5 5 true" in remote_command(ExecSpec(argv=("true",), timeout=2.5), ROOT)


def test_sudo_is_non_interactive_and_only_where_the_user_is_not_root():
    assert words_after_timeout(remote_command(ExecSpec(argv=("id",), sudo=True), ROOT)) == ["id"]
    line = remote_command(ExecSpec(argv=("id", "-u"), sudo=True), USER)
    assert words_after_timeout(line) == ["sudo", "-n", "--", "id", "-u"]
    shell = remote_command(ExecSpec(shell="id | cat", sudo=True), USER)
    assert shell.startswith("exec sudo -n -- ") and " \"${SHELL:-/bin/sh}\" -c 'id | cat'" in shell


def test_sudo_with_in_repo_changes_directory_under_sudo(tmp_path):
    line = remote_command(ExecSpec(argv=("ls", "a b"), sudo=True, in_repo=True), USER)
    words = words_after_timeout(line)
    assert words[:5] == ["sudo", "-n", "--", "sh", "-c"]
    # The script sudo runs: cd to its first argument, then the command, each word still one argument.
    script, name, repo, *argv = words[5:]
    assert (name, repo, argv) == ("ddops-exec", "/home/alice/ddtree", ["ls", "a b"])
    (tmp_path / "a b").write_text("")
    out = subprocess.run(["sh", "-c", script, name, str(tmp_path), "ls", "a b"], capture_output=True, text=True)
    assert out.stdout == "a b\n"


def test_a_command_and_a_shell_line_together_or_neither_is_a_usage_error():
    for kwargs in ({}, {"argv": ("ls",), "shell": "ls"}, {"shell": "  "}, {"argv": ("ls",), "timeout": 0}):
        with pytest.raises(UsageError):
            ExecSpec(**kwargs)


def test_sudo_wanting_a_password_is_refused_in_one_clear_line():
    spec = ExecSpec(argv=("id",), sudo=True)
    why = sudo_refusal(spec, USER, 1, "sudo: a password is required\n")
    assert why and "wants a password for alice" in why and "sudo -n" in why and why.startswith("--sudo: ")
    status, message = outcome_of(spec, USER, ExecOutput(1, "", "sudo: a password is required\n"))
    assert (status, message) == ("failed", why)


def test_missing_sudo_is_named_and_a_commands_own_failure_is_not_blamed_on_sudo():
    spec = ExecSpec(argv=("id",), sudo=True)
    missing = "sh: 1: exec: sudo: not found\n"
    assert "not installed" in (sudo_refusal(spec, USER, 127, missing) or "")
    assert sudo_refusal(spec, USER, 1, "grep: x: No such file\n") is None
    assert sudo_refusal(spec, ROOT, 1, "sudo: a password is required\n") is None  # root never goes through sudo
    assert sudo_refusal(ExecSpec(argv=("id",)), USER, 1, "sudo: a password is required\n") is None


def test_outcome_is_ok_on_exit_zero_and_failed_with_the_last_stderr_line_otherwise():
    spec = ExecSpec(argv=("x",))
    assert outcome_of(spec, ROOT, ExecOutput(0, "hi\n", "")) == ("ok", "exit 0")
    assert outcome_of(spec, ROOT, ExecOutput(3, "", "first\nlast words\n\n")) == ("failed", "exit 3: last words")
    assert outcome_of(spec, ROOT, ExecOutput(2, "", "")) == ("failed", "exit 2")
    missing = "ddops: failed to run command 'nvidia-smi': No such file or directory\n"
    assert outcome_of(spec, ROOT, ExecOutput(127, "", missing)) == ("failed", "exit 127: nvidia-smi: command not found")


def test_timeout_is_told_apart_from_a_command_that_exits_124_on_its_own():
    assert timed_out(124, 2.01, 2.0)
    assert timed_out(137, 7.5, 2.0)
    assert not timed_out(124, 0.1, 2.0)
    assert not timed_out(1, 5.0, 2.0)
    spec = ExecSpec(argv=("sleep", "9"), timeout=2)
    assert outcome_of(spec, ROOT, ExecOutput(124, "", "", timed_out=True)) == (
        "failed", "timed out after 2s (ended on the host)")


def test_hosts_with_identical_output_and_exit_code_are_grouped_biggest_first():
    same = ExecOutput(0, "3.11\n", "")
    groups = group_outputs({"a": ExecOutput(0, "3.10\n", ""), "b": same, "c": same,
                            "d": ExecOutput(1, "3.11\n", ""), "e": same})
    assert [(g.hosts, g.output.stdout, g.output.exit_code) for g in groups] == [
        (("b", "c", "e"), "3.11\n", 0), (("a",), "3.10\n", 0), (("d",), "3.11\n", 1)]


def test_line_splitter_keeps_partial_lines_and_split_characters_until_complete():
    split = LineSplitter()
    euro = "€".encode()
    assert split.feed(b"one\ntw") == ["one"]
    assert split.feed(b"o " + euro[:1]) == []
    assert split.feed(euro[1:] + b"\nthree") == ["two €"]
    assert split.flush() == ["three"]
    assert split.flush() == []


def test_a_line_that_never_ends_is_handed_on_in_pieces_and_never_held_whole():
    # Output without newlines used to be held until its end: 100 MB from each of 3 hosts took 4 GB and minutes.
    split = LineSplitter()
    pieces = split.feed(b"x" * (3 * MAX_LINE_CHARS + 5))
    assert [len(p) for p in pieces] == [MAX_LINE_CHARS] * 3
    assert split.feed(b"y\nz") == ["xxxxxy"] and split.flush() == ["z"]


def test_exec_output_json_names_exit_code_both_streams_and_the_command_line():
    assert ExecOutput(4, "o", "e", timed_out=False, truncated=True, command="exec true").to_json() == {
        "exit_code": 4, "stdout": "o", "stderr": "e", "timed_out": False, "truncated": True, "command": "exec true"}


def test_in_repo_with_a_repo_under_home_lets_the_hosts_shell_expand_the_tilde(tmp_path):
    (tmp_path / "my repo").mkdir()
    for spec in (ExecSpec(argv=("pwd",), in_repo=True), ExecSpec(argv=("pwd",), in_repo=True, sudo=True)):
        host = Host(name="c", address="127.0.0.4", user="alice", repo="~/my repo")
        line = remote_command(spec, host).replace("exec sudo -n -- ", "exec ")  # no sudo here: the cd is the point
        out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, env={"HOME": str(tmp_path),
                                                                                       "PATH": "/usr/bin:/bin"})
        assert out.stdout.strip() == str(tmp_path / "my repo"), (line, out.stderr)


def test_shell_path_quotes_everything_but_a_leading_tilde():
    from ddops.tasks.base import shell_path

    assert shell_path("~/a b") == "~/'a b'" and shell_path("~") == "~" and shell_path("~bob/x") == "~bob/x"
    assert shell_path("/root/ddtree") == "/root/ddtree" and shell_path("~$(id)/x") == "'~$(id)/x'"


def _watched(line: str) -> subprocess.Popen:
    """The exec line with its watchdog, run as sshd runs it: in a session of its own, stdin a pipe."""
    return subprocess.Popen(["setsid", "sh", "-c", with_watchdog(line)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_stop_line_ends_the_commands_whole_process_group_on_the_host():
    proc = _watched("sh -c 'sleep 300 & sleep 301; wait'")
    proc.stdin.write(STOP_LINE)
    proc.stdin.close()
    assert proc.wait(timeout=30) == -15  # ended by TERM, with the children in its group


def test_stdin_closing_without_the_stop_line_leaves_the_command_running():
    proc = _watched("sh -c 'read -r x || true; echo finished'")  # the command reads /dev/null, as before
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0 and proc.stdout.read() == b"finished\n"


def sleeping(seconds: str) -> list[str]:
    """Pids of live `sleep SECONDS` processes (SECONDS made unique by the test: no other process's)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == f"sleep\0{seconds}\0".encode() and \
                    (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_the_stop_line_ends_a_command_that_ignores_term_through_the_guard():
    # The command runs in a session of its own under the guard: the watchdog's TERM reaches the guard, which ends
    # the command's group, TERM then KILL, and exits 128+15 itself (a KILL from the watchdog could not reach it).
    seconds = f"300.{os.getpid()}"  # no other process's, not even an earlier run's
    proc = _watched(remote_command(ExecSpec(shell=f"trap '' TERM; sleep {seconds}", timeout=60), ROOT))
    wait_until(lambda: sleeping(seconds), timeout=30)  # Ctrl-C once the command runs
    proc.stdin.write(STOP_LINE)
    proc.stdin.close()
    assert proc.wait(timeout=60) == 143
    assert sleeping(seconds) == []


def test_a_background_process_holding_the_output_is_ended_at_the_timeout_and_the_output_closes():
    # `sleep & echo hi`: the shell exits at once, the sleep keeps the session's output open. The guard used to
    # return with the shell and leave the sleep holding the channel until the controller gave up, 18 s later.
    seconds = f"321.{os.getpid()}"
    proc = _watched(remote_command(ExecSpec(shell=f"sleep {seconds} & echo hi", timeout=1), ROOT))
    out, _ = proc.communicate(timeout=60)  # until the output closes
    assert (proc.returncode, out) == (124, b"hi\n")
    assert sleeping(seconds) == []


def test_a_background_process_that_let_go_of_the_output_is_left_running_as_ssh_leaves_it():
    seconds = f"322.{os.getpid()}"
    proc = _watched(remote_command(ExecSpec(shell=f"sleep {seconds} >/dev/null 2>&1 & echo hi", timeout=60), ROOT))
    try:
        out, _ = proc.communicate(timeout=30)
        assert (proc.returncode, out) == (0, b"hi\n") and sleeping(seconds)
    finally:
        for pid in sleeping(seconds):
            os.kill(int(pid), 9)
