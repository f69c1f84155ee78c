"""Fabric anchor: one ThreadingGroup `run` of `cp && sed && grep` on every host, host keys checked.

Usage: python fabric_patch.py SPEC.json [--serial]  (spec: {user, key, known_hosts, command, hosts: [{address, port}]})
This is the hand-written one-liner that ddops is compared with: no plan, no journal, a backup that the next run
overwrites. It exits 1 when any host failed.
"""

import json
import sys
import time

import paramiko
from fabric import Connection, ThreadingGroup


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    connections = []
    for host in spec["hosts"]:
        c = Connection(host["address"], user=spec["user"], port=host["port"],
                       connect_kwargs={"key_filename": spec["key"], "look_for_keys": False, "allow_agent": False})
        # Fabric auto-adds unknown keys by default; the comparison is with host-key checking on.
        c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.client.load_host_keys(spec["known_hosts"])
        connections.append(c)
    if "--serial" in sys.argv[2:]:  # one host after another, each timed from its connect to its answer
        results, per_host = {}, []
        for c in connections:
            started = time.perf_counter()
            try:
                results[c] = c.run(spec["command"], hide=True, warn=True)
            except Exception as exc:  # noqa: BLE001 - reported as a failed host, like ThreadingGroup does
                results[c] = exc
            per_host.append(time.perf_counter() - started)
        print(json.dumps({"per_host_s": per_host}))
    else:
        results = ThreadingGroup.from_connections(connections).run(spec["command"], hide=True, warn=True)
    failed = [c.host for c, r in results.items() if isinstance(r, Exception) or not r.ok]
    for c in connections:
        c.close()
    if failed:
        print(f"fabric: failed on {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
