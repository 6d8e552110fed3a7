"""Markdown for the text reports (``report``, ``rank_report``, ``trace_diff``): table cells
that cannot break the table, inline code, and a table from a header and rows.

A cell of a Markdown table ends at an unescaped ``|`` and a row at a newline, so every
piece of recorded text (module names, source lines, error messages) goes through
:func:`escape` or :func:`code` before it lands in a cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def escape(text: str) -> str:
    """``text`` safe inside a table cell: backslashes and ``|`` escaped, newlines spaces."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def code(text: str) -> str:
    """``text`` as inline code in a table cell (plain escaped text if it holds a backtick,
    which would end the code span); "" stays ""."""
    if not text:
        return ""
    if "`" in text:
        return escape(text)
    return "`" + text.replace("|", "\\|").replace("\n", " ") + "`"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a table: the header, the ``---`` rule, a line per row (cells as given:
    escape them first)."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += map(row, rows)
    return out


def row(cells: Sequence[str]) -> str:
    """One row of a table (the lines after :func:`table`'s header, one at a time)."""
    return "| " + " | ".join(cells) + " |"
