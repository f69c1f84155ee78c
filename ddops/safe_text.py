"""Text from hosts and result files made safe to show: no control character reaches a terminal or a spreadsheet.

A host's answer, a command's output or a result file's strings may hold escape sequences (`ESC ] 0 ; title BEL`,
`ESC [ 2 J`, OSC 52 clipboard writes, C1 CSI): shown raw, a hostile host could clear the screen, draw a fake recap or
write the clipboard. The CLI passes every such string through `printable` where it renders (rich markup, plain
lines, report tables) and CSV output through `csv_safe`."""

from __future__ import annotations

import re

# C0 controls but tab (newline kept apart), DEL, and the C1 controls (U+0080..U+009F: U+009B is a one-character CSI).
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_SHOWN = {code: f"\\x{code:02x}" for code in (*range(0x00, 0x09), *range(0x0a, 0x20), *range(0x7f, 0xa0))}
_SHOWN_BUT_NEWLINE = {code: shown for code, shown in _SHOWN.items() if code != 0x0a}
# Cells a spreadsheet would read as a formula (OWASP, "CSV Injection"): `=`, `+`, `-`, `@`, and tab or CR before one.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.IGNORECASE)


def printable(text: str, *, newlines: bool = True) -> str:
    """`text` with each control character but tab (and newline, unless `newlines` is False) written as `\\xNN`."""
    if _CONTROLS.search(text) is None:
        return text
    return text.translate(_SHOWN_BUT_NEWLINE if newlines else _SHOWN)


def one_line(text: str) -> str:
    """`printable`, newlines included: a line that cannot pass itself off as two."""
    return printable(text, newlines=False)


def csv_cell(value: str) -> str:
    """A CSV cell that a spreadsheet reads as text: printable, and a leading `'` where it would start a formula
    (numbers, negative ones included, stay numbers)."""
    value = printable(value)
    if value.startswith(_FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def csv_safe(text: str) -> str:
    """CSV text with every cell passed through `csv_cell` (rows and quoting as the csv module writes them)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in csv.reader(io.StringIO(text, newline="")):
        writer.writerow([csv_cell(cell) for cell in row])
    return out.getvalue()
