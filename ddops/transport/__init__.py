"""SSH transport: the only place that imports paramiko (and fabric)."""

from ddops.transport.session import CommandResult, Connector, Session

__all__ = ["CommandResult", "Connector", "Session"]
