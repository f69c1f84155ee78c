"""Where ddops keeps its own files on the controller."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$DDOPS_CACHE_DIR, else $XDG_CACHE_HOME/ddops, else ~/.cache/ddops."""
    explicit = os.environ.get("DDOPS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "ddops"
