"""str enums for states that travel as text (JSON, journals, messages): enum.StrEnum is Python 3.11+."""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A member is its value wherever text is expected: equal to it, printed, formatted and JSON-encoded as it."""

    __str__ = str.__str__
    __format__ = str.__format__
