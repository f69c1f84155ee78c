"""str enums for states that travel as text (JSON, journals, messages): enum.StrEnum is Python 3.11+."""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A member is its value wherever text is expected: equal to it, printed, formatted and JSON-encoded as it."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)
