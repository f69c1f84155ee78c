"""`ddops exec --sudo` as a user who is not root, on real sshd hosts with real sudo.

The login user exists only inside each testbed host's mount namespace: its /etc/passwd, /etc/group, /etc/shadow and
/etc/sudoers are bind-mounted there (nsenter), so this machine's own accounts and sudoers are never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import _fresh_prefix, host_processes, requires_sshd, run_ddops_json

pytestmark = [pytest.mark.sshd, requires_sshd]

USER, UID = "ddops-user", 4242
SUDOERS = {  # host -> the user's sudoers rule there
    "host1": f"{USER} ALL=(ALL) NOPASSWD: ALL",
    "host2": f"{USER} ALL=(ALL) ALL",  # sudo wants a password
}


def _give_host_a_user(host, rule: str | None) -> None:
    """USER in the host's namespace only, with `rule` in its sudoers."""
    hdir = Path(host.dir)
    files = {
        "passwd": Path("/etc/passwd").read_text() + f"{USER}:x:{UID}:{UID}:ddops test user:/tmp:/bin/sh\n",
        "group": Path("/etc/group").read_text() + f"{USER}:x:{UID}:\n",
        # "*": no password can ever match; the account itself is valid (sudo's PAM account check reads this).
        "shadow": Path("/etc/shadow").read_text() + f"{USER}:*:19000:0:99999:7:::\n",
        "sudoers": "Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n" + (rule + "\n" if rule else ""),
    }
    for name, text in files.items():
        path = hdir / f"etc-{name}"
        path.write_text(text)
        path.chmod(0o440 if name == "sudoers" else 0o640 if name == "shadow" else 0o644)
        subprocess.run(["nsenter", f"--mount=/proc/{host.pid()}/ns/mnt", "mount", "--bind", str(path),
                        f"/etc/{name}"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def user_bed():
    if shutil.which("sudo") is None or shutil.which("nsenter") is None:
        pytest.fail("sudo and nsenter are needed (scripts/setup installs them)")
    from ddops import testbed as tb

    # Not under pytest's 0700 temp dirs: sshd reads the authorized key as the login user, who must reach it.
    parent = tempfile.mkdtemp(prefix="ddops-sudo-")
    os.chmod(parent, 0o711)
    root = Path(parent) / "bed"
    bed = tb.up(3, root=root, address_prefix=_fresh_prefix())
    try:
        os.chmod(root, 0o711)
        for host in bed.hosts:
            _give_host_a_user(host, SUDOERS.get(host.name))
        inventory = root / "user.yaml"
        text = bed.inventory_path.read_text().replace("  user: root\n", f"  user: {USER}\n")
        if Path("/usr/bin/python3").exists():
            # The testbed's python is the controller's, which may live where the login user cannot reach (a
            # pyenv under /root); exec's guard runs with the host's python.
            text = re.sub(r"(?m)^  python: .*$", '  python: "/usr/bin/python3"', text)
        inventory.write_text(text)
        yield bed, inventory
    finally:
        os.chmod(root, 0o700)  # `down` trusts only a root closed to others, as `up` made it
        tb.down(root)
        shutil.rmtree(parent, ignore_errors=True)


def exec_json(inventory: Path, *args: str) -> tuple[int, dict]:
    return run_ddops_json("exec", *args, inventory=inventory)


def test_the_login_user_is_not_root(user_bed):
    _, inventory = user_bed
    code, doc = exec_json(inventory, "--all", "--", "id", "-u")
    assert code == 0 and {h["data"]["stdout"] for h in doc["hosts"]} == {f"{UID}\n"}


def test_sudo_runs_as_root_where_allowed_and_is_refused_clearly_where_it_wants_a_password(user_bed):
    _, inventory = user_bed
    code, doc = exec_json(inventory, "--all", "--sudo", "--timeout", "20", "--", "id", "-u")
    assert code == 1
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert by_host["host1"]["status"] == "ok" and by_host["host1"]["data"]["stdout"] == "0\n"
    assert by_host["host2"]["status"] == "failed"
    assert "sudo wants a password for ddops-user" in by_host["host2"]["message"]
    assert "sudo -n" in by_host["host2"]["message"]
    # Not in sudoers at all: sudo's own reason, still without a prompt (the run did not hang: timeout 20s).
    assert by_host["host3"]["status"] == "failed" and "--sudo:" in by_host["host3"]["message"]


def test_sudo_in_repo_enters_a_repo_the_user_cannot(user_bed):
    bed, inventory = user_bed
    code, doc = exec_json(inventory, "--host", "host1", "--in-repo", "--", "pwd")
    assert code == 1  # /root is closed to the login user
    code, doc = exec_json(inventory, "--host", "host1", "--sudo", "--in-repo", "--shell", "pwd; id -un")
    assert code == 0, doc
    assert doc["hosts"][0]["data"]["stdout"] == f"{bed.repo_path}\nroot\n"


def test_a_root_command_that_ignores_term_is_killed_at_its_timeout_from_inside_sudo(user_bed):
    bed, inventory = user_bed
    code, doc = exec_json(inventory, "--host", "host1", "--sudo", "--timeout", "1", "--shell",
                          "trap '' TERM; sleep 300.75")
    [entry] = doc["hosts"]
    assert code == 1 and entry["data"]["timed_out"] is True, entry
    assert entry["message"] == "timed out after 1s (ended on the host)"
    left = []
    for pid in host_processes(bed, "host1"):
        try:
            if b"sleep\x00300.75" in Path(f"/proc/{pid}/cmdline").read_bytes():
                left.append(pid)
        except OSError:
            continue
    assert left == [], "the root command outlived its timeout"
