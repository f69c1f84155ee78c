"""pyinfra anchor inventory: the hosts of the spec named by $FANOUT_SPEC, host keys checked."""

import json
import os

with open(os.environ["FANOUT_SPEC"], encoding="utf-8") as _fh:
    _spec = json.load(_fh)

hosts = [
    (f"{h['address']}:{h['port']}", {
        "ssh_hostname": h["address"], "ssh_port": h["port"], "ssh_user": _spec["user"], "ssh_key": _spec["key"],
        "ssh_known_hosts_file": _spec["known_hosts"], "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False, "ssh_look_for_keys": False,
    })
    for h in _spec["hosts"]
]
