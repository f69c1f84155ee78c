"""ssh_config as OpenSSH reads it (`ssh -G`), the small parser as the fallback, and where its values rank."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest

from ddops.inventory import load_inventory
from ddops.sshconfig import (OpenSshConfig, SshConfig, SshConfigError, honoured_from_ssh_g, jump_hops, load_ssh_config,
                             parse_ssh_g, split_hop)

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs an OpenSSH client (ssh -G)")

SSH_G_SAMPLE = """\
user alice
hostname 10.0.0.5
port 2200
identityfile ~/.ssh/gpu
identityfile /ddops/unset
proxyjump gw1,bob@gw2:2222
userknownhostsfile ~/.ssh/known_hosts ~/.ssh/known_hosts2
"""


def config(tmp_path: Path, text: str, name: str = "config") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- the pure parts ---------------------------------------------------------------------------------------------

def test_ssh_g_lines_keep_every_value_of_a_repeated_key_in_order():
    options = parse_ssh_g(SSH_G_SAMPLE)
    assert options["identityfile"] == ["~/.ssh/gpu", "/ddops/unset"]
    assert options["userknownhostsfile"] == ["~/.ssh/known_hosts ~/.ssh/known_hosts2"]
    assert options["proxyjump"] == ["gw1,bob@gw2:2222"]


def test_ssh_g_values_the_config_set_are_honoured_and_the_sentinels_are_not():
    assert honoured_from_ssh_g("gpu1", parse_ssh_g(SSH_G_SAMPLE)) == {
        "hostname": "10.0.0.5", "user": "alice", "port": "2200", "identity_file": "~/.ssh/gpu",
        "proxy_jump": "gw1,bob@gw2:2222", "known_hosts": "~/.ssh/known_hosts"}
    unset = "user ddops/unset\nhostname gpu1\nport 1\nidentityfile /ddops/unset\nuserknownhostsfile /ddops/unset\n"
    assert honoured_from_ssh_g("GPU1", parse_ssh_g(unset)) == {}  # ssh lower-cases the name it prints


def test_proxy_jump_chains_split_into_hops_with_user_and_port():
    assert jump_hops("a, b@c:2222 ,[::1]:22") == ["a", "b@c:2222", "[::1]:22"]
    assert jump_hops("none") == jump_hops(None) == []
    assert split_hop("b@c:2222") == ("b", "c", 2222)
    assert split_hop("gw") == (None, "gw", None)
    assert split_hop("u@[fe80::1]:2200") == ("u", "fe80::1", 2200)
    assert split_hop("ssh://u@gw:23") == ("u", "gw", 23)


def test_without_an_ssh_client_the_small_parser_reads_host_blocks_and_skips_match(tmp_path):
    path = config(tmp_path, """\
        Host gpu1
          HostName 10.0.0.1
        Match host gpu1
          User matched
        Host *
          User fallback
        """)
    cfg = load_ssh_config(path, ssh=None)
    assert isinstance(cfg, SshConfig)
    assert cfg.lookup("gpu1") == {"hostname": "10.0.0.1", "user": "fallback"}


def test_a_missing_or_empty_config_costs_no_process(tmp_path):
    assert isinstance(load_ssh_config(tmp_path / "absent"), SshConfig)
    assert isinstance(load_ssh_config(config(tmp_path, "# only a comment\n\n")), SshConfig)
    assert isinstance(load_ssh_config("/dev/null"), SshConfig)


# --- OpenSSH's own reading ---------------------------------------------------------------------------------------

@needs_ssh
def test_include_match_and_tokens_are_resolved_as_openssh_does(tmp_path):
    config(tmp_path, """\
        Host gpu*
          HostName %h.lab.internal
          ProxyJump gw1,gw2
        """, name="gpus.conf")
    path = config(tmp_path, f"""\
        Include {tmp_path}/gpus.conf
        Match originalhost gpu2
          User matched
          Port 2201
        Host *
          IdentityFile ~/.ssh/lab
        """)
    cfg = load_ssh_config(path)
    assert isinstance(cfg, OpenSshConfig) and cfg.wide_open
    assert cfg.lookup("gpu2") == {"hostname": "gpu2.lab.internal", "user": "matched", "port": "2201",
                                  "identity_file": "~/.ssh/lab", "proxy_jump": "gw1,gw2"}
    assert load_ssh_config(path, ssh=None).lookup("gpu2") == {"identity_file": "~/.ssh/lab"}  # what the parser saw


@needs_ssh
def test_each_name_costs_one_ssh_call_per_run_and_names_the_config_cannot_touch_cost_none(tmp_path):
    cfg = load_ssh_config(config(tmp_path, "Host gpu*\n  User ubuntu\nHost *\n  ServerAliveInterval 30\n"))
    assert isinstance(cfg, OpenSshConfig) and not cfg.wide_open
    cfg.prefetch(["gpu1", "gpu2", "gpu1", "db1"])
    assert cfg.calls == 2  # gpu1 and gpu2, at once; db1 only meets a block with nothing ddops honours
    assert cfg.lookup("gpu1") == cfg.lookup("gpu2") == {"user": "ubuntu"}
    assert cfg.lookup("db1") == {}
    assert cfg.calls == 2


@needs_ssh
def test_later_runs_reuse_what_ssh_said_until_a_file_it_read_changes(tmp_path):
    included = config(tmp_path, "Host gpu*\n  User ubuntu\n", name="gpus.conf")
    path = config(tmp_path, f"Include {included}\n")

    def run() -> OpenSshConfig:
        cfg = load_ssh_config(path)
        cfg.cache_file = tmp_path / "cache.json"
        cfg.prefetch(["gpu1", "gpu2"])
        return cfg

    first = run()
    assert first.calls == 2 and first.lookup("gpu1") == {"user": "ubuntu"}
    again = run()
    assert again.calls == 0 and again.lookup("gpu2") == {"user": "ubuntu"}
    included.write_text("Host gpu*\n  User admin\n")  # a file the config includes, not the config itself
    changed = run()
    assert changed.calls == 2 and changed.lookup("gpu1") == {"user": "admin"}


@needs_ssh
def test_a_config_whose_answers_depend_on_commands_is_asked_every_run(tmp_path):
    path = config(tmp_path, "Match exec true\n  User fromexec\n")
    cfg = load_ssh_config(path)
    assert cfg.signature is None
    assert cfg.lookup("gpu1") == {"user": "fromexec"}


@needs_ssh
def test_a_config_openssh_refuses_is_a_usage_error_naming_its_line(tmp_path):
    path = config(tmp_path, "Host gpu1\n  HostName 10.0.0.1\n  Colour blue\n")
    with pytest.raises(SshConfigError, match=r"line 3: Bad configuration option: colour"):
        load_ssh_config(path).lookup("gpu1")


# --- precedence in the inventory ---------------------------------------------------------------------------------

def inventory(tmp_path: Path, body: str, ssh_config: str) -> Path:
    cfg = config(tmp_path, ssh_config, name="ssh_config")
    path = tmp_path / "inventory.yaml"
    path.write_text(f"ssh_config: {cfg}\n" + textwrap.dedent(body))
    return path


PRECEDENCE_CONFIG = """\
    Match originalhost gpu*
      Port 22
      User cfguser
    Host gpu*
      HostName 10.3.0.%h
    """
PRECEDENCE_BODY = """\
    defaults: {user: root, port: 2222}
    groups:
      lab: {user: groupuser}
    hosts:
      gpu1: {}
      gpu2: {user: hostuser, port: 2200}
      gpu3: {groups: [lab]}
      db1: {}
    """


@needs_ssh
def test_inventory_values_beat_ssh_config_which_beats_defaults_even_where_it_repeats_an_ssh_default(tmp_path):
    inv = load_inventory(inventory(tmp_path, PRECEDENCE_BODY, PRECEDENCE_CONFIG))
    gpu1, gpu2, gpu3, db1 = inv.hosts
    # Port 22 and the config's user are set by the config (in a Match block): they beat the inventory's defaults.
    assert (gpu1.address, gpu1.user, gpu1.port) == ("10.3.0.gpu1", "cfguser", 22)
    assert (gpu2.address, gpu2.user, gpu2.port) == ("10.3.0.gpu2", "hostuser", 2200)  # the host's own values win
    assert (gpu3.user, gpu3.port) == ("groupuser", 22)  # and its groups' values
    assert (db1.address, db1.user, db1.port) == ("db1", "root", 2222)  # ssh's own defaults never show through


def test_the_fallback_parser_ranks_the_same_for_what_it_can_read(tmp_path):
    body = PRECEDENCE_BODY
    cfg = "Host gpu*\n  HostName 10.3.0.%h\n  User cfguser\n  Port 22\n"
    from ddops.sshconfig import parse_ssh_config

    inv = load_inventory(inventory(tmp_path, body, cfg), ssh_config=parse_ssh_config(cfg))
    gpu1, gpu2, gpu3, db1 = inv.hosts
    assert (gpu1.address, gpu1.user, gpu1.port) == ("10.3.0.gpu1", "cfguser", 22)
    assert (gpu2.user, gpu2.port) == ("hostuser", 2200)
    assert gpu3.user == "groupuser"
    assert (db1.user, db1.port) == ("root", 2222)


@needs_ssh
def test_user_known_hosts_file_from_ssh_config_applies_unless_the_inventory_names_one(tmp_path):
    cfg = "Host gpu1\n  UserKnownHostsFile ~/.ssh/lab_hosts ~/.ssh/other\n"
    inv = load_inventory(inventory(tmp_path, "hosts:\n  gpu1: {}\n  gpu2: {}\n", cfg))
    known = [h.known_hosts and os.path.expanduser(h.known_hosts) for h in inv.hosts]
    assert known == [os.path.expanduser("~/.ssh/lab_hosts"), None]  # None: the inventory's file
    inv = load_inventory(inventory(tmp_path, "known_hosts: /etc/lab_known_hosts\nhosts:\n  gpu1: {}\n", cfg))
    assert inv.hosts[0].known_hosts is None and inv.known_hosts == "/etc/lab_known_hosts"
    fallback = load_ssh_config(tmp_path / "ssh_config", ssh=None)
    assert fallback.lookup("gpu1") == {"known_hosts": "~/.ssh/lab_hosts"}


@needs_ssh
def test_proxy_jump_hops_that_are_ssh_config_aliases_are_resolved_like_hosts(tmp_path):
    path = inventory(tmp_path, """\
        defaults: {user: root}
        hosts:
          gpu1: {proxy_jump: gw1}
        """, """\
        Include gw0.conf
        Host gpu1
          HostName 10.4.0.1
        Host gw1
          HostName 10.4.0.254
          ProxyJump gw0
        """)
    config(tmp_path, "Host gw0\n  HostName 10.4.1.254\n  User jumper\n  Port 2022\n", name="gw0.conf")
    # A relative Include is relative to ~/.ssh, as OpenSSH reads it: name this one absolutely.
    path.parent.joinpath("ssh_config").write_text(
        path.parent.joinpath("ssh_config").read_text().replace("gw0.conf", str(tmp_path / "gw0.conf")))
    inv = load_inventory(path)
    hops = {h.name: h for h in inv.jump_hosts}
    assert set(hops) == {"gw1", "gw0"}
    assert (hops["gw1"].address, hops["gw1"].proxy_jump, hops["gw1"].user) == ("10.4.0.254", "gw0", "root")
    assert (hops["gw0"].address, hops["gw0"].port, hops["gw0"].user) == ("10.4.1.254", 2022, "jumper")


def test_help_reads_no_ssh_config():
    import subprocess
    import sys

    code = ("import sys\nfrom ddops.cli.app import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('loaded:' + ','.join(m for m in ('ddops.sshconfig', 'ddops.inventory') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "loaded:"


def test_a_host_key_alias_set_in_ssh_config_is_honoured(tmp_path):
    if shutil.which("ssh") is None:
        pytest.skip("needs an ssh client")
    path = tmp_path / "config"
    path.write_text("Host gpu-a\n  HostName 10.0.0.5\n  HostKeyAlias gpu-a.behind-gw-a\n")
    config = load_ssh_config(path)
    assert config.lookup("gpu-a")["host_key_alias"] == "gpu-a.behind-gw-a"
    assert "host_key_alias" not in config.lookup("gpu-b")
