"""SSH transport: the only place that imports paramiko.

connector (opens sessions: host keys, sockets, ProxyJump chains) -> session (commands, files, agent calls) ->
agent_client (the agent's line protocol) -> channel (the one channel reader); hostkeys, sockets, streamlocal
(paramiko's private API, nowhere else) and resident (the book of resident agents) beside them.
"""

import logging

from ddops.transport.channel import CommandResult
from ddops.transport.connector import Connector
from ddops.transport.session import Session

# paramiko logs what it also raises (a refused channel is an ERROR record); with no handler configured, Python would
# print those on stderr. ddops reports failures itself, in one line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

__all__ = ["CommandResult", "Connector", "Session"]
