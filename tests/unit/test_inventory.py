"""The inventory format: what it accepts, and the file:line error for each thing it refuses."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddops.errors import EXIT_HOST_FAILED, EXIT_USAGE, AgentError, InventoryError, TransportError, UsageError
from ddops.inventory import Selection, load_inventory, matches_limit, select
from ddops.sshconfig import parse_ssh_config

EXAMPLE = """\
defaults: {user: root, port: 22, repo: /root/ddtree, identity_file: ~/.ssh/id_ed25519}
known_hosts: ~/.ssh/known_hosts
patches: [hybrid-cache]
hosts:
  h200-a: {address: 10.1.230.172, groups: [h200]}
  h200-b: {address: 10.1.230.173, port: 2222, proxy_jump: bastion, groups: [h200]}
  bastion: {address: 10.1.230.1, groups: [jump]}
"""


def write(tmp_path: Path, text: str, ssh_config: str = "") -> Path:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(ssh_config)
    body = textwrap.dedent(text)
    if "ssh_config:" not in body:
        body = f"ssh_config: {cfg}\n" + body
    path = tmp_path / "inventory.yaml"
    path.write_text(body)
    return path


def error_of(tmp_path: Path, text: str, ssh_config: str = "") -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory(write(tmp_path, text, ssh_config))
    return str(info.value)


def test_example_inventory_loads_with_defaults_applied(tmp_path):
    inv = load_inventory(write(tmp_path, EXAMPLE))
    a, b, _ = inv.hosts
    assert (a.name, a.address, a.port, a.user, a.repo, a.python) == ("h200-a", "10.1.230.172", 22, "root",
                                                                       "/root/ddtree", "python3")
    assert b.port == 2222 and b.proxy_jump == "bastion" and b.groups == ("h200",)
    assert inv.patches == ("hybrid-cache",)


def test_unknown_key_names_file_line_and_suggests(tmp_path):
    message = error_of(tmp_path, """\
        hosts:
          h200-a: {address: 10.0.0.1}
          h200-b:
            address: 10.0.0.2
            prot: 2222
        """)
    assert message.endswith("inventory.yaml:6: hosts.h200-b.prot: unknown key (did you mean 'port'?)")


def test_wrong_type_is_named(tmp_path):
    message = error_of(tmp_path, "hosts:\n  a: {address: x, port: twenty}\n")
    assert "inventory.yaml:3: hosts.a.port: must be an integer, not a string" in message


def test_boolean_is_not_an_integer(tmp_path):
    assert "must be an integer" in error_of(tmp_path, "hosts:\n  a: {port: true}\n")


def test_duplicate_host_name_is_an_error(tmp_path):
    message = error_of(tmp_path, "hosts:\n  a: {address: 1.1.1.1}\n  a: {address: 2.2.2.2}\n")
    assert "inventory.yaml:4: hosts.a: duplicate key" in message


def test_duplicate_address_is_an_error(tmp_path):
    message = error_of(tmp_path, "hosts:\n  a: {address: 1.1.1.1}\n  b: {address: 1.1.1.1}\n")
    assert "hosts.b: same address 1.1.1.1:22 as host 'a'" in message


def test_same_address_on_other_port_is_fine(tmp_path):
    inv = load_inventory(write(tmp_path, "hosts:\n  a: {address: 1.1.1.1}\n  b: {address: 1.1.1.1, port: 2222}\n"))
    assert len(inv.hosts) == 2


def test_proxy_jump_to_nowhere_is_an_error(tmp_path):
    message = error_of(tmp_path, "hosts:\n  a: {address: 1.1.1.1, proxy_jump: nosuch}\n")
    assert "hosts.a.proxy_jump: 'nosuch' is neither a host in this inventory nor an ssh_config alias" in message


def test_proxy_jump_may_name_an_ssh_config_alias(tmp_path):
    inv = load_inventory(write(tmp_path, "hosts:\n  a: {address: 1.1.1.1, proxy_jump: gw}\n",
                               ssh_config="Host gw\n  HostName 10.9.9.9\n"))
    assert inv.hosts[0].proxy_jump == "gw"


def test_malformed_yaml_names_the_line(tmp_path):
    message = error_of(tmp_path, "hosts:\n  a: {address: 1.1.1.1\n  b: x\n")
    assert message.startswith(str(tmp_path / "inventory.yaml") + ":")
    assert "invalid YAML" in message


def test_empty_file_and_missing_hosts_are_errors(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text("")
    with pytest.raises(InventoryError, match="empty"):
        load_inventory(path)
    assert "missing `hosts:`" in error_of(tmp_path, "defaults: {user: root}\n")


def test_non_utf8_inventory_is_a_clean_error(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_bytes(b"hosts:\n  a: {address: \xff}\n")
    with pytest.raises(InventoryError, match=r"inventory.yaml:2: not valid UTF-8"):
        load_inventory(path)


def test_repo_path_must_be_absolute_without_traversal(tmp_path):
    assert "must be an absolute path" in error_of(tmp_path, "hosts:\n  a: {repo: ddtree}\n")
    assert "'..'" in error_of(tmp_path, "hosts:\n  a: {repo: /root/../etc}\n")


def test_port_range_and_sync_mode_are_checked(tmp_path):
    assert "out of range" in error_of(tmp_path, "hosts:\n  a: {port: 70000}\n")
    assert "did you mean 'push'" in error_of(tmp_path, "hosts:\n  a: {sync: psuh}\n")


def test_ssh_config_fills_what_the_inventory_leaves_open(tmp_path):
    inv = load_inventory(write(tmp_path, "hosts:\n  gpu1: {}\n  gpu2: {user: alice}\n", ssh_config="""\
Host gpu*
  HostName 10.2.0.%h
  User ubuntu
  Port 2200
  IdentityFile ~/.ssh/gpu_key
"""))
    gpu1, gpu2 = inv.hosts
    assert (gpu1.address, gpu1.user, gpu1.port, gpu1.identity_file) == ("10.2.0.gpu1", "ubuntu", 2200, "~/.ssh/gpu_key")
    assert gpu2.user == "alice"  # the inventory's own value wins


def test_group_settings_apply_between_defaults_and_host(tmp_path):
    inv = load_inventory(write(tmp_path, """\
        defaults: {repo: /root/ddtree}
        groups:
          h100: {repo: /data/ddtree, commit: abc123}
        hosts:
          a: {groups: [h100]}
          b: {groups: [h100], repo: /srv/ddtree}
          c: {}
        """))
    a, b, c = inv.hosts
    assert (a.repo, a.commit) == ("/data/ddtree", "abc123")
    assert b.repo == "/srv/ddtree"
    assert c.repo == "/root/ddtree"


def test_shell_metacharacters_in_vars_are_kept_verbatim(tmp_path):
    inv = load_inventory(write(tmp_path, "hosts:\n  a: {vars: {note: \"$(rm -rf /); `id`\"}}\n"))
    assert inv.hosts[0].vars["note"] == "$(rm -rf /); `id`"


# --- selection -------------------------------------------------------------------------------------------------

@pytest.fixture
def inv(tmp_path):
    return load_inventory(write(tmp_path, EXAMPLE))


def names(hosts):
    return [h.name for h in hosts]


def test_select_by_name_or_address(inv):
    assert names(select(inv, Selection(hosts=("h200-a",)))) == ["h200-a"]
    assert names(select(inv, Selection(hosts=("10.1.230.173",)))) == ["h200-b"]


def test_select_by_group_and_all(inv):
    assert names(select(inv, Selection(groups=("h200",)))) == ["h200-a", "h200-b"]
    assert names(select(inv, Selection(all=True))) == ["h200-a", "h200-b", "bastion"]


def test_limit_globs_commas_and_exclusions(inv):
    assert names(select(inv, Selection(limit="h200-*"))) == ["h200-a", "h200-b"]
    assert names(select(inv, Selection(limit="h200-a,bastion"))) == ["h200-a", "bastion"]
    assert names(select(inv, Selection(all=True, limit="!jump"))) == ["h200-a", "h200-b"]
    assert names(select(inv, Selection(groups=("h200",), limit="!10.1.230.172"))) == ["h200-b"]


def test_empty_selection_is_a_clear_usage_error(inv):
    with pytest.raises(UsageError, match="no hosts selected"):
        select(inv, Selection())
    with pytest.raises(UsageError, match="--host nope: no such host"):
        select(inv, Selection(hosts=("nope",)))
    with pytest.raises(UsageError, match="--group gpu: no such group"):
        select(inv, Selection(groups=("gpu",)))
    with pytest.raises(UsageError, match="matches no selected host"):
        select(inv, Selection(limit="zzz*"))


def test_matches_limit_on_groups(inv):
    assert matches_limit(inv.host("bastion"), "jump")
    assert not matches_limit(inv.host("bastion"), "h200,!jump")


# --- exit codes and ssh_config ---------------------------------------------------------------------------------

def test_exit_code_table():
    assert InventoryError("x").exit_code == EXIT_USAGE == 2
    assert UsageError("x").exit_code == 2
    assert TransportError("x").exit_code == EXIT_HOST_FAILED == 1
    assert AgentError("x").exit_code == 1


def test_ssh_config_first_value_wins_and_negation():
    cfg = parse_ssh_config("Host a* !ab\n  User one\nHost *\n  User two\n  Port 2022\n")
    assert cfg.lookup("ax") == {"user": "one", "port": "2022"}
    assert cfg.lookup("ab") == {"user": "two", "port": "2022"}
    assert cfg.aliases() == set()


def test_agent_linger_defaults_to_300_s_takes_0_to_turn_residents_off_and_refuses_nonsense(tmp_path):
    inv = load_inventory(write(tmp_path, "defaults: {agent_linger: 0}\nhosts:\n  a: {}\n  b: {agent_linger: 30}\n"))
    assert [h.agent_linger for h in inv.hosts] == [0.0, 30.0]
    assert load_inventory(write(tmp_path, "hosts:\n  a: {}\n")).hosts[0].agent_linger == 300.0
    assert "hosts.a.agent_linger: must be between 0 (never) and 86400 seconds" in \
        error_of(tmp_path, "hosts:\n  a: {agent_linger: -1}\n")
    assert "hosts.a.agent_linger: must be" in error_of(tmp_path, "hosts:\n  a: {agent_linger: forever}\n")


@pytest.mark.parametrize("key", ["repo_url", "commit"])
def test_git_values_starting_with_a_dash_are_refused_with_file_and_line(tmp_path, key):
    text = (f"defaults: {{user: root}}\nhosts:\n  a: {{address: 10.0.0.1}}\n"
            f"  b:\n    {key}: '--upload-pack=touch /tmp/x'\n")
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'inventory.yaml'}:6: hosts.b.{key}: must not start with '-'")


@pytest.mark.parametrize("name", [".", ".."])
def test_a_host_named_dot_or_dot_dot_is_refused(tmp_path, name):
    message = error_of(tmp_path, f"hosts:\n  '{name}': {{address: 10.0.0.1}}\n")
    assert message.startswith(f"{tmp_path / 'inventory.yaml'}:3: hosts.{name}: '{name}' is not a host name")


def test_the_host_schema_is_one_table_that_host_fields_and_defaults_follow():
    import dataclasses

    from ddops.inventory import BUILTIN_DEFAULTS, HOST_KEYS, HOST_SCHEMA, Host

    fields = {f.name: f for f in dataclasses.fields(Host)}
    for key, spec in HOST_SCHEMA.items():
        assert key in fields, f"HOST_SCHEMA key {key} is no Host field"
        f = fields[key]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if key != "address":
            assert default == (spec.default if spec.default is not None else None), key
    assert set(HOST_KEYS) == set(HOST_SCHEMA)
    assert BUILTIN_DEFAULTS["port"] == 22 and "identity_file" not in BUILTIN_DEFAULTS
    # Every other Host field is derived, not an inventory key.
    assert set(fields) - set(HOST_SCHEMA) == {"name", "known_hosts", "identity_origin"}


def test_a_choice_key_refuses_other_values_with_did_you_mean_and_line(tmp_path):
    message = error_of(tmp_path, """\
        hosts:
          a: {address: 10.0.0.1}
          b: {address: 10.0.0.2, connection: locl}
        """)
    assert message.endswith("inventory.yaml:4: hosts.b.connection: must be one of ssh, local (did you mean 'local'?)")
    assert "groups.g.address: unknown key" in error_of(tmp_path, """\
        groups: {g: {address: 10.0.0.9}}
        hosts: {a: {address: 10.0.0.1}}
        """)


def test_where_each_identity_file_was_set_is_kept_for_its_error(tmp_path):
    inv = load_inventory(write(tmp_path, """\
        defaults: {identity_file: /keys/default}
        groups: {g: {identity_file: /keys/group}}
        hosts:
          a: {address: 10.0.0.1}
          b: {address: 10.0.0.2, groups: [g]}
          c: {address: 10.0.0.3, identity_file: /keys/own}
        """))
    path = tmp_path / "inventory.yaml"
    assert [h.identity_origin for h in inv.hosts] == [f"{path}:2: defaults.identity_file",
                                                      f"{path}:3: groups.g.identity_file",
                                                      f"{path}:7: hosts.c.identity_file"]


def test_one_address_behind_two_jumps_is_two_hosts_each_with_a_host_key_alias(tmp_path):
    hosts = """\
        hosts:
          gw-a: {address: 10.9.0.1}
          gw-b: {address: 10.9.0.2}
          gpu-a: {address: 10.0.0.5, proxy_jump: gw-a, host_key_alias: gpu-a}
          gpu-b: {address: 10.0.0.5, proxy_jump: gw-b%s}
        """
    inv = load_inventory(write(tmp_path, hosts % ", host_key_alias: gpu-b"))
    assert [h.host_key_alias for h in inv.hosts][2:] == ["gpu-a", "gpu-b"]
    assert "hosts.gpu-b: same address 10.0.0.5:22 as host 'gpu-a' behind another jump: give each a " \
           "`host_key_alias`" in error_of(tmp_path, hosts % ", host_key_alias: gpu-a")
    assert "hosts.gpu-b: same address 10.0.0.5:22 behind gw-a as host 'gpu-a'" in error_of(
        tmp_path, hosts.replace("proxy_jump: gw-b", "proxy_jump: gw-a") % ", host_key_alias: gpu-b")


def test_bench_names_the_default_plan_and_a_path_is_read_against_the_inventory_folder(tmp_path):
    inv = tmp_path / "fleet" / "inventory.yaml"
    inv.parent.mkdir()
    inv.write_text("bench: ./plans/ours.yaml\nhosts:\n  a: {address: 127.0.0.2}\n")
    loaded = load_inventory(inv)
    assert loaded.bench == str(tmp_path / "fleet" / "plans" / "ours.yaml") and loaded.bench_where == f"{inv}:1"
    inv.write_text("hosts:\n  a: {address: 127.0.0.2}\n")
    assert load_inventory(inv).bench is None
    inv.write_text("bench: [a, b]\nhosts:\n  a: {address: 127.0.0.2}\n")
    with pytest.raises(InventoryError, match=r"inventory.yaml:1: bench"):
        load_inventory(inv)


@pytest.mark.parametrize("key, value", [("user", "nobody"), ("address", "10.0.0.9"), ("port", 2222),
                                        ("proxy_jump", "bastion")])
def test_a_local_host_refuses_ssh_only_keys_at_their_line(tmp_path, key, value):
    # `user: nobody` on a local host used to run as the controller's user (root) without a word.
    message = error_of(tmp_path, f"hosts:\n  bastion: {{}}\n  here:\n    connection: local\n    {key}: {value}\n")
    assert message == (f"{tmp_path / 'inventory.yaml'}:6: hosts.here.{key}: does not apply to a `connection: local` "
                       "host (it runs on this machine as the user running ddops, without SSH): remove it, or use "
                       "connection: ssh")


def test_a_group_that_makes_its_hosts_local_refuses_ssh_only_keys_and_inherited_defaults_are_left_alone(tmp_path):
    message = error_of(tmp_path, "groups:\n  mine: {connection: local, user: alice}\n"
                                 "hosts:\n  here: {groups: [mine]}\n")
    assert message.startswith(f"{tmp_path / 'inventory.yaml'}:3: groups.mine.user: does not apply to a `connection: "
                              "local` host")
    # A fleet's defaults (user, port) are meant for its SSH hosts: a local host among them takes none and loads.
    inv = load_inventory(write(tmp_path, "defaults: {user: ops, port: 2222}\n"
                                         "hosts:\n  gpu: {address: 10.0.0.1}\n  here: {connection: local}\n"))
    assert inv.host("here").local and inv.host("gpu").user == "ops"


@pytest.mark.parametrize("jump, problem", [
    ("bastion:0", "'bastion:0': port 0 is out of range 1-65535"),
    ("bastion:ssh", "'bastion:ssh' is not a hop"),
    ("bastion,,gpu", "'' is not a hop"),
    ("-oProxyCommand=touch", "'-oProxyCommand=touch' is not a hop"),
    ("ops@ bastion", "'ops@ bastion' is not a hop"),
])
def test_a_proxy_jump_hop_ssh_would_refuse_is_refused_at_its_line(tmp_path, jump, problem):
    message = error_of(tmp_path, f"hosts:\n  bastion: {{}}\n  gpu: {{proxy_jump: '{jump}'}}\n")
    assert message.startswith(f"{tmp_path / 'inventory.yaml'}:4: hosts.gpu.proxy_jump: {problem}")


def test_a_proxy_jump_from_ssh_config_is_checked_too_and_named_at_the_hosts_line(tmp_path):
    # Where ssh runs, `ssh -G` refuses it itself (naming the config's line); without an ssh client ddops does.
    with pytest.raises(InventoryError) as info:
        load_inventory(write(tmp_path, "hosts:\n  gpu: {}\n"),
                       parse_ssh_config("Host gpu\n  ProxyJump bastion:99999\n"))
    assert str(info.value) == (f"{tmp_path / 'inventory.yaml'}:3: hosts.gpu: proxy_jump (from ssh_config): "
                               "'bastion:99999': port 99999 is out of range 1-65535")
    fine = load_inventory(write(tmp_path, "hosts:\n  bastion: {}\n  gpu: {proxy_jump: 'ops@bastion:2222, bastion'}\n"
                                          "  v6: {proxy_jump: 'ssh://ops@[fd00::1]:22'}\n"))
    assert fine.host("gpu").proxy_jump == "ops@bastion:2222, bastion"


def test_identities_only_is_a_host_key_and_is_read_from_ssh_config(tmp_path):
    inv = load_inventory(write(tmp_path, "hosts:\n  a: {identities_only: true}\n  b: {}\n  c: {}\n",
                               ssh_config="Host b\n  IdentitiesOnly yes\n"))
    assert [h.identities_only for h in inv.hosts] == [True, True, False]
    refused = error_of(tmp_path, "hosts:\n  a: {identities_only: 'yes'}\n")
    assert refused.endswith("hosts.a.identities_only: must be true or false, not a string")
