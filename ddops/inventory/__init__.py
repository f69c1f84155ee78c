"""Hosts and groups: the schema and values (`schema`), the inventory file read with file:line errors (`parsing`),
and which hosts a command line names (`selection`)."""

from ddops.inventory.parsing import (ADHOC_SOURCE, adhoc_inventory, inventory_path, load_inventory,
                                     missing_identity_file, parse_inventory)
from ddops.inventory.schema import (BUILTIN_DEFAULTS, CONNECTIONS, DEFAULT_INVENTORY, DEFAULT_KNOWN_HOSTS,
                                    DEFAULT_SSH_CONFIG, GROUP_KEYS, HOST_KEYS, HOST_SCHEMA, SSH_ONLY_KEYS, SYNC_MODES,
                                    TOP_KEYS, Host, HostKey, Inventory, looks_like_playbook_path)
from ddops.inventory.selection import Selection, matches_limit, select

__all__ = ["ADHOC_SOURCE", "BUILTIN_DEFAULTS", "CONNECTIONS", "DEFAULT_INVENTORY", "DEFAULT_KNOWN_HOSTS",
           "DEFAULT_SSH_CONFIG", "GROUP_KEYS", "HOST_KEYS", "HOST_SCHEMA", "SSH_ONLY_KEYS", "SYNC_MODES", "TOP_KEYS",
           "Host", "HostKey", "Inventory", "Selection", "adhoc_inventory", "inventory_path", "load_inventory",
           "looks_like_playbook_path", "missing_identity_file", "matches_limit", "parse_inventory", "select"]
