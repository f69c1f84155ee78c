"""`ddops inventory import` writes what an Ansible file says as data, never as the inventory's own keys: a name or
value that would end the line it is written on is refused at its file:line, every imported name is quoted, and
secrets are named, never shown or written. Each injection point of the review (a variable's name and value, a group
name, a host name) aims at one of the keys that run or trust something (`ssh_config:` and its `Match exec`,
`known_hosts:`, `playbook_dirs:`)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.conftest import run_ddops


@pytest.fixture
def evil(tmp_path):
    """What an injected key would point at: an ssh_config whose `Match exec` touches a marker on the controller, a
    known_hosts, a playbook folder."""
    marker = tmp_path / "ran"
    config = tmp_path / "evil_ssh_config"
    config.write_text(f'Match exec "touch {marker}"\n  User x\n')
    (tmp_path / "evil_playbooks").mkdir()
    (tmp_path / "evil_known_hosts").write_text("")
    return {"marker": marker, "ssh_config": config, "known_hosts": tmp_path / "evil_known_hosts",
            "playbook_dirs": tmp_path / "evil_playbooks"}


def import_refused(tmp_path, text: str, suffix: str = "yml"):
    source = tmp_path / f"hosts.{suffix}"
    source.write_text(text)
    out = tmp_path / "inventory.yaml"
    proc = run_ddops("inventory", "import", "--ansible", str(source), "-o", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not out.exists()
    return proc, source


def q(text: str) -> str:
    """text as a YAML double-quoted scalar (newlines escaped)."""
    return json.dumps(text)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client (ssh -G runs Match exec)")
def test_a_variable_name_holding_a_newline_is_refused_at_its_line_and_no_injected_ssh_config_runs(tmp_path, evil):
    name = f"x\nssh_config: {evil['ssh_config']}\n#"
    proc, source = import_refused(tmp_path, f"all:\n  hosts:\n    gpu1:\n      {q(name)}: 1\n")
    assert f"{source}:4: a name or value holds a control character (\\n): refused" in proc.stderr
    assert not evil["marker"].exists()


def test_a_value_holding_a_newline_is_refused_at_its_line_and_names_no_known_hosts(tmp_path, evil):
    value = f"8\nknown_hosts: {evil['known_hosts']}\n#"
    proc, source = import_refused(tmp_path, f"all:\n  hosts:\n    gpu1:\n      gpu_count: {q(value)}\n")
    assert f"{source}:4: a name or value holds a control character (\\n)" in proc.stderr


def test_a_group_name_holding_a_newline_is_refused_at_its_line_and_adds_no_playbook_dirs(tmp_path, evil):
    group = f"x\nplaybook_dirs: [{evil['playbook_dirs']}]\n#"
    proc, source = import_refused(tmp_path, f"all:\n  hosts:\n    gpu1: {{}}\n  children:\n    {q(group)}: {{}}\n")
    assert f"{source}:5: a name or value holds a control character (\\n)" in proc.stderr


def test_a_host_name_holding_a_newline_is_refused_at_its_line_and_adds_no_ssh_config(tmp_path, evil):
    host = f"h\nssh_config: {evil['ssh_config']}\n#"
    proc, source = import_refused(tmp_path, f"all:\n  hosts:\n    gpu1: {{}}\n    {q(host)}: {{}}\n")
    assert f"{source}:4: a name or value holds a control character (\\n)" in proc.stderr
    assert not evil["marker"].exists()


@pytest.mark.parametrize("character", ["\x1b", "\x85", "\u2028", "\x00"])
def test_an_ini_line_holding_a_control_character_is_refused_at_its_line(tmp_path, character):
    proc, source = import_refused(tmp_path, f"[h200]\ngpu1 ansible_user=ops\ngpu2 note=a{character}b\n", "ini")
    assert f"{source}:3: a name or value holds a control character ({ascii(character)[1:-1]})" in proc.stderr


def test_a_group_name_that_is_yaml_syntax_is_not_imported_and_sets_nothing(tmp_path):
    # No control character: `h200: {user: nobody} #` written bare as a key gave group h200 `user: nobody`.
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    'h200: {user: nobody} #':\n      hosts: {gpu1: {}}\n      vars: {ansible_user: ops}\n")
    out = tmp_path / "inventory.yaml"
    proc = run_ddops("inventory", "import", "--ansible", str(tmp_path / "hosts.yml"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "not imported: group h200: {user: nobody} #: not imported (ddops group names" in proc.stdout
    doc = yaml.safe_load(out.read_text())
    assert doc["hosts"] == {"gpu1": {}} and "groups" not in doc and "nobody" not in json.dumps(doc)


def test_every_imported_name_is_written_quoted(tmp_path):
    (tmp_path / "hosts.ini").write_text("[h200]\ngpu1 ansible_user=ops\n[h200:vars]\nansible_port=2222\n")
    out = tmp_path / "inventory.yaml"
    assert run_ddops("inventory", "import", "--ansible", str(tmp_path / "hosts.ini"), "-o", str(out)).returncode == 0
    text = out.read_text()
    assert '  "h200": {port: 2222}' in text and '  "gpu1": {user: "ops", groups: ["h200"]}' in text


SECRETS = {"ansible_ssh_pass": "hunter2-ssh", "ansible_become_pass": "hunter2-become",
           "ansible_password": "hunter2-password", "ansible_become_password": "hunter2-become-password",
           "vault_token": "hunter2-token"}


@pytest.mark.parametrize("json_out", [False, True])
def test_secrets_are_named_never_shown_nor_written(tmp_path, json_out):
    host_vars = " ".join(f"{k}={v}" for k, v in SECRETS.items())
    (tmp_path / "hosts.ini").write_text(f"[h200]\ngpu1 ansible_user=ops {host_vars}\n[all:vars]\n"
                                        "ansible_become_pass=hunter2-all\n")
    out = tmp_path / "inventory.yaml"
    proc = run_ddops(*(["--json"] if json_out else []), "inventory", "import", "--ansible",
                     str(tmp_path / "hosts.ini"), "-o", str(out), "-v")
    assert proc.returncode == 0, proc.stderr
    written = out.read_text()
    for where in (proc.stdout, proc.stderr, written):
        assert "hunter2" not in where
    for name in SECRETS:
        assert f"host gpu1: {name} (a secret: its value is neither shown nor written" in written
        assert f"host gpu1: {name} (a secret" in proc.stdout
    assert "group all: ansible_become_pass (a secret" in written
