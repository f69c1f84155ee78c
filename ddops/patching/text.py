"""Planning without a parser: the text kinds (text_replace) and the UTF-8 check every plan makes first."""

from __future__ import annotations

import dataclasses

from ddops.patching.kinds import ERROR, Outcome, decide, describe


def utf8_error(path: str, source: bytes) -> Outcome | None:
    """An error outcome when source is not UTF-8 (ddops edits UTF-8 only), else None."""
    try:
        source.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = source[: exc.start].count(b"\n") + 1
        return Outcome(ERROR, f"{path}:{line}: not valid UTF-8 (byte {exc.start}): ddops edits UTF-8 files only")
    return None


def text_replace(source: bytes, old: str, new: str, expect: int, path: str) -> tuple[Outcome, bytes]:
    """Exact text `old` -> `new`; an occurrence of `new` is an applied site. Keeps the file's CRLF line endings."""
    error = utf8_error(path, source)
    if error is not None:
        return dataclasses.replace(error, plain_text=True, expected=expect), source
    text = source.decode("utf-8")
    first_nl = text.find("\n")
    if first_nl > 0 and text[first_nl - 1] == "\r":
        old, new = _crlf(old), _crlf(new)
    olds = _spans(text, old)
    news = _spans(text, new)
    pending = [o for o in olds if not any(n[0] <= o[0] and o[1] <= n[1] for n in news)]
    applied = [n for n in news if not any(o[0] <= n[0] and n[1] <= o[1] for o in pending)]

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    outcome = decide(path, describe("text_replace", {"old": old}), [line(s) for s, _ in pending],
                     [line(s) for s, _ in applied], expect, plain_text=True)
    if not outcome.changes:
        return outcome, source
    parts: list[str] = []
    pos = 0
    for start, end in pending:
        parts.append(text[pos:start])
        parts.append(new)
        pos = end
    parts.append(text[pos:])
    return outcome, "".join(parts).encode("utf-8")


def _crlf(s: str) -> str:
    return s.replace("\r\n", "\n").replace("\n", "\r\n")


def _spans(text: str, needle: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    start = text.find(needle)
    while start != -1:
        out.append((start, start + len(needle)))
        start = text.find(needle, start + len(needle))
    return out
