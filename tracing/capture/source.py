"""Find the line of *user* code that made a call, cheaply.

A step's source location is the innermost frame that is neither inside ``torch`` nor
inside ``tracing`` itself: for ``F.softmax(scores, dim=-1)`` in a model file that is the
model's line, not ``torch/nn/functional.py``. Walking frames with ``sys._getframe`` costs
well under a microsecond per frame; ``inspect.stack()`` would read every source file on
every call, so it is never used. Both "is this frame ours to skip?" (per code object) and
the resulting :class:`SourceLocation` (per code object and line) are cached.
"""

from __future__ import annotations

import linecache
import os
import sys
from types import CodeType, FrameType

import torch

from tracing.capture import tool_frames
from tracing.record import SourceLocation

# --------------------------------------------------------------------------- which frames


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TRACING_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # tracing/

# Wrappers that only forward a module call (``Module.__call__`` and subclasses' overrides)
_CALL_WRAPPERS = frozenset({"__call__", "_call_impl", "_wrapped_call_impl"})

# Keyed by id(code): hashing a code object hashes its bytecode and constants on every
# call, which made this lookup the most expensive part of recording a step. The code
# objects themselves are kept alive in _codes, so an id is never reused.
_skip_code: dict[int, int] = {}
_codes: list[CodeType] = []
_locations: dict[tuple[int, int], SourceLocation] = {}


_TOOL = 2  # a _skip_code value: the tool's own code (tracing.tool_frames), the walk ends


def _is_library_code(code: CodeType) -> int:
    """1 for code in torch/ or tracing/ and for ``__call__`` forwarding wrappers, 2 (also
    true) for the tool's own code, 0 for user code."""
    skip = _skip_code.get(id(code))
    if skip is None:
        filename = code.co_filename
        if not filename.startswith("<"):
            filename = os.path.abspath(filename)
        skip = int(
            filename.startswith(_TORCH_DIR)
            or filename.startswith(_TRACING_DIR)
            or code.co_name in _CALL_WRAPPERS
        )
        if not skip and any(filename.startswith(d) for d in tool_frames.DIRS):
            skip = _TOOL
        _codes.append(code)
        _skip_code[id(code)] = skip
    return skip


# --------------------------------------------------------------------------- lookup


def location_of(frame: FrameType | None) -> SourceLocation | None:
    """The :class:`SourceLocation` of ``frame``'s current line (cached per code and line)."""
    if frame is None:
        return None
    code = frame.f_code
    key = (id(code), frame.f_lineno)
    loc = _locations.get(key)
    if loc is None:
        _is_library_code(code)  # keeps the code object alive, so its id stays unique
        line = frame.f_lineno or 0
        text = linecache.getline(code.co_filename, line).strip() if line else ""
        loc = SourceLocation(file=code.co_filename, line=line, text=text, function=code.co_name)
        _locations[key] = loc
    return loc


_by_instruction: dict[tuple[int, int], SourceLocation | None] = {}


def caller_location(start: int = 1) -> SourceLocation | None:
    """Source location of the user code that called the function ``start`` frames up.

    The hot path of the tracer: one dict lookup per frame walked, then one keyed by the
    frame's current instruction (``f_lasti`` is free; ``f_lineno`` decodes a line table).
    """
    try:
        frame: FrameType | None = sys._getframe(start + 1)
    except ValueError:  # pragma: no cover - not that deep
        return None
    skip = _skip_code
    while frame is not None:
        code = frame.f_code
        flag = skip.get(id(code))
        if flag is None:
            flag = _is_library_code(code)
        if not flag:
            key = (id(code), frame.f_lasti)
            loc = _by_instruction.get(key)
            if loc is None:
                loc = _by_instruction[key] = location_of(frame)
            return loc
        if flag == _TOOL:  # the tool called the model: no user line
            return None
        frame = frame.f_back
    return None


def location_from_traceback(tb) -> SourceLocation | None:
    """The innermost user frame of a traceback: where a forward pass raised."""
    best = None
    while tb is not None:
        if not _is_library_code(tb.tb_frame.f_code):
            best = tb
        tb = tb.tb_next
    if best is None:
        return None
    code = best.tb_frame.f_code
    line = best.tb_lineno
    text = linecache.getline(code.co_filename, line).strip()
    return SourceLocation(file=code.co_filename, line=line, text=text, function=code.co_name)
