"""NaN, +Inf and −Inf cells of a heatmap: drawn in colours of their own, named in the legend.

A NaN is a bug to see, not a blank: a heatmap paints NaN, +Inf and −Inf cells in three
colours no colour map uses (:data:`NAN_COLOUR`, :data:`POSINF_COLOUR`,
:data:`NEGINF_COLOUR`), lists each kind with its count in the legend line beside the mask
fills (:mod:`app.widgets.masked_cells`), and takes its colour scale from the finite
values only. A matrix with no finite value says so ("all 64 cells NaN"). Plain numpy, no Qt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.theme import NAN_COLOUR, NEGINF_COLOUR, POSINF_COLOUR


def _argb(colour: str) -> int:
    return 0xFF000000 | int(colour[1:], 16)


NAN_ARGB, POSINF_ARGB, NEGINF_ARGB = map(_argb, (NAN_COLOUR, POSINF_COLOUR, NEGINF_COLOUR))


@dataclass(frozen=True)
class NonFiniteCells:
    """Where a matrix is NaN, +Inf and −Inf (bool arrays of its shape)."""

    nan: np.ndarray
    posinf: np.ndarray
    neginf: np.ndarray

    @property
    def any(self) -> np.ndarray:
        return self.nan | self.posinf | self.neginf

    def counts(self) -> tuple[int, int, int]:
        return int(self.nan.sum()), int(self.posinf.sum()), int(self.neginf.sum())

    def entries(self) -> list[tuple[str, str, int]]:
        """``(colour, name, count)`` for each kind present, in a fixed order."""
        kinds = zip((NAN_COLOUR, POSINF_COLOUR, NEGINF_COLOUR), ("NaN", "+Inf", "−Inf"))
        return [(c, name, n) for (c, name), n in zip(kinds, self.counts()) if n]

    def legend(self) -> str:
        """``NaN (3 cells) · +Inf (1 cell)``; ``all 64 cells NaN`` when nothing is finite."""
        entries = self.entries()
        total = self.nan.size
        if len(entries) == 1 and entries[0][2] == total:
            return f"all {total} cells {entries[0][1]}: no finite value to scale"
        parts = [f"{name} ({n} {'cell' if n == 1 else 'cells'})" for _, name, n in entries]
        text = " · ".join(parts)
        if sum(n for *_, n in entries) == total:
            text += ": no finite value to scale"
        return text

    def legend_html(self) -> str:
        """The legend entries, each after a square of its colour."""
        entries = self.entries()
        if not entries:
            return ""
        total = self.nan.size
        if sum(n for *_, n in entries) == total and len(entries) == 1:
            colour = entries[0][0]
            return f"<span style='color:{colour}'>■</span> {self.legend()}"
        squares = []
        for colour, name, n in entries:
            cells = "cell" if n == 1 else "cells"
            squares.append(f"<span style='color:{colour}'>■</span> {name} ({n} {cells})")
        html = " &nbsp; ".join(squares)
        if sum(n for *_, n in entries) == total:
            html += ": no finite value to scale"
        return html

    def paint(self, pixels: np.ndarray, y_step: int = 1, x_step: int = 1) -> None:
        """Write the three colours into ``pixels`` (uint32 ARGB, the matrix strided by
        ``y_step, x_step``)."""
        for where, argb in ((self.nan, NAN_ARGB), (self.posinf, POSINF_ARGB),
                            (self.neginf, NEGINF_ARGB)):  # fmt: skip
            shown = where[::y_step, ::x_step] if (y_step > 1 or x_step > 1) else where
            if shown.shape == pixels.shape and shown.any():
                pixels[shown] = argb


def nonfinite_cells(matrix: np.ndarray) -> NonFiniteCells | None:
    """The NaN, +Inf and −Inf cells of ``matrix``, or None when every cell is finite."""
    a = np.asarray(matrix)
    if a.dtype.kind not in "fc" or a.size == 0:
        return None
    finite = np.isfinite(a)
    if finite.all():
        return None
    nan = np.isnan(a)
    inf = ~finite & ~nan
    return NonFiniteCells(nan=nan, posinf=inf & (a > 0), neginf=inf & (a < 0))
