"""`ddops hosts`, `ddops inventory check`, `ddops ping`."""

from __future__ import annotations

from typing import Any

import typer

from ddops.cli.common import (AllOpt, ForksOpt, GroupOpt, HostOpt, JsonOpt, LimitOpt, console, emit_json,
                              escape, finish, fleet_run, recap, selected_hosts, state)

inventory_app = typer.Typer(help="Inspect and validate the inventory.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("hosts")(hosts)
    app.command("ping")(ping)
    app.add_typer(inventory_app, name="inventory")


def hosts(ctx: typer.Context, host: HostOpt = None, group: GroupOpt = None, all_: AllOpt = False,
          limit: LimitOpt = None, json_out: JsonOpt = False) -> None:
    """List the selected hosts (all of them when nothing is selected)."""
    st = state(ctx)
    inventory = st.load_inventory()
    chosen = inventory.hosts if not (host or group or all_ or limit) else selected_hosts(st, host, group, all_, limit)[1]
    if json_out or st.json:
        import json

        print(json.dumps([{"name": h.name, "address": h.address, "port": h.port, "user": h.user, "repo": h.repo,
                           "python": h.python, "groups": list(h.groups), "proxy_jump": h.proxy_jump}
                          for h in chosen], indent=2))
        return
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("host", "address", "port", "user", "groups", "repo", "via"):
        table.add_column(col)
    for h in chosen:
        table.add_row(escape(h.name), escape(h.address), str(h.port), escape(h.user), escape(",".join(h.groups)),
                      escape(h.repo), escape(h.proxy_jump or ""))
    console.print(table)


@inventory_app.command("check")
def inventory_check(ctx: typer.Context) -> None:
    """Validate the inventory and every playbook its `patches:` names: exit 0 when all is fine, 2 with file:line
    when not."""
    from ddops.patching.playbook import load_inventory_playbooks

    inventory = state(ctx).load_inventory()
    books = load_inventory_playbooks(inventory) if inventory.patches else []
    patches = f"; patches: {', '.join(b.name for b in books)}" if books else ""
    console.print(f"{escape(inventory.path)}: ok ({len(inventory.hosts)} hosts, "
                  f"{len(inventory.groups)} groups{escape(patches)})")


# How long the login shell takes before running a command: with the rc files vs without (bash only).
SHELL_PROBE = (
    's=$(date +%s%N); SHLVL=0 "$SHELL" -c true </dev/null >/dev/null 2>&1; m=$(date +%s%N); '
    'case "$SHELL" in *bash) "$SHELL" --norc --noprofile -c true </dev/null >/dev/null 2>&1;; esac; '
    'e=$(date +%s%N); echo "$((m-s)) $((e-m))"'
)


def ping_task(host: Any, session: Any) -> Any:
    from ddops.fleet import TaskOutcome

    facts = session.call_agent("facts", {"repo": host.repo})
    # Timed on a channel opened after the first: the first one on a connection pays a one-off setup delay.
    rtt = session.run("true", timeout=host.connect_timeout).duration
    probe = session.run(SHELL_PROBE, timeout=host.connect_timeout)
    overhead = None
    try:
        with_rc, without_rc = (int(x) / 1e9 for x in probe.stdout.split())
        overhead = max(0.0, with_rc - without_rc) if without_rc else None
    except ValueError:
        pass
    data = {"rtt_s": round(rtt, 4), "shell_rc_overhead_s": None if overhead is None else round(overhead, 4), **facts}
    message = ""
    if overhead is not None and overhead > 0.05:
        message = f"the login shell's rc files add {overhead * 1000:.0f} ms to every command"
    return TaskOutcome("ok", message, data)


def ping(ctx: typer.Context, host: HostOpt = None, group: GroupOpt = None, all_: AllOpt = False,
         limit: LimitOpt = None, json_out: JsonOpt = False, forks: ForksOpt = None) -> None:
    """Connect to the selected hosts and report hostname, OS, python, GPUs, free disk and round-trip time."""
    st = state(ctx)
    st.json = st.json or json_out
    inventory, chosen = selected_hosts(st, host, group, all_, limit)
    results = fleet_run(st, inventory, chosen, ping_task, title="ping", forks=forks)
    if st.json:
        emit_json("ping", results)
    else:
        recap(results, columns=[
            ("hostname", lambda r: str(r.data.get("hostname", ""))),
            ("os", lambda r: str(r.data.get("os", ""))),
            ("python", lambda r: str(r.data.get("python", ""))),
            ("gpus", lambda r: _gpus(r.data) if r.data else ""),
            ("free disk", lambda r: _gib(r.data.get("disk_free_bytes"))),
            ("rtt", lambda r: f"{r.data['rtt_s'] * 1000:.1f} ms" if "rtt_s" in r.data else ""),
            ("shell rc", lambda r: f"{r.data['shell_rc_overhead_s'] * 1000:.0f} ms"
             if r.data.get("shell_rc_overhead_s") is not None else ""),
        ])
    finish(results)


def _gpus(data: dict) -> str:
    gpus = data.get("gpus") or []
    if not gpus:
        return "no GPU"
    names = [g.get("name", "?") if isinstance(g, dict) else str(g) for g in gpus]
    first = names[0]
    return f"{len(names)}x {first}" if all(n == first for n in names) else ", ".join(names)


def _gib(value: Any) -> str:
    return f"{value / 2**30:.1f} GiB" if isinstance(value, (int, float)) else ""
