"""`ddops inventory import` from real Ansible inventories (INI and YAML, written here: Ansible need not be installed)
and a real ssh_config with Include and Match (resolved as `ssh -G` resolves it), and `ddops inventory init`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ddops.inventory import HOST_KEYS, TOP_KEYS, load_inventory
from ddops.inventory_import import starter_inventory
from tests.conftest import run_ddops

ANSIBLE_INI = """\
# the lab's inventory
bastion ansible_host=bastion.lab.example ansible_user=jump

[h200]
gpu[01:03].lab ansible_user=ubuntu
gpu-x:2200 ansible_host=10.9.0.9 ansible_become=yes

[h200:vars]
ansible_ssh_private_key_file=~/.ssh/lab_ed25519
ansible_ssh_common_args='-o ProxyCommand="ssh -W %h:%p -q jump@bastion" -o StrictHostKeyChecking=no'
cuda_visible=0,1

[slurm]
login1 ansible_host=login.hpc.example ansible_port=2222

[gpus:children]
h200
slurm

[all:vars]
ansible_python_interpreter=/usr/bin/python3
"""

ANSIBLE_YAML = """\
all:
  vars:
    ansible_user: ops
  hosts:
    bastion: {ansible_host: bastion.lab.example}
  children:
    gpus:
      vars:
        ansible_ssh_common_args: -J ops@bastion
      children:
        h200:
          hosts:
            node[a:b]:
              ansible_port: 2201
            node-z:
              ansible_host: 10.9.0.30
              ansible_connection: local
              gpu_count: 8
            win1: {ansible_connection: winrm}
          vars:
            ansible_ssh_private_key_file: ~/.ssh/h200
"""


def imported(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    out = tmp_path / "inventory.yaml"
    proc = run_ddops("inventory", "import", *args, "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, yaml.safe_load(out.read_text()), out


def test_an_ansible_ini_inventory_becomes_hosts_groups_and_defaults_and_the_rest_is_reported(tmp_path):
    (tmp_path / "hosts.ini").write_text(ANSIBLE_INI)
    proc, doc, out = imported(tmp_path, "--ansible", str(tmp_path / "hosts.ini"))
    hosts = doc["hosts"]
    assert list(hosts) == ["bastion", "gpu01.lab", "gpu02.lab", "gpu03.lab", "gpu-x", "login1"]
    assert hosts["gpu02.lab"] == {"user": "ubuntu", "groups": ["h200", "gpus"]}
    assert hosts["gpu-x"] == {"address": "10.9.0.9", "port": 2200, "groups": ["h200", "gpus"]}
    assert hosts["login1"] == {"address": "login.hpc.example", "port": 2222, "groups": ["slurm", "gpus"]}
    assert doc["groups"]["h200"] == {"identity_file": "~/.ssh/lab_ed25519", "proxy_jump": "jump@bastion"}
    assert doc["defaults"] == {"python": "/usr/bin/python3"}
    for note in ("host gpu-x: ansible_become=yes", "group h200: cuda_visible=0,1",
                 "group h200: ansible_ssh_common_args: -o StrictHostKeyChecking=no"):
        assert f"not imported: {note}" in proc.stdout
        assert note in out.read_text()  # kept in the file, as comments
    inventory = load_inventory(out)
    assert inventory.host("gpu01.lab").proxy_jump == "jump@bastion" and inventory.host("gpu01.lab").user == "ubuntu"
    home = tmp_path / "home"  # check finds the key files it names, as ping does: there, the imported one is
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "lab_ed25519").write_text("a key\n")
    check = run_ddops("inventory", "check", inventory=out, env={"HOME": str(home)})
    assert check.returncode == 0, check.stderr


def test_an_ansible_yaml_inventory_with_nested_children_and_ranges_is_imported(tmp_path):
    (tmp_path / "hosts.yml").write_text(ANSIBLE_YAML)
    proc, doc, out = imported(tmp_path, "--ansible", str(tmp_path / "hosts.yml"))
    assert doc["defaults"] == {"user": "ops"}
    assert doc["groups"] == {"gpus": {"proxy_jump": "ops@bastion"}, "h200": {"identity_file": "~/.ssh/h200"}}
    assert doc["hosts"]["nodea"] == {"port": 2201, "groups": ["h200", "gpus"]}
    assert doc["hosts"]["nodeb"]["port"] == 2201
    assert doc["hosts"]["node-z"] == {"connection": "local", "groups": ["h200", "gpus"]}
    assert 'not imported: host node-z: address "10.9.0.30" (connection: local runs on this machine' in proc.stdout
    assert "not imported: host win1: ansible_connection=winrm (no ddops key)" in proc.stdout
    assert "not imported: host node-z: gpu_count=8" in proc.stdout
    assert load_inventory(out).host("nodeb").proxy_jump == "ops@bastion"


def test_an_ansible_file_with_a_bad_line_is_refused_with_file_and_line_and_nothing_written(tmp_path):
    bad = tmp_path / "hosts.ini"
    bad.write_text("[h200]\ngpu1 ansible_port\n")
    out = tmp_path / "inventory.yaml"
    proc = run_ddops("inventory", "import", "--ansible", str(bad), "-o", str(out))
    assert proc.returncode == 2 and f"{bad}:2: 'ansible_port': host variables are `name=value`" in proc.stderr
    assert not out.exists()


def test_import_never_replaces_an_existing_inventory_without_force(tmp_path):
    (tmp_path / "hosts.ini").write_text(ANSIBLE_INI)
    out = tmp_path / "inventory.yaml"
    out.write_text("mine\n")
    proc = run_ddops("inventory", "import", "--ansible", str(tmp_path / "hosts.ini"), "-o", str(out))
    assert proc.returncode == 2 and "exists" in proc.stderr and out.read_text() == "mine\n"
    proc = run_ddops("inventory", "import", "--ansible", str(tmp_path / "hosts.ini"), "-o", str(out), "--force")
    assert proc.returncode == 0 and "gpu01.lab" in out.read_text()


def ssh_g(config: Path, name: str) -> dict[str, str]:
    """What OpenSSH itself resolves for name (first value of each key)."""
    done = subprocess.run(["ssh", "-G", "-F", str(config), name], capture_output=True, text=True, check=True)
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key, value)
    return found


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client (ssh -G)")
def test_ssh_config_blocks_matching_a_glob_are_imported_as_ssh_g_resolves_them_through_include_and_match(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "gpus.conf").write_text(
        "Host gpu-a\n  HostName 10.20.0.11\n"
        "Host gpu-b\n  HostName 10.20.0.12\n  Port 2202\n"
        "Host gpu-*\n  User researcher\n  IdentityFile ~/.ssh/gpu_ed25519\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Include {tmp_path}/conf.d/*.conf\n"
        "Host bastion\n  HostName 10.20.0.1\n  User jump\n"
        "Match originalhost gpu-b\n  ProxyJump bastion\n"
        "Host cpu-1\n  HostName 10.20.0.50\n")
    proc, doc, out = imported(tmp_path, "--ssh-config", "gpu-*", "--ssh-config-file", str(config))
    assert list(doc["hosts"]) == ["gpu-a", "gpu-b"]  # cpu-1 and bastion do not match
    for name in ("gpu-a", "gpu-b"):
        expected = ssh_g(config, name)
        host = doc["hosts"][name]
        assert host["address"] == expected["hostname"] and host["user"] == expected["user"]
        assert host.get("port", 22) == int(expected["port"])
        assert Path(host["identity_file"]).expanduser() == Path(expected["identityfile"]).expanduser()
        assert host.get("proxy_jump") == (None if expected.get("proxyjump", "none") == "none"
                                          else expected["proxyjump"])
    assert doc["hosts"]["gpu-b"]["proxy_jump"] == "bastion" and doc["hosts"]["gpu-b"]["port"] == 2202
    assert doc["ssh_config"] == str(config)  # the bastion alias resolves through it
    inventory = load_inventory(out)
    assert [h.name for h in inventory.jump_hosts] == ["bastion"] and inventory.jump_hosts[0].address == "10.20.0.1"
    proc = run_ddops("inventory", "import", "--ssh-config", "tpu-*", "--ssh-config-file", str(config),
                     "-o", str(tmp_path / "none.yaml"))
    assert proc.returncode == 2 and "no Host block matches tpu-*" in proc.stderr and "gpu-a" in proc.stderr


def test_inventory_init_writes_a_commented_file_that_inventory_check_accepts_and_names_every_key(tmp_path):
    out = tmp_path / "inventory.yaml"
    proc = run_ddops("inventory", "init", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    check = run_ddops("inventory", "check", inventory=out)
    assert check.returncode == 0, check.stderr
    text = starter_inventory()
    assert out.read_text() == text
    for key in (*HOST_KEYS, *TOP_KEYS):
        assert f"#   {key}:" in text, key
    assert run_ddops("inventory", "init", "-o", str(out)).returncode == 2  # never over an existing file
