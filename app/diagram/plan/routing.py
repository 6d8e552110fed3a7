"""Where the diagram's arrows run, in plain geometry (no Qt).

Edges run top to bottom through the layered layout: an arrow leaves its source's bottom
centre and enters its target's top centre (:func:`edge_ends`); one that would cross a box
detours down a lane beside everything in its way (:func:`detour_lane`). The view draws the
curves with Qt and asks Qt whether a curve crosses a box.

A box can only be in an edge's way if it lies in the vertical span between the edge's ends.
:class:`RectIndex` buckets boxes by horizontal bands of :data:`BAND` pixels, so
``between(top, bottom)`` returns the boxes of the bands that span touches — a handful of
rows — instead of every box in the diagram.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from app.diagram.plan.geometry import Point, Rect
from app.diagram.plan.layout import LANE_GAP

BAND = 96.0


def edge_ends(src: Rect, dst: Rect) -> tuple[Point, Point]:
    """Where an arrow from ``src`` to ``dst`` starts (bottom centre) and ends (top centre)."""
    return Point(src.center.x, src.bottom), Point(dst.center.x, dst.top)


def detour_lane(src: Rect, dst: Rect, band: Iterable[Rect], side: int) -> float:
    """The x of a vertical lane :data:`~app.diagram.plan.layout.LANE_GAP` clear of ``band``,
    ``src`` and ``dst``: right of them all for ``side`` > 0, else left of them all."""
    rects = [*band, src, dst]
    if side > 0:
        return max(r.right for r in rects) + LANE_GAP
    return min(r.left for r in rects) - LANE_GAP


class RectIndex:
    """Keys and rectangles bucketed by the horizontal bands they overlap."""

    def __init__(self, items: Iterable[tuple[int, Rect]]):
        self._bands: dict[int, list[tuple[int, Rect]]] = {}
        for key, rect in items:
            for band in range(int(rect.top // BAND), int(rect.bottom // BAND) + 1):
                self._bands.setdefault(band, []).append((key, rect))

    def between(self, top: float, bottom: float) -> Iterator[tuple[int, Rect]]:
        """Each (key, rect) overlapping the vertical span ``(top, bottom)``, once."""
        seen: set[int] = set()
        for band in range(int(top // BAND), int(bottom // BAND) + 1):
            for key, rect in self._bands.get(band, ()):
                if key not in seen and rect.top < bottom and rect.bottom > top:
                    seen.add(key)
                    yield key, rect
