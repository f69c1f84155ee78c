"""The pure patch core: transforms (libcst), planning with a content-hash cache, checks, journal and rollback plans.

Importing this package stays cheap: libcst is loaded only with `ddops.patching.transforms`, which plan.py imports
only when splice.py's stdlib fast path declines a transform. The names below are re-exported lazily so
`from ddops.patching import Planner` works without loading libcst up front.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Outcome": "kinds", "STATES": "kinds", "PENDING": "kinds", "APPLIED": "kinds", "PARTIAL": "kinds",
    "DRIFTED": "kinds", "AMBIGUOUS": "kinds", "ERROR": "kinds", "BLOCKED": "kinds",
    "FilePlan": "plan", "HostPlan": "plan", "PatchResult": "plan", "Planner": "plan", "DiffGroup": "plan",
    "plan_file": "plan", "plan_host": "plan", "group_diffs": "plan",
    "CheckResult": "checks", "run_checks": "checks", "host_checks": "checks",
    "active_applications": "journal", "patch_state": "journal", "plan_rollback": "journal",
    "RollbackPlan": "journal", "rollback_entries": "journal", "modified_files": "journal",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"ddops.patching.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'ddops.patching' has no attribute {name!r}")
