"""A trace's failure and embedded source text, as the manifest stores them."""

from __future__ import annotations

from tracing.record import Failure, SourceLocation

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
        raise ValueError(f"the manifest's failure names steps[{step!r}], not a step of the trace")
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
