"""Values whose JSON is their fields: a report's keys are spelled once, as its field names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, fields
from typing import Any

# A field's metadata: the key is left out of the JSON while the field is None (a key some outcomes never have).
OMIT_NONE = {"omit_none": True}


def omitted_when_none() -> Any:
    """A field that defaults to None and is then left out of the JSON."""
    return field(default=None, metadata=OMIT_NONE)


class JsonValue:
    """Mixin for a frozen dataclass whose to_json() is its fields by name, nested values converted; a subclass that
    adds keys derived from its fields spells them in its own to_json()."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None or not f.metadata.get("omit_none"):
                out[f.name] = plain(value)
        return out

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Any:
        """The value of a host's answer that has its fields' keys (those it lacks are None)."""
        return cls(**{f.name: answer.get(f.name) for f in fields(cls)})  # type: ignore[arg-type]


def plain(value: Any) -> Any:
    """value as JSON takes it: values by their to_json(), tuples as lists, mappings with their values converted."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value
