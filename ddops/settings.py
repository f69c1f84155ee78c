"""Every DDOPS_* environment setting: its name, what it means, and the one place it is read (`Setting.value`)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable ddops reads."""

    name: str
    doc: str

    def value(self) -> str | None:
        """Its value; None when unset or empty."""
        return os.environ.get(self.name) or None


INVENTORY = Setting("DDOPS_INVENTORY", "the inventory file when -i is not given (default ./inventory.yaml)")
CACHE_DIR = Setting("DDOPS_CACHE_DIR", "ddops' own files on the controller (default $XDG_CACHE_HOME/ddops)")
PLAN_CACHE = Setting("DDOPS_PLAN_CACHE", "0: plans are not kept on disk between runs")
PLAN_ENGINE = Setting("DDOPS_PLAN_ENGINE", "libcst: every plan goes through libcst (the prefilter off)")
LOCK_TIMEOUT = Setting("DDOPS_LOCK_TIMEOUT", "seconds a command waits for another's lock on a host (--lock-timeout)")
RESULTS_DIR = Setting("DDOPS_RESULTS_DIR", "where collected results and launch records live (default ./results)")
PLAYBOOK_PATH = Setting("DDOPS_PLAYBOOK_PATH", "folders (':'-separated) searched for playbooks and bench plans "
                                               "after the inventory's playbook_dirs, before the built-ins")
SYSTEM_KNOWN_HOSTS = Setting("DDOPS_SYSTEM_KNOWN_HOSTS", "the system-wide known_hosts read after the user's "
                                                         "(default /etc/ssh/ssh_known_hosts)")
TESTBED_ROOT = Setting("DDOPS_TESTBED_ROOT", "where `ddops testbed up` puts its hosts, a folder only you can change "
                                             "(default: a fresh private one, which down and status remember)")
TESTBED_ADDRESS_PREFIX = Setting("DDOPS_TESTBED_ADDRESS_PREFIX", "the loopback /24 testbed hosts get "
                                                                 "(--address-prefix)")
MAX_AGENT_ANSWER = Setting("DDOPS_MAX_AGENT_ANSWER", "bytes of one agent answer the controller takes from a host; "
                                                     "more ends that host's call (default 268435456: 256 MiB)")
MAX_COMMAND_OUTPUT = Setting("DDOPS_MAX_COMMAND_OUTPUT", "bytes of a command's output the controller keeps; "
                                                         "more ends that host's call (default 67108864: 64 MiB)")
MAX_HELD_OUTPUT = Setting("DDOPS_MAX_HELD_OUTPUT", "bytes of the hosts' answers and output the controller holds at "
                                                   "once, all hosts together; more ends the call of the host that "
                                                   "would pass it (exec keeps less) (default 536870912: 512 MiB)")
CONTAINERS_DIR = Setting("DDOPS_CONTAINERS_DIR", "container testbed state (default the cache's containers/)")

SETTINGS = (INVENTORY, CACHE_DIR, PLAN_CACHE, PLAN_ENGINE, LOCK_TIMEOUT, RESULTS_DIR, PLAYBOOK_PATH,
            SYSTEM_KNOWN_HOSTS, TESTBED_ROOT, TESTBED_ADDRESS_PREFIX, CONTAINERS_DIR, MAX_AGENT_ANSWER,
            MAX_COMMAND_OUTPUT, MAX_HELD_OUTPUT)
