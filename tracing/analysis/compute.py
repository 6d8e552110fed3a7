"""Mult-adds and parameters per module, as a trace keeps them (``trace.meta["compute"]``,
written by :func:`tracing.runs.compute.attach` from ``torchinfo.summary``); read here for
the report and the app, without the model. Only leaf modules' parameter work is counted
(torchinfo's rule): bare tensor ops such as attention's ``q @ k.T`` are not in the figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tracing.record import Trace

NOTE = "mult-adds as torchinfo counts them: leaf modules' parameters × output batch"


def compute_of(trace: Trace) -> dict[str, tuple[int, int]]:
    """``{module path: (mult_adds, params)}`` of the subtree, or {} when the trace has none."""
    data = trace.meta.get("compute")
    if not isinstance(data, dict):
        return {}
    out: dict[str, tuple[int, int]] = {}
    modules = data.get("modules")
    if not isinstance(modules, dict):
        return {}
    for path, pair in modules.items():
        try:
            out[str(path)] = (int(pair[0]), int(pair[1]))
        except (TypeError, ValueError, IndexError):
            continue
    return out


def format_mult_adds(n: int) -> str:
    """``1.23G``, ``45.6M``, ``7.8K``, ``512``; ``""`` for none."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n) if n else ""


__all__ = ["NOTE", "compute_of", "format_mult_adds"]
