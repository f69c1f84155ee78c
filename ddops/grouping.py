"""Views that scale with the fleet: hosts in natural order (host2 before host10), items with identical content
grouped into one entry, and a group's host names written short (`host[1-12,14]`). Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

_DIGITS = re.compile(r"(\d+)")
_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def natural_key(text: str) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """Sort key reading digit runs as numbers: host2 < host10 < hostb; equal numbers compare by their text."""
    parts: list[tuple[int, int | str]] = []
    for i, part in enumerate(_DIGITS.split(text)):
        if i % 2:
            parts += [(0, int(part)), (0, len(part))]
        elif part:
            parts.append((1, part.lower()))
    return tuple(parts), text


def natural_sorted(items: Iterable[T], key: Callable[[T], str] = str) -> list[T]:
    return sorted(items, key=lambda item: natural_key(key(item)))


def group_identical(items: Iterable[T], key: Callable[[T], K]) -> list[tuple[K, list[T]]]:
    """(key, the items with it) for every distinct key, in the order each key first comes."""
    groups: dict[K, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.items())


def host_ranges(names: Sequence[str]) -> str:
    """`host1, host2, host3, host5, gpu-a` -> `gpu-a, host[1-3,5]`: names that differ only in one number, with the
    same zero padding, folded into ranges; every name is still there to read."""
    numbered: dict[tuple[str, str, int], list[int]] = {}
    plain: list[str] = []
    for name in names:
        found = _LAST_NUMBER.match(name)
        if not found:
            plain.append(name)
            continue
        prefix, digits, suffix = found.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        numbered.setdefault((prefix, suffix, width), []).append(int(digits))
    out = [(name, name) for name in plain]
    for (prefix, suffix, width), numbers in numbered.items():
        numbers = sorted(set(numbers))
        first = f"{prefix}{numbers[0]:0{width}d}{suffix}"
        if len(numbers) == 1:
            out.append((first, first))
            continue
        spans = []
        start = previous = numbers[0]
        for n in numbers[1:] + [None]:
            if n is not None and n == previous + 1:
                previous = n
                continue
            spans.append(f"{start:0{width}d}" if start == previous else f"{start:0{width}d}-{previous:0{width}d}")
            if n is not None:
                start = previous = n
        out.append((first, f"{prefix}[{','.join(spans)}]{suffix}"))
    return ", ".join(shown for _, shown in natural_sorted(out, key=lambda pair: pair[0]))


def hosts_cell(names: Sequence[str], among: int | None = None) -> str:
    """A group's hosts as one cell: `host[1-3,7]` with its count bound to it by a no-break space (`host[1-3,7] (4)`,
    which a wrapped table cell keeps on one line), or `all 24 hosts` when the group is every one of `among`."""
    if among is not None and among > 1 and len(names) == among:
        return f"all {among} hosts"
    return host_ranges(names) + (f"\u00a0({len(names)})" if len(names) > 1 else "")


def words(text: str) -> list[str]:
    """The words a table cell may wrap between: split at spaces and newlines, never at a no-break space."""
    return [w for w in text.replace("\n", " ").split(" ") if w]


def columns_fit(rows: Sequence[Sequence[str]], width: int, *, per_column: int = 3, frame: int = 1) -> bool:
    """Whether a table of these rows (the header first) fits `width` without cutting a word: each column as wide as
    its longest word, plus its padding and rule (`per_column`) and the table's outer rule (`frame`)."""
    if not rows:
        return True
    needed = [max((len(word) for row in rows for word in words(row[i] if i < len(row) else "")), default=0)
              for i in range(max(len(row) for row in rows))]
    return sum(needed) + per_column * len(needed) + frame <= width
