"""`python3 -m ddops_agent < request.json` (from remote/): the agent without the bootstrap, for tests and debugging.

Not shipped: the bootstrap imports the package's other modules and calls protocol.main() itself."""

import os
import sys

from ddops_agent import protocol

# Every module of the package registers its verbs when imported, as the bootstrap imports them all.
for _name in sorted(os.listdir(os.path.dirname(os.path.abspath(__file__)))):
    if _name.endswith(".py") and not _name.startswith("_"):
        __import__("ddops_agent." + _name[:-3])

protocol.main()
sys.exit(0)
