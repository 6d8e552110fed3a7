"""Divergence on the diagram: :class:`DivergenceOverlay` keeps a coloured ring and a score
badge (:class:`DivergenceMark`) on every box of a :class:`~app.diagram.view.DiagramView` (the
compare window marks both of its diagrams), and :func:`divergence_colour` is the colour of one
score wherever it is shown (boxes, tables, labels).

Green is identical, then yellow to red on a log scale up to a relative L2 of 1
(:func:`tracing.analysis.divergence.divergence_fraction`); magenta marks a changed shape or a
step on one side only; grey means nothing could be compared.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import TYPE_CHECKING

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from app import theme
from app.diagram.items import FrameItem
from tracing.analysis.divergence import divergence_fraction, score_text

if TYPE_CHECKING:  # pragma: no cover
    from app.diagram.view import DiagramView

# --------------------------------------------------------------------------- colours


def divergence_colour(score: float | None) -> QColor:
    """The colour of a divergence score (relative L2; ``inf``: structural; None: unknown)."""
    if score is None:
        return QColor(theme.NOT_COMPARED)
    if math.isnan(score) or math.isinf(score):
        return QColor(theme.STRUCTURAL)
    if score == 0:
        return QColor(theme.IDENTICAL)
    return _scale_colour(divergence_fraction(score))


def _scale_colour(t: float) -> QColor:
    for (t0, c0), (t1, c1) in itertools.pairwise(theme.DIVERGENCE_STOPS):
        if t <= t1:
            a, b = QColor(c0), QColor(c1)
            f = 0.0 if t1 == t0 else (t - t0) / (t1 - t0)
            return QColor(
                round(a.red() + (b.red() - a.red()) * f),
                round(a.green() + (b.green() - a.green()) * f),
                round(a.blue() + (b.blue() - a.blue()) * f),
            )
    return QColor(theme.DIVERGENCE_STOPS[-1][1])


# --------------------------------------------------------------------------- diagram marks


class DivergenceMark(QGraphicsItem):
    """A coloured ring around a box and a badge with its score (a child of the box item)."""

    def __init__(self, parent: QGraphicsItem, size: QSize, score, status, frame: bool):
        super().__init__(parent)
        self.score = score
        self.status = status
        self.colour = (
            divergence_colour(score)
            if status not in ("only_a", "only_b")
            else QColor(theme.STRUCTURAL)
        )
        self.text = score_text(score, status)
        self.frame = frame
        self._w, self._h = float(size.width()), float(size.height())
        font = QFont()
        font.setPointSizeF(7.5)
        font.setBold(True)
        self.font = font
        tw = QFontMetricsF(font).horizontalAdvance(self.text)
        bw, bh = tw + 12, 15.0
        if frame:  # in the title bar, left of the collapse badge
            self.badge = QRectF(self._w - 30 - bw, 8, bw, bh)
        else:  # straddling the top edge, left of the expand badge
            self.badge = QRectF(self._w - 28 - bw, -bh / 2, bw, bh)
        self.setAcceptedMouseButtons(Qt.MouseButton.NoButton)
        self.setAcceptHoverEvents(False)
        self.setToolTip(f"divergence: {self.text}")

    def boundingRect(self) -> QRectF:
        return QRectF(0, 0, self._w, self._h).adjusted(-6, -10, 6, 6).united(self.badge)

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        ring = QColor(self.colour)
        if self.frame:
            ring.setAlpha(150)
            painter.setPen(QPen(ring, 1.6, Qt.PenStyle.DashLine))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(QRectF(0, 0, self._w, self._h).adjusted(-3, -3, 3, 3), 12, 12)
        else:
            painter.setPen(QPen(ring, 2.2))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(QRectF(0, 0, self._w, self._h).adjusted(-3, -3, 3, 3), 9, 9)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(self.colour)
        painter.drawRoundedRect(self.badge, self.badge.height() / 2, self.badge.height() / 2)
        painter.setFont(self.font)
        dark_text = self.colour.lightness() > 110
        painter.setPen(QColor(theme.TEXT_ON_LIGHT if dark_text else theme.WHITE))
        painter.drawText(self.badge, int(Qt.AlignmentFlag.AlignCenter), self.text)


class DivergenceOverlay:
    """Keeps a :class:`DivergenceMark` on every box of one :class:`DiagramView`.

    The view rebuilds its scene on every expand or collapse (deleting the marks with it),
    so the marks are added again after each ``layoutChanged``.
    """

    def __init__(self, view: DiagramView, scores: dict[int, tuple[float | None, str | None]]):
        self.view = view
        self.scores = scores  # step index -> (score, status)
        self.marks: dict[int, DivergenceMark] = {}
        view.layoutChanged.connect(self.apply)

    def clear(self) -> None:
        """Take the marks off the boxes (before marking them by other scores)."""
        for mark in self.marks.values():
            with contextlib.suppress(RuntimeError):  # gone with a rebuilt scene
                scene = mark.scene()
                if scene is not None:
                    scene.removeItem(mark)
        self.marks = {}

    def apply(self) -> None:
        self.marks = {}
        layout = self.view.layout_
        if layout is None:
            return
        for key, item in self.view.items_by_key.items():
            if key < 0 or key not in self.scores:
                continue
            node = layout.nodes[key]
            score, status = self.scores[key]
            size = QSize(int(node.rect.width), int(node.rect.height))
            self.marks[key] = DivergenceMark(
                item, size, score, status, frame=isinstance(item, FrameItem)
            )
