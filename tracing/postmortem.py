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

from tracing.record import Failure, SourceLocation, Step, Trace
from tracing.safe_text import exception_message
from tracing.source import location_from_traceback

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


# --------------------------------------------------------------------------- in the file


def failure_to_json(failure: Failure | None) -> dict | None:
    """The manifest's ``failure`` entry (``None`` for a complete trace)."""
    if failure is None:
        return None
    loc = failure.location
    return {
        "step": failure.step,
        "location": None if loc is None else [loc.file, loc.line, loc.text, loc.function],
        "type": failure.type,
        "message": failure.message,
    }


def failure_from_json(v: object, n_steps: int) -> Failure | None:
    """Read a manifest's ``failure`` back; ``ValueError`` naming what is wrong."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError("the manifest's failure is not a JSON object")
    step, loc = v.get("step"), v.get("location")
    kind, message = v.get("type"), v.get("message")
    if type(step) is not int or not 0 <= step < max(n_steps, 1):
        raise ValueError(f"the manifest's failure names step {step!r}, not a step of the trace")
    if not isinstance(kind, str) or not isinstance(message, str):
        raise ValueError("the manifest's failure type or message is not text")
    location = None
    if loc is not None:
        if not (
            isinstance(loc, list)
            and len(loc) == 4
            and isinstance(loc[0], str)
            and type(loc[1]) is int
            and isinstance(loc[2], str)
            and isinstance(loc[3], str)
        ):
            raise ValueError("the manifest's failure location is not [file, line, text, function]")
        location = SourceLocation(file=loc[0], line=loc[1], text=loc[2], function=loc[3])
    return Failure(step=step, location=location, type=kind, message=message)


def sources_from_json(v: object) -> dict[str, str]:
    """Read a manifest's ``source_files`` back (absent in older files: empty)."""
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(
        isinstance(k, str) and isinstance(t, str) for k, t in v.items()
    ):
        raise ValueError("the manifest's source_files is not a map of file names to text")
    return dict(v)


# --------------------------------------------------------------------------- reading it


def failure_lines(trace: Trace, index: int | None = None) -> list[str]:
    """The post-mortem of ``trace`` in a few lines, for the step at ``index`` (default: the
    failing step; ``[]`` for any other step or a complete trace)::

        NameError: name 'F' is not defined
        at tutorial.py:26 in scaled_dot_product_attention
            attention_weights = F.softmax(scores, dim=-1)
        inputs:  a (B=2, T=3)  ·  b (4, 5)

    The inputs line lists what the failing step was given, shapes and dims side by side
    (the two operands of a ``matmul`` that did not fit).
    """
    failure = trace.failure
    if failure is None or (index is not None and index != failure.step):
        return []
    lines = [str(failure)]
    loc = failure.location
    if loc is not None:
        name = loc.file.replace("\\", "/").rsplit("/", 1)[-1]
        where = f"at {name}:{loc.line}" + (f" in {loc.function}" if loc.function else "")
        lines.append(where)
        if loc.text:
            lines.append(f"    {loc.text}")
    step = trace.steps[failure.step]
    if step.inputs:
        names = step.input_names or tuple(f"input {i}" for i in range(len(step.inputs)))
        parts = [
            f"{name} {trace.tensors[tid].shape_str()}"
            for name, tid in zip(names, step.inputs)
            if trace.tensors[tid].role not in ("param", "buffer")
        ]
        if parts:
            lines.append("inputs:  " + "  ·  ".join(parts))
    return lines
