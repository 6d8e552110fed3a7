"""How far two traces drift apart, step by step, as one number per step.

A :class:`~tracing.trace_diff.TraceDiff` compares every aligned pair of outputs; the
functions here turn that into a *score* per step (the relative L2 of its output, ``inf``
for a structural change, the statistics delta when no values were kept, None when nothing
could be compared), a place on a log colour scale (:func:`divergence_fraction`), and the
short text of a badge (:func:`score_text`). The compare window paints them; nothing here
knows about colours or Qt.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tracing.formatting import step_text

if TYPE_CHECKING:  # pragma: no cover
    from tracing.analysis.trace_diff import StepDiff, TraceDiff
    from tracing.record import Trace

LOG_FLOOR = -7.0  # relative L2 of 1e-7 and below sits at the green end of the scale

STATUS_TEXT = {
    "equal": "equal",
    "changed": "values differ",
    "shape": "shape changed",
    "only_a": "only in A",
    "only_b": "only in B",
    "sharded": "not expected to agree (a shard)",
}


def divergence_fraction(score: float) -> float:
    """Where a positive finite score sits on the colour scale: 0 (1e-7 or less) .. 1 (>= 1)."""
    if score <= 0:
        return 0.0
    return min(1.0, max(0.0, (math.log10(score) - LOG_FLOOR) / -LOG_FLOOR))


def score_text(score: float | None, status: str | None = None) -> str:
    """A badge's text: ``0``, ``3.1e-02``, ``shape``, ``A only``, ``?``."""
    if status == "only_a":
        return "A only"
    if status == "only_b":
        return "B only"
    if score is None:
        return "?"
    if math.isnan(score):
        return "NaN"
    if math.isinf(score):
        return "shape" if status in (None, "shape") else "∞"
    if score == 0:
        return "0"
    return f"{score:.1e}".replace("e-0", "e-").replace("e+0", "e")


def step_scores(
    d: TraceDiff, trace: Trace, side: str
) -> dict[int, tuple[float | None, str | None]]:
    """Score and status for every step of one side: modules by their module's score,
    ops by their own entry (relative L2; ``inf`` for a changed shape; None: not compared)."""
    modules = d.module_scores()
    lookup = d.for_step_a if side == "a" else d.for_step_b
    out: dict[int, tuple[float | None, str | None]] = {}
    for s in trace.steps:
        entry = lookup(s.index)
        status = entry.status if entry is not None else None
        if entry is not None and entry.one_sided:
            out[s.index] = (math.inf, status)
        elif s.kind == "module":
            out[s.index] = (modules.get(s.module), status)
        else:
            out[s.index] = (entry_score(entry), status)
    return out


def gradient_scores(
    d: TraceDiff, trace: Trace, side: str
) -> dict[int, tuple[float | None, str | None]]:
    """For a training-step trace: score and status of the *gradients* at each forward box.

    A forward step gets the largest score of the backward steps that differentiate it
    (``Step.forward``); a module call the largest over the steps inside it. A forward step
    no gradient reached (an input, a ``no_grad`` region) is absent."""
    lookup = d.for_step_a if side == "a" else d.for_step_b
    steps = trace.steps
    best: dict[int, tuple[float | None, str | None]] = {}

    def take(index: int, score: float | None, status: str | None) -> None:
        old = best.get(index)
        if old is None or _worse(score, old[0]):
            best[index] = (score, status)

    for s in steps:
        if s.kind != "backward" or s.forward is None:
            continue
        entry = lookup(s.index)
        if entry is None:
            continue
        score = math.inf if entry.one_sided else entry_score(entry)
        take(s.forward, score, entry.status)
    for index, (score, status) in list(best.items()):  # up to every enclosing module call
        parent = steps[index].parent
        while parent is not None:
            take(parent, score, status)
            parent = steps[parent].parent
    return best


def _worse(score: float | None, than: float | None) -> bool:
    """Whether ``score`` should show over ``than``: a larger score, NaN over any number."""
    if score is None:
        return False
    if than is None or math.isnan(score):
        return True
    return not math.isnan(than) and score > than


def entry_place(entry: StepDiff) -> str:
    """Where an aligned entry sits on each side: ``A step 3 · B step 4`` (one side if only one)."""
    where = []
    if entry.a_index is not None:
        where.append(f"A {step_text(entry.a_index)}")
    if entry.b_index is not None:
        where.append(f"B {step_text(entry.b_index)}")
    return " · ".join(where)


def entry_score(entry: StepDiff | None) -> float | None:
    """One entry's divergence: its relative L2, ``inf`` for a structural change, or the
    statistics delta when no values were kept (None when nothing could be compared)."""
    if entry is None:
        return None
    if entry.one_sided or entry.status == "shape":
        return math.inf
    if entry.rel_l2 is not None:
        return entry.rel_l2
    deltas = [o.stats_delta for o in entry.outputs if o.stats_delta is not None]
    if deltas:
        return max(deltas)
    return 0.0 if not entry.outputs else None


__all__ = [
    "LOG_FLOOR",
    "STATUS_TEXT",
    "divergence_fraction",
    "entry_place",
    "entry_score",
    "gradient_scores",
    "score_text",
    "step_scores",
]
