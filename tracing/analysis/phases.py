"""The phases of a training-step trace — forward, loss, backward — with how many steps
each has and where each first went non-finite (:class:`tracing.breakpoints.NonFinite`,
the one definition), for the report and the app. No Qt, no formatting here."""

from __future__ import annotations

from dataclasses import dataclass

from tracing.breakpoints import BreakHit, iter_origins
from tracing.record import Trace


@dataclass(frozen=True)
class Phase:
    name: str  # "forward", "loss", "backward"
    steps: int
    first_nonfinite: BreakHit | None


def loss_steps(trace: Trace) -> set[int]:
    """The steps of the loss function's call (``tracing.trace_step``'s step ``loss``, a
    top-level step after the model's) and the ops inside it; empty when the model
    computed its loss itself."""
    start = trace.backward_start
    end = len(trace.steps) if start is None else start
    inside: set[int] = set()
    for s in trace.steps[:end]:
        info = trace.modules.get(s.module)
        is_loss = s.kind == "module" and s.parent is None and s.index > 0 and s.module != ""
        if (is_loss and info is not None and info.parent is None) or s.parent in inside:
            inside.add(s.index)
    return inside


def phases(trace: Trace) -> list[Phase] | None:
    """Forward, loss and backward of a training step; None for a forward-only trace."""
    start = trace.backward_start
    if start is None:
        return None
    loss = loss_steps(trace)
    first: dict[str, BreakHit | None] = {"forward": None, "loss": None, "backward": None}
    for hit in iter_origins(trace):
        step = trace.steps[hit.step]
        name = "backward" if step.kind == "backward" else "loss" if hit.step in loss else "forward"
        if first[name] is None:
            first[name] = hit
        if all(first.values()):
            break
    counts = {
        "forward": start - len(loss),
        "loss": len(loss),
        "backward": sum(1 for s in trace.steps if s.kind == "backward"),
    }
    return [Phase(name, counts[name], first[name]) for name in ("forward", "loss", "backward")]


__all__ = ["Phase", "loss_steps", "phases"]
