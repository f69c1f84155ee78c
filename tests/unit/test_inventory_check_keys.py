"""`inventory check` refuses a missing identity_file as every connecting command does (same line, exit 2), before
anything is dialled; a local host names no key and is not asked for one."""

from __future__ import annotations

from tests.conftest import run_ddops


def test_inventory_check_refuses_a_missing_identity_file_in_the_line_ping_gives(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    missing = tmp_path / "no-such-key"
    inventory.write_text(f"ssh_config: /dev/null\ndefaults:\n  identity_file: {missing}\n"
                         "hosts:\n  gpu1: {address: 127.0.0.1, port: 1}\n")
    check = run_ddops("inventory", "check", inventory=inventory)
    ping = run_ddops("ping", "--all", inventory=inventory)
    line = f"ddops: error: {inventory}:3: defaults.identity_file: {missing} does not exist"
    assert (check.returncode, ping.returncode) == (2, 2)
    assert check.stderr.strip() == line == ping.stderr.strip()


def test_a_local_host_needs_no_key_file(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  laptop: {{connection: local, repo: {tmp_path}}}\n")
    check = run_ddops("inventory", "check", inventory=inventory)
    assert check.returncode == 0, check.stderr
