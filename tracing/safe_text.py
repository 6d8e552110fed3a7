"""Text from a file made inert before it reaches a person: a terminal, a report, a
spreadsheet. The one module every report and the command line use for it.

A trace file is anyone's: its module names, ops, source lines, error text and meta are
bytes a stranger chose. Three things keep them harmless:

- :func:`inert` escapes control characters (C0, DEL, C1, bidirectional overrides, line
  and paragraph separators) as ``\\x1b`` / ``\\u202e``, so ESC sequences cannot clear or
  retitle a terminal and CR cannot hide a row; :func:`inert_document` does the same to a
  whole rendered document but keeps its own newlines and tabs. With ``json=True`` the
  escapes are JSON's ``\\u001b`` form, so a JSON document stays valid and means the same.
- :func:`cut` bounds a string at ``limit`` characters with a marker naming how much was
  cut, so one long source line shared by many steps makes a report linear in the trace.
- :func:`csv_cell` neutralises a cell a spreadsheet would evaluate (a leading ``=``,
  ``+``, ``-``, ``@``, tab or CR) with a leading ``'``; a number stays a number.

>>> inert("a\\x1b[2Jb")
'a\\\\x1b[2Jb'
>>> csv_cell("=HYPERLINK(1)"), csv_cell("-1.5")
("'=HYPERLINK(1)", '-1.5')
"""

from __future__ import annotations

import math
import re

CUT_AT = 240
"""Default longest string a report shows in one cell (source lines, names, errors)."""

_CONTROL = "\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_ALL_CONTROLS = re.compile(f"[{_CONTROL}]")
_DOCUMENT_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f" + _CONTROL.removeprefix("\x00-\x1f") + "]")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def inert(text: str) -> str:
    """``text`` with every control character escaped (newlines and tabs too)."""
    if _ALL_CONTROLS.search(text) is None:
        return text
    return _ALL_CONTROLS.sub(_escape, text)


def inert_document(text: str, *, json: bool = False) -> str:
    """A rendered document with control characters escaped, its newlines and tabs kept;
    ``json``: in the ``\\u001b`` form (valid inside a JSON string, where only raw control
    characters can be: JSON escapes C0 itself, not C1 or bidi overrides)."""
    if _DOCUMENT_CONTROLS.search(text) is None:
        return text
    return _DOCUMENT_CONTROLS.sub(_json_escape if json else _escape, text)


def cut(text: str, limit: int = CUT_AT) -> str:
    """``text`` up to ``limit`` characters, then a marker naming how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters cut]"


def shown(text: str, limit: int = CUT_AT) -> str:
    """``text`` cut and made inert: how a report shows a string from a file."""
    return inert(cut(text, limit))


def csv_cell(value: object) -> object:
    """``value`` as a spreadsheet may safely read it: a string that would start a formula
    gets a leading ``'``, unless it is a plain number (``-1.5``, ``+3``); other values as
    they are."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_START):
        return value
    if _is_number(value):
        return value
    return "'" + value


def _is_number(text: str) -> bool:
    try:
        number = float(text)
    except ValueError:
        return False
    return math.isfinite(number) or text.strip().lstrip("+-").lower() in ("inf", "nan")


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, or a note saying it cannot be shown when its ``__str__`` raises (a
    hostile or broken exception class must not take the partial trace down with it)."""
    try:
        text = str(exc)
    except Exception:
        return f"<{type(exc).__name__}: its message cannot be shown>"
    return text if isinstance(text, str) else f"<{type(exc).__name__}>"


def exception_text(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc``, safe whatever its ``__str__`` does."""
    return f"{type(exc).__name__}: {exception_message(exc)}"
