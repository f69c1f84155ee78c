"""Everything that talks to hosts: per-host task bodies for the fleet runner (patch, sync, bench).

A task is `(host, session) -> TaskOutcome`; the session is an AgentSession (ddops/tasks/base.py). The decisions
live in the pure layers below (ddops/patching/, ddops/bench/); these modules only ask the hosts and act."""
