"""pyinfra anchor deploy: files.replace with backup on both files, then a grep check."""

import json
import os

from pyinfra.operations import files, server

with open(os.environ["FANOUT_SPEC"], encoding="utf-8") as _fh:
    _spec = json.load(_fh)

for _name in _spec["files"]:
    files.replace(
        name=f"hybrid-cache {_name}",
        path=f"{_spec['repo']}/{_name}",
        text=_spec["sed_old"],
        replace=_spec["sed_new"],
        backup=True,
    )

server.shell(name="grep check", commands=[_spec["grep_command"]])
