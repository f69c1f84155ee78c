"""Plans kept on disk between runs (the controller's cache dir), keyed by content, patches and the planning code.

The disk side of ddops/patching/plan.py, which stays pure: a Planner is handed a PlanStore (or none)."""

from __future__ import annotations

import base64
import hashlib
import json
from contextlib import suppress
from pathlib import Path

from ddops import settings
from ddops.cache import cache_root, write_private
from ddops.patching.kinds import Outcome
from ddops.patching.plan import FilePlan, PatchResult, sha256


def _code_version() -> str:
    """Plans cached on disk are only valid for the code that made them: hash the planning code itself."""
    here = Path(__file__).resolve().parent  # the patching folder: the code whose output is cached
    digest = hashlib.sha256()
    for name in ("plan.py", "plan_store.py", "transforms.py", "prefilter.py", "text.py", "kinds.py", "playbook.py"):
        try:
            digest.update((here / name).read_bytes())
        except OSError:
            digest.update(name.encode())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path | None:
    """$DDOPS_CACHE_DIR/plans or ~/.cache/ddops/plans; None when DDOPS_PLAN_CACHE=0."""
    return None if settings.PLAN_CACHE.value() == "0" else cache_root() / "plans"


class PlanStore:
    """FilePlans on disk, keyed by (content sha256, patches, planning code): reruns skip libcst entirely.

    Entries are our own (written by this user) but still checked: a corrupt or mismatching entry is recomputed."""

    def __init__(self, root: Path) -> None:
        self.root = root / _code_version()

    def _file(self, key: tuple[str | None, str]) -> Path:
        return self.root / f"{key[0] or 'missing'}-{key[1]}.json"

    def load(self, key: tuple[str | None, str], path: str, source: bytes) -> FilePlan | None:
        if key[0] is None:
            return None
        try:
            raw = json.loads(self._file(key).read_text())
            new = base64.b64decode(raw["new_b64"]) if raw.get("new_b64") is not None else None
            results = tuple(PatchResult(r["patch_id"], Outcome(
                state=r["state"], message=r["message"], pending_lines=tuple(r["pending_lines"]),
                applied_lines=tuple(r["applied_lines"]), expected=r["expected"], plain_text=r["plain_text"]))
                for r in raw["results"])
            if raw["path"] != path or raw["before_sha"] != key[0]:
                return None
            if new is None and raw["after_sha"] == raw["before_sha"]:
                new = source  # unchanged: the new bytes are the file's own
            elif new is None or sha256(new) != raw["after_sha"]:
                return None
            return FilePlan(path, raw["before_sha"], raw["after_sha"], new, results, raw["diff"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, key: tuple[str | None, str], plan: FilePlan) -> None:
        if key[0] is None:
            return
        raw = {"path": plan.path, "before_sha": plan.before_sha, "after_sha": plan.after_sha, "diff": plan.diff,
               "new_b64": base64.b64encode(plan.new).decode() if plan.changed and plan.new is not None else None,
               "results": [{"patch_id": r.patch_id, **r.outcome.to_dict()} for r in plan.results]}
        with suppress(OSError):  # a cache that cannot be written only costs speed
            write_private(self._file(key), json.dumps(raw).encode())  # 0600 in 0700 folders: diffs of host files


def default_store() -> PlanStore | None:
    """The PlanStore of the default cache dir, or None when the plan cache is turned off."""
    root = default_cache_dir()
    return PlanStore(root) if root is not None else None
