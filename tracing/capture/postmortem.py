"""What a trace keeps so it can be read later, elsewhere: the failure and the source text.

- :func:`failure_of` turns the exception a forward pass raised into a
  :class:`~tracing.record.Failure` (failing step, raising line, type, message).
- :func:`embed_sources` collects the text of the files the steps point at (and the
  raising line's file), so a trace opened on another machine, or after the file was
  edited, still shows the code that ran. The total is capped (:data:`SOURCES_CAP`); the
  files the most steps point at go first.
"""

from __future__ import annotations

import linecache
from collections import Counter
from collections.abc import Sequence

from tracing.capture.source import location_from_traceback
from tracing.record import Failure, SourceLocation, Step
from tracing.safe_text import exception_message

SOURCES_CAP = 2 * 1024 * 1024
"""Bytes of source text one trace embeds at most (UTF-8)."""
_JOINED: dict[str, tuple[list[str], str, int]] = {}  # file -> (linecache's lines, text, bytes)


def failure_of(step: int, exc: BaseException, tb, fallback: SourceLocation | None) -> Failure:
    """The failure record for ``exc`` raised at ``step``: its line is the innermost frame of
    user code in the traceback (where a ``NameError`` happened, even off any op), else the
    failing step's own line."""
    location = location_from_traceback(tb) or fallback
    message = exception_message(exc)  # safe when exc's __str__ itself raises
    return Failure(step=step, location=location, type=type(exc).__name__, message=message)


def embed_sources(
    steps: Sequence[Step], failure: Failure | None = None, cap: int = SOURCES_CAP
) -> dict[str, str]:
    """``{file: text}`` for the files the steps (and the failure) point at, up to ``cap``
    bytes in all. Files that cannot be read (``<stdin>``, a deleted file) are left out."""
    counts: Counter[str] = Counter()
    for step in steps:
        if step.source is not None:
            counts[step.source.file] += 1
    if failure is not None and failure.location is not None:
        counts[failure.location.file] += len(steps) + 1  # always first
    out: dict[str, str] = {}
    used = 0
    for file, _ in counts.most_common():
        if file.startswith("<"):
            continue
        linecache.checkcache(file)
        lines = linecache.getlines(file)
        joined = _JOINED.get(file)
        if joined is None or joined[0] is not lines:  # linecache re-read it: join again
            text = "".join(lines)
            joined = _JOINED[file] = (lines, text, len(text.encode("utf-8", "replace")))
        _, text, size = joined
        if not text or used + size > cap:
            continue
        out[file] = text
        used += size
    return out
