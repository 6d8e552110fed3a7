"""Which cells of a matrix are mask fills, not data: ``-1e9``, ``-inf``, ``finfo.min``...

Causal attention scores are ``masked_fill(mask == 0, -1e9)``: half the matrix holds one
value a billion times larger than the rest. Scaled together, the real scores all get one
colour. A heatmap draws the cells :func:`masked_cells` finds in a colour of their own and
takes its colour scale from the others.

A cell is masked when it is ``±inf``, or belongs to a group of values far outside the
spread of the rest that is either one repeated value (what ``masked_fill`` writes) or huge
beside the rest (``|x| ≥ 1e6 ×`` their spread). A single large activation among ordinary
ones is data, not a mask, and stays on the scale. Plain numpy, no Qt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FAR = 10.0
"""A gap this many times the spread of the rest separates fills from data."""
HUGE = 1e6
"""A far group this many times the rest's spread is a fill even if not one repeated value."""
SAMPLE = 65536
"""Values looked at to find the groups of a larger matrix (each step shows one: keep it fast)."""


@dataclass(frozen=True)
class MaskedCells:
    """Where the mask fills are, and which values they hold (for the legend)."""

    where: np.ndarray  # bool, the matrix's shape
    values: tuple[float, ...]  # distinct fill values, at most a few, e.g. (-1e9,)

    @property
    def count(self) -> int:
        return int(self.where.sum())

    def finite_only(self, matrix: np.ndarray) -> MaskedCells | None:
        """The finite fills only (±Inf have colours of their own: ``nonfinite_cells``)."""
        where = self.where & np.isfinite(matrix)
        if not where.any():
            return None
        return MaskedCells(where=where, values=tuple(v for v in self.values if np.isfinite(v)))

    def legend(self) -> str:
        """``masked: -1e+09 (36 cells)``."""
        shown = ", ".join(f"{v:.3g}" for v in self.values[:3])
        more = ", …" if len(self.values) > 3 else ""
        cells = "cell" if self.count == 1 else "cells"
        return f"masked: {shown}{more} ({self.count} {cells})"


def masked_cells(matrix: np.ndarray) -> MaskedCells | None:
    """The mask fills of ``matrix`` (any shape), or None when it has none."""
    a = np.asarray(matrix)
    if a.dtype.kind != "f" or a.size < 2:
        return None
    finite = np.isfinite(a)
    where = ~finite & ~np.isnan(a)  # ±inf; NaN is a bug to see, not a mask
    values = np.unique(a[where]).tolist() if where.any() else []
    data = a[finite]
    if data.size > SAMPLE:  # the groups from a sample (plus the extremes), applied to all
        data = np.concatenate([data[:: data.size // SAMPLE], [data.min(), data.max()]])
    for _ in range(2):  # a fill below the data and one above it
        far = _far_group(data)
        if far is None:
            break
        lo, hi = far
        in_group = (a >= lo) & (a <= hi) & finite
        where |= in_group
        values.extend(np.unique(a[in_group]).tolist()[:4])
        data = data[(data < lo) | (data > hi)]
    if not where.any():
        return None
    return MaskedCells(where=where, values=tuple(sorted(set(values))))


def _far_group(data: np.ndarray) -> tuple[float, float] | None:
    """``(lo, hi)`` of the values beyond the largest gap, when that gap is a mask's."""
    if data.size < 2:
        return None
    v = np.unique(data)
    if v.size < 2:
        return None
    gaps = np.diff(v)
    i = int(np.argmax(gaps))
    gap = float(gaps[i])
    below, above = v[: i + 1], v[i + 1 :]
    # the far side is the smaller group of distinct values, or the one further from zero
    if below.size != above.size:
        far, rest = (below, above) if below.size < above.size else (above, below)
    else:
        far, rest = (below, above) if abs(below[0]) > abs(above[-1]) else (above, below)
    if rest.size < 2:
        return None  # two values (a 0/1 mask): nothing says which one is data
    spread = float(rest[-1] - rest[0])
    if gap < FAR * spread:
        return None
    # one repeated value (masked_fill), or all huge beside the data
    if far.size == 1 or gap >= HUGE * spread:
        counts = np.isin(data, far).sum()
        if far.size == 1 and counts < 2 and gap < HUGE * spread:
            return None  # one large value once: an outlier of the data, not a fill
        return float(far[0]), float(far[-1])
    return None
