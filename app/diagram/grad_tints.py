"""Box colours for "colour by gradient norm": log-scaled norms mapped to a blue-red ramp.

Blue is the smallest gradient norm in view (a vanishing layer), red the largest (an
exploding one), a non-finite gradient the error colour; boxes without a gradient keep
the normal fill. The norms come from ``tracing.gradients`` (no Qt there).
"""

from __future__ import annotations

from PySide6.QtGui import QColor

from app.theme import ERROR, GRAD_HIGH, GRAD_LOW
from tracing.analysis.gradients import log_scale, step_grad_norm


def ramp(position: float) -> QColor:
    """The colour at ``position`` in [0, 1] between GRAD_LOW and GRAD_HIGH."""
    t = min(1.0, max(0.0, position))
    lo, hi = QColor(GRAD_LOW), QColor(GRAD_HIGH)
    return QColor(
        round(lo.red() + (hi.red() - lo.red()) * t),
        round(lo.green() + (hi.green() - lo.green()) * t),
        round(lo.blue() + (hi.blue() - lo.blue()) * t),
    )


def grad_tints(trace, keys) -> dict[int, QColor]:
    """Step index -> fill colour for every box key (a step index) that has a gradient."""
    import math

    norms = {}
    for key in keys:
        if isinstance(key, int) and 0 <= key < len(trace.steps):
            n = step_grad_norm(trace, key)
            if n is not None:
                norms[key] = n
    positions = log_scale(norms)
    return {
        k: (QColor(ERROR).darker(160) if not math.isfinite(norms[k]) else ramp(p))
        for k, p in positions.items()
    }
