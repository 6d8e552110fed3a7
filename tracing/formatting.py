"""How shapes and numbers read, the same in every report, diff, table and badge.

>>> format_shape((1, 4, 12))
'(1, 4, 12)'
>>> format_shape((1, 4, 12), ("B", "H", "T"))
'(B=1, H=4, T=12)'
>>> dims_label((1, 12, 64), ("B", "T", "?"))
'(B, T, 64)'
>>> format_number(0.000123456), format_number(12345.0), format_number(7), format_number(None)
('0.0001235', '1.234e+04', '7', '–')

Step numbers
------------
A step has two numbers and each has one use. Its *number*, what a person reads and types,
counts from 1: step 1 is the first step of a trace, as the app's step bar ("Step 5 / 184"),
Ctrl+G and find's ``#5`` count, and so do every command's output, every report format,
error lines and ``meta["stopped_at"]["step"]``. Its *index* counts from 0, as Python does:
``trace.steps[i]``, ``Step.index``, a hit's ``.step``, and what a file stores to point at a
step (``parent``, ``end``, ``meta["stopped_at"]["index"]``, a collective's ``index``); an
error about the file names that place as ``steps[i]``. :func:`step_number` and
:func:`step_index` turn one into the other; nothing else adds or subtracts the 1.

>>> step_number(4), step_index(5), step_text(4)
(5, 4, 'step 5')
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MISSING = "–"


def format_shape(shape: Sequence[int] | None, dims: Sequence[str] | None = None) -> str:
    """``(1, 4, 12)``; with one dim name per axis ``(B=1, H=4, T=12)``; ``–`` for None."""
    if shape is None:
        return MISSING
    if dims and len(dims) == len(shape):
        return "(" + ", ".join(map("{}={}".format, dims, shape)) + ")"
    return "(" + ", ".join(map(str, shape)) + ")"  # (a report formats one per tensor seen)


def dims_label(shape: Sequence[int], dims: Sequence[str] | None) -> str:
    """``(B, T, C)``: the dim names where known, the size where an axis is unnamed (``?``)."""
    if dims and len(dims) == len(shape):
        return "(" + ", ".join(d if d and d != "?" else str(s) for d, s in zip(dims, shape)) + ")"
    return format_shape(shape)


def format_number(value: float | None, digits: int = 4, missing: str = MISSING) -> str:
    """``digits`` significant digits (``0.0001235``, ``1.234e+04``); integers exactly;
    ``nan``, ``inf``, ``-inf`` as such; ``missing`` for None."""
    if value is None:
        return missing
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    if math.isnan(value):
        return "nan"
    return f"{value:.{digits}g}"


# --------------------------------------------------------------------------- step numbers


def step_number(index: int) -> int:
    """The number people read for the step at ``trace.steps[index]``: 1-based."""
    return index + 1


def step_index(number: int) -> int:
    """The index into ``trace.steps`` of step ``number`` (as typed or printed): 0-based."""
    return number - 1


def step_text(index: int) -> str:
    """``step 5`` for ``trace.steps[4]``: how a message names a step."""
    return f"step {step_number(index)}"


__all__ = [
    "MISSING",
    "dims_label",
    "format_number",
    "format_shape",
    "step_index",
    "step_number",
    "step_text",
]
