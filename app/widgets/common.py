"""Small widgets every pane uses: a quiet one-line label, a layout firewall, a titled box,
a column of widgets, and the few text styles panes share (a heading, a hint, monospace).

They exist for speed as much as looks. Stepping through a trace changes texts and sizes on
every step; a plain ``QLabel`` or a layout would pass each change up and re-lay out (and
repaint) the window. :class:`ElidedLabel` and :class:`LayoutFirewall` stop that at the
widget, and :func:`make_opaque` keeps a repaint inside the widget that changed.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QLabel,
    QLayout,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)


def make_opaque(widget: QWidget, colour: QColor) -> None:
    """Fill the widget's background itself, so updating it does not repaint its parents."""
    palette = widget.palette()
    palette.setColor(QPalette.ColorRole.Window, colour)
    widget.setPalette(palette)
    widget.setAutoFillBackground(True)


def make_scroll_area_opaque(area: QAbstractScrollArea, colour: QColor) -> None:
    """:func:`make_opaque` for a scroll area and every part of it (bars and their corners),
    so scrolling it on every step repaints only the area."""
    parts = (
        area,
        area.verticalScrollBar(),
        area.horizontalScrollBar(),
        *area.findChildren(QWidget, "qt_scrollarea_vcontainer"),
        *area.findChildren(QWidget, "qt_scrollarea_hcontainer"),
    )
    for part in parts:
        make_opaque(part, colour)


class ElidedLabel(QWidget):
    """One line of text that ends in "…" when too narrow (the full text is then its tooltip).

    Set on every step, so it is *quiet*: ``setText`` only repaints this widget. A ``QLabel``
    would also call ``updateGeometry``, and the layouts above it would run again (and a
    ``QTabWidget`` on the way up repaints everything it holds) — milliseconds a step.
    Its height is fixed by its font; it fills its own background.
    """

    def __init__(self, text: str = " ", parent: QWidget | None = None):
        super().__init__(parent)
        self._text = text
        self._alignment = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        self._clipped = False
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.setAutoFillBackground(True)  # opaque: a new text repaints this line only
        self._fit_height()

    def text(self) -> str:
        return self._text

    def setText(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.update()

    def alignment(self) -> Qt.AlignmentFlag:
        return self._alignment

    def setAlignment(self, alignment: Qt.AlignmentFlag) -> None:
        self._alignment = alignment
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self._text), self.height())

    def changeEvent(self, event) -> None:
        if event.type() == QEvent.Type.FontChange:
            self._fit_height()
        super().changeEvent(event)

    def _fit_height(self) -> None:
        self.setFixedHeight(self.fontMetrics().height() + 4)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self._text, Qt.TextElideMode.ElideRight, rect.width())
        painter.drawText(rect, int(self._alignment), text)
        painter.end()
        clipped = text != self._text
        if clipped or self._clipped:  # clipped: the full text on hover
            self._clipped = clipped
            tip = self._text if clipped else ""
            if self.toolTip() != tip:
                self.setToolTip(tip)


class LayoutFirewall(QWidget):
    """Holds one widget without a layout, so that widget's relayouts stop here.

    A widget whose size hint may change (a word-wrapped label, a row of spin boxes that
    come and go, a whole pane that changes label texts on every step) asks every layout
    above it to run again; inside a ``QTabWidget`` or a splitter that ends in a repaint of
    everything around it. Here the child simply fills this widget. With ``fixed_height``
    the firewall keeps that height; without it, it takes whatever size its parent gives it,
    down to ``minimum``.
    """

    def __init__(
        self,
        child: QWidget,
        fixed_height: int | None = None,
        *,
        minimum: QSize | None = None,
    ):
        super().__init__()
        self.child = child
        child.setParent(self)
        self._fixed = fixed_height is not None
        self._minimum = minimum
        if fixed_height is not None:
            self.setFixedHeight(fixed_height)
            self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def resizeEvent(self, event) -> None:
        self.child.setGeometry(self.rect())

    def sizeHint(self) -> QSize:
        if self._fixed:
            return QSize(self.child.sizeHint().width(), self.height())
        return self.child.sizeHint()

    def minimumSizeHint(self) -> QSize:
        if self._minimum is not None:
            return self._minimum
        return QSize(0, self.height() if self._fixed else 0)


def column(
    *items: QWidget | QLayout | tuple[QWidget | QLayout, int],
    margins: tuple[int, int, int, int] = (0, 0, 0, 0),
    spacing: int | None = None,
    on: QWidget | None = None,
) -> QWidget:
    """``items`` top to bottom in a vertical layout on ``on`` (a new widget by default).
    An item is a widget, a layout, or ``(item, stretch)``; ``spacing`` None keeps the
    style's."""
    box = on if on is not None else QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(*margins)
    if spacing is not None:
        layout.setSpacing(spacing)
    for item in items:
        child, stretch = item if isinstance(item, tuple) else (item, 0)
        if isinstance(child, QLayout):
            layout.addLayout(child, stretch)
        else:
            layout.addWidget(child, stretch)
    return box


def titled(
    title: str,
    widget: QWidget,
    hint: str = "",
    *,
    margins: tuple[int, int, int, int] = (6, 6, 0, 0),
    spacing: int = 4,
) -> QWidget:
    """``widget`` under a small upper-case pane title (and a word-wrapped ``hint``)."""
    label = QLabel(title.upper())
    label.setObjectName("paneTitle")
    hints = [hint_label(hint, wrap=True)] if hint else []
    return column(label, *hints, (widget, 1), margins=margins, spacing=spacing)


def make_heading(label: QLabel | ElidedLabel, *, bold: bool = True) -> None:
    """A pane's heading: ``label``'s font a point larger (and bold)."""
    font = QFont(label.font())
    font.setBold(bold)
    font.setPointSizeF(font.pointSizeF() + 1)
    label.setFont(font)


def hint_label(text: str = " ", *, wrap: bool = False) -> QLabel:
    """A secondary line in the muted ``hint`` style (``text`` " " keeps its height)."""
    label = QLabel(text)
    label.setObjectName("hint")
    label.setWordWrap(wrap)
    return label


def monospace_font() -> QFont:
    """The font for tokens, tables of numbers and step counters."""
    font = QFont("DejaVu Sans Mono")
    font.setStyleHint(QFont.StyleHint.Monospace)
    return font
