#!/usr/bin/env bash
# The fleet-speed measurement's anchors (the pyproject extra `bench-anchors`) in a venv of their own, which run.py finds:
# pyinfra 3.x requires paramiko < 5, and ddops' own venv runs paramiko 5.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check "ansible-core>=2.17" "pyinfra>=3"
.venv/bin/python -c 'import importlib.metadata as m; print("ansible-core", m.version("ansible-core"), "pyinfra", m.version("pyinfra"))'
# The Fabric row runs in ddops' own venv (same paramiko as ddops), from the optional extra `fabric`.
if [ -x ../../.venv/bin/pip ]; then
  ../../.venv/bin/pip install -q --disable-pip-version-check "fabric>=3.2"
fi
