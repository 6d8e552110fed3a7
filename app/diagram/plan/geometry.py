"""Plain geometry for the diagram: points, rectangles and how wide text is drawn.

The layout (:mod:`app.diagram.plan.layout`) works in these types so that it runs, and is tested,
without Qt. The Qt view converts at its edge (:func:`app.diagram.items.to_qrect`) and hands
the layout a :class:`TextMeasure` made from its fonts; tests hand it
:func:`fixed_width_measure`. Coordinates are scene pixels, y growing downwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float

    def __add__(self, other: Point) -> Point:
        return Point(self.x + other.x, self.y + other.y)


@dataclass(frozen=True, slots=True)
class Rect:
    """An axis-aligned rectangle: its top-left corner, ``width`` and ``height``."""

    left: float = 0.0
    top: float = 0.0
    width: float = 0.0
    height: float = 0.0

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height

    @property
    def center(self) -> Point:
        return Point(self.left + self.width / 2, self.top + self.height / 2)

    def moved(self, dx: float, dy: float) -> Rect:
        return Rect(self.left + dx, self.top + dy, self.width, self.height)

    def contains(self, other: Rect) -> bool:
        """Whether ``other`` lies inside this rectangle (edges may touch)."""
        return (
            self.left <= other.left
            and other.right <= self.right
            and self.top <= other.top
            and other.bottom <= self.bottom
        )

    def overlaps(self, other: Rect) -> bool:
        """Whether the two share area (touching edges do not count)."""
        return (
            self.left < other.right
            and other.left < self.right
            and self.top < other.bottom
            and other.top < self.bottom
        )


def bounding(rects: Iterable[Rect]) -> Rect:
    """The smallest rectangle holding all of ``rects`` (an empty one at 0, 0 for none)."""
    rects = list(rects)
    if not rects:
        return Rect()
    left = min(r.left for r in rects)
    top = min(r.top for r in rects)
    right = max(r.right for r in rects)
    bottom = max(r.bottom for r in rects)
    return Rect(left, top, right - left, bottom - top)


@dataclass(frozen=True)
class TextMeasure:
    """How wide a string is drawn in each of the diagram's two text roles, and a line's
    height. ``title_width`` measures the bold titles (box and frame names),
    ``detail_width`` the small lines under them (module type, output shape)."""

    title_width: Callable[[str], float]
    detail_width: Callable[[str], float]
    line_height: float


def fixed_width_measure(char_width: float = 7.0, line_height: float = 16.0) -> TextMeasure:
    """Every character ``char_width`` wide (details 0.88 of that, as the view's small
    font): a stand-in for fonts where no Qt runs, e.g. in tests."""
    small = char_width * 0.88
    return TextMeasure(
        title_width=lambda text: char_width * len(text),
        detail_width=lambda text: small * len(text),
        line_height=line_height,
    )
