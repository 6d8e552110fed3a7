"""A row-band index of rectangles, so routing an edge tests only the boxes it passes.

Edges run top to bottom through the layered layout; a box can only be in an edge's way if
it lies in the vertical span between the edge's ends. :class:`RectIndex` buckets boxes by
horizontal bands of :data:`BAND` pixels, so ``between(top, bottom)`` returns the boxes of
the bands that span touches — a handful of rows — instead of every box in the diagram.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

BAND = 96.0


class _Rect(Protocol):  # QRectF, or anything with the same four readers
    def top(self) -> float: ...
    def bottom(self) -> float: ...


class RectIndex:
    """Keys and rectangles bucketed by the horizontal bands they overlap."""

    def __init__(self, items: Iterable[tuple[int, _Rect]]):
        self._bands: dict[int, list[tuple[int, _Rect]]] = {}
        for key, rect in items:
            for band in range(int(rect.top() // BAND), int(rect.bottom() // BAND) + 1):
                self._bands.setdefault(band, []).append((key, rect))

    def between(self, top: float, bottom: float) -> Iterator[tuple[int, _Rect]]:
        """Each (key, rect) overlapping the vertical span ``(top, bottom)``, once."""
        seen: set[int] = set()
        for band in range(int(top // BAND), int(bottom // BAND) + 1):
            for key, rect in self._bands.get(band, ()):
                if key not in seen and rect.top() < bottom and rect.bottom() > top:
                    seen.add(key)
                    yield key, rect
