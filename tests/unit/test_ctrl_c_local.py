"""Ctrl-C on `ddops exec` against a `connection: local` host: the command is ended on this machine at once (its
own process group included), as it is on a host over SSH."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT, as_at_a_terminal, exited, wait_until


def test_ctrl_c_ends_a_local_hosts_command_and_its_process_group(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"ssh_config: /dev/null\nknown_hosts: {tmp_path / 'known_hosts'}\n"
                         f"hosts:\n  here: {{connection: local, repo: {json.dumps(str(tmp_path))}}}\n")
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-m", "ddops", "-i", str(inventory), "exec", "--all", "--json", "--",
                             "sh", "-c", f"echo $$ > {pidfile}; exec sleep 3004"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "SSH_AUTH_SOCK": ""}, preexec_fn=as_at_a_terminal)
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=60)
        pid = int(pidfile.read_text())
        wait_until(lambda: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"), timeout=30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    doc = json.loads(out)
    assert proc.returncode == 130 and doc["interrupted"] and doc["hosts"][0]["interrupted"] == "cancelled"
    wait_until(lambda: exited(pid), timeout=30)
