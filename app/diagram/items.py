"""The diagram's drawn pieces: :class:`BoxItem`, :class:`FrameItem`, :class:`EdgeItem`.

Also the edge between the Qt-free layout and Qt: :class:`DiagramFonts` (the fonts the boxes
are drawn in, and the :class:`~app.diagram.plan.geometry.TextMeasure` the layout measures with)
and :func:`to_qrect` / :func:`to_qpoint` (plain geometry to Qt's).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetricsF,
    QPainter,
    QPainterPath,
    QPainterPathStroker,
    QPen,
    QPolygonF,
)
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from app import theme
from app.diagram.plan.geometry import Point, Rect, TextMeasure
from app.diagram.plan.layout import ARROW, FRAME_TITLE, H_PAD, SPARK_H, DiagramLayout, Node

if TYPE_CHECKING:  # pragma: no cover
    from app.diagram.view import DiagramView

# --------------------------------------------------------------------------- plain -> Qt


def to_qrect(rect: Rect) -> QRectF:
    return QRectF(rect.left, rect.top, rect.width, rect.height)


def to_qpoint(point: Point) -> QPointF:
    return QPointF(point.x, point.y)


class DiagramFonts:
    """The diagram's fonts: ``bold`` for titles, ``small`` for the lines under them, and
    ``measure``, the same fonts' metrics as the layout's :class:`TextMeasure`."""

    def __init__(self, font: QFont):
        self.bold = QFont(font)
        self.bold.setBold(True)
        self.small = QFont(font)
        self.small.setPointSizeF(max(6.0, font.pointSizeF() * 0.88))
        body, bold = QFontMetricsF(font), QFontMetricsF(self.bold)
        self.measure = TextMeasure(
            title_width=bold.horizontalAdvance,
            detail_width=QFontMetricsF(self.small).horizontalAdvance,
            line_height=max(body.height(), bold.height()),
        )


# --------------------------------------------------------------------------- items


def _activate_step(item: BoxItem | FrameItem, event) -> None:
    """A left click on a box or a frame's title asks the view to go to its step."""
    if event.button() == Qt.MouseButton.LeftButton:
        event.accept()
        if item.node.step is not None:
            item._view.stepActivated.emit(item.node.step)
    else:
        event.ignore()


class BoxItem(QGraphicsItem):
    """A module call or an op: name, type, output shape; highlighted when current."""

    def __init__(self, node: Node, view: DiagramView):
        super().__init__()
        self.node = node
        self._view = view
        self.highlighted = False
        self.hovered = False
        self.setPos(node.rect.left, node.rect.top)
        self.setToolTip(node.tooltip)
        self.setAcceptHoverEvents(True)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.setZValue(2)

    # Qt virtuals (camelCase names, or Qt never calls them)
    def boundingRect(self) -> QRectF:
        return QRectF(0, 0, self.node.rect.width, self.node.rect.height).adjusted(-4, -4, 4, 4)

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        node = self.node
        rect = QRectF(0, 0, node.rect.width, node.rect.height)
        is_op = not node.subtitle
        radius = rect.height() / 2 if is_op and node.key >= 0 else 7.0
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        fill = QColor(self._view.tints.get(node.key, theme.BOX_FILL))
        if self.hovered:
            fill = fill.lighter(125)
        if self.highlighted:
            glow = QColor(theme.CURRENT)
            glow.setAlpha(60)
            painter.setPen(QPen(glow, 7))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(rect, radius, radius)
            fill = QColor(theme.CURRENT_FILL)
        border = QColor(
            theme.CURRENT if self.highlighted else (theme.ERROR if node.error else theme.BOX_BORDER)
        )
        painter.setPen(QPen(border, 2.0 if self.highlighted or node.error else 1.0))
        painter.setBrush(fill)
        painter.drawRoundedRect(rect, radius, radius)
        # accent stripe on the left
        stripe = QPainterPath()
        stripe.addRoundedRect(rect.adjusted(1, 1, -1, -1), radius, radius)
        clip = QPainterPath()
        clip.addRect(QRectF(rect.left(), rect.top(), 5 if not is_op else 8, rect.height()))
        painter.fillPath(stripe.intersected(clip), QColor(node.accent))
        # text
        x = H_PAD + (4 if is_op else 2)
        w = rect.width() - x - H_PAD + 4
        y = 5.0 if is_op else 7.0
        fonts = self._view.fonts
        lh = fonts.measure.line_height
        painter.setPen(QColor(theme.ERROR if node.error else theme.TEXT))
        painter.setFont(fonts.bold)
        painter.drawText(QRectF(x, y, w, lh), Qt.AlignmentFlag.AlignVCenter, node.title)
        y += lh
        painter.setFont(fonts.small)
        if node.subtitle:
            painter.setPen(QColor(theme.TEXT_MUTED))
            painter.drawText(QRectF(x, y, w, lh), Qt.AlignmentFlag.AlignVCenter, node.subtitle)
            y += lh
        painter.setPen(QColor(theme.TEXT_SHAPE))
        painter.drawText(QRectF(x, y, w, lh), Qt.AlignmentFlag.AlignVCenter, node.shape)
        if node.spark:
            _sparkline(painter, QRectF(x, y + lh + 2, w - 6, SPARK_H - 4), node.spark, node.accent)
        if node.count:  # a folded run: a second edge behind it, like a stack of cards
            painter.setPen(QPen(QColor(theme.BOX_BORDER), 1.0))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawLine(
                QPointF(rect.left() + 6, rect.bottom() + 3),
                QPointF(rect.right() - 6, rect.bottom() + 3),
            )
        if node.expandable:  # a "+" badge: double-click to open
            badge = QRectF(rect.right() - 20, rect.top() + 6, 13, 13)
            painter.setPen(QPen(QColor(theme.TEXT_MUTED), 1.2))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(badge, 3, 3)
            c = badge.center()
            painter.drawLine(QPointF(c.x() - 3.5, c.y()), QPointF(c.x() + 3.5, c.y()))
            painter.drawLine(QPointF(c.x(), c.y() - 3.5), QPointF(c.x(), c.y() + 3.5))

    def set_highlighted(self, on: bool) -> None:
        if on != self.highlighted:
            self.highlighted = on
            self.update()

    def hoverEnterEvent(self, event) -> None:
        self.hovered = True
        self.update()

    def hoverLeaveEvent(self, event) -> None:
        self.hovered = False
        self.update()

    def mousePressEvent(self, event) -> None:
        _activate_step(self, event)

    def mouseDoubleClickEvent(self, event) -> None:
        event.accept()
        if self.node.expandable:
            self._view.request_toggle(self.node.key)


class FrameItem(QGraphicsItem):
    """An expanded module call drawn as a frame around its children."""

    def __init__(self, node: Node, layout: DiagramLayout, view: DiagramView, depth: int):
        super().__init__()
        self.node = node
        self._view = view
        self.title = layout.frame_title(node.key)
        self.highlighted = False
        self.setPos(node.rect.left, node.rect.top)
        self.setToolTip(node.tooltip + "<br><i>double-click the title to collapse</i>")
        self.setZValue(-10 + depth)

    def boundingRect(self) -> QRectF:
        return QRectF(0, 0, self.node.rect.width, self.node.rect.height).adjusted(-3, -3, 3, 3)

    def shape(self) -> QPainterPath:
        # only the title bar takes clicks, so a click inside the frame can pan the view
        path = QPainterPath()
        path.addRect(QRectF(0, 0, self.node.rect.width, FRAME_TITLE))
        return path

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        rect = QRectF(0, 0, self.node.rect.width, self.node.rect.height)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        accent = QColor(self.node.accent)
        fill = QColor(accent)
        fill.setAlpha(16)
        border = QColor(accent)
        border.setAlpha(110)
        if self.highlighted:
            border = QColor(theme.CURRENT)
        painter.setBrush(fill)
        pen = QPen(border, 2.0 if self.highlighted else 1.2)
        pen.setStyle(Qt.PenStyle.SolidLine)
        painter.setPen(pen)
        painter.drawRoundedRect(rect, 10, 10)
        painter.setFont(self._view.fonts.bold)
        painter.setPen(QColor(theme.CURRENT) if self.highlighted else accent.lighter(120))
        text_rect = QRectF(12, 4, rect.width() - 40, FRAME_TITLE - 6)
        painter.drawText(text_rect, Qt.AlignmentFlag.AlignVCenter, self.title)
        # a "−" badge: double-click to collapse
        badge = QRectF(rect.right() - 22, 7, 13, 13)
        painter.setPen(QPen(QColor(theme.TEXT_MUTED), 1.2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(badge, 3, 3)
        c = badge.center()
        painter.drawLine(QPointF(c.x() - 3.5, c.y()), QPointF(c.x() + 3.5, c.y()))

    def set_highlighted(self, on: bool) -> None:
        if on != self.highlighted:
            self.highlighted = on
            self.update()

    def mousePressEvent(self, event) -> None:
        _activate_step(self, event)

    def mouseDoubleClickEvent(self, event) -> None:
        event.accept()
        self._view.request_toggle(self.node.key)


def _sparkline(painter: QPainter, area: QRectF, values: tuple[float, ...], colour: str) -> None:
    """A small line of ``values`` across ``area`` (each repetition's output RMS)."""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    n = len(values)
    points = [
        QPointF(
            area.left() + (area.width() * k / (n - 1) if n > 1 else area.width() / 2),
            area.bottom() - (v - lo) / span * area.height(),
        )
        for k, v in enumerate(values)
    ]
    painter.setPen(QPen(QColor(colour), 1.2))
    painter.setBrush(Qt.BrushStyle.NoBrush)
    painter.drawPolyline(QPolygonF(points))


class EdgeItem(QGraphicsItem):
    """A data-flow arrow: a smooth cubic path ending in an arrowhead."""

    def __init__(self, path: QPainterPath, tip: QPointF, angle_deg: float, detour: bool):
        super().__init__()
        self.path = path
        self.detour = detour
        self.active = False
        a = math.radians(angle_deg)
        # arrowhead points back along the direction of travel
        back = QPointF(-math.cos(a), math.sin(a))
        side = QPointF(-back.y(), back.x())
        base = tip + back * ARROW
        self.arrow = QPolygonF([tip, base + side * (ARROW * 0.5), base - side * (ARROW * 0.5)])
        self._bounds = path.boundingRect().united(self.arrow.boundingRect()).adjusted(-3, -3, 3, 3)
        self.setZValue(1)

    def boundingRect(self) -> QRectF:
        return self._bounds

    def shape(self) -> QPainterPath:
        stroker = QPainterPathStroker()
        stroker.setWidth(6)
        return stroker.createStroke(self.path)

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        colour = QColor(theme.CURRENT if self.active else theme.EDGE)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pen = QPen(colour, 2.0 if self.active else 1.4)
        if self.detour and not self.active:
            pen.setColor(QColor(theme.RESIDUAL_EDGE).darker(115))
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(self.path)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(pen.color())
        painter.drawPolygon(self.arrow)

    def set_active(self, on: bool) -> None:
        if on != self.active:
            self.active = on
            self.update()
