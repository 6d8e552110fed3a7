"""The divergence colour scale (the colours of :func:`app.diagram.divergence.divergence_colour`)
as a strip beside the compare window's step bar."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QLinearGradient, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

from app import theme
from tracing.analysis.divergence import divergence_fraction


class DivergenceLegend(QWidget):
    """The colour scale: identical · 1e-5 · 1e-3 · ≥ 1 (relative L2); structural; n/a (not
    compared: no values or statistics kept). ``title`` says of what: the outputs, or the
    gradients (:data:`GRADIENT_TITLE`) in a training step's backward phase."""

    TITLE = "rel. L2 (A − B)"
    GRADIENT_TITLE = "rel. L2 of ∇ (A − B)"

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = self.TITLE
        self.setFixedHeight(34)
        self.setMinimumWidth(self.sizeHint().width())
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)

    def _small_font(self) -> QFont:
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1.5))
        return font

    def _bar_left(self, metrics: QFontMetricsF) -> float:
        """Where the scale starts: after the longer of the two titles."""
        return 6 + max(metrics.horizontalAdvance(t) for t in (self.TITLE, self.GRADIENT_TITLE))

    def sizeHint(self) -> QSize:
        metrics = QFontMetricsF(self._small_font())
        labels = sum(metrics.horizontalAdvance(t) + 28 for t in ("shape / one side", "n/a"))
        return QSize(int(self._bar_left(metrics) + 236 + labels + 8), 34)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        font = self._small_font()
        painter.setFont(font)
        left = self._bar_left(QFontMetricsF(font))
        muted = QColor(theme.TEXT_MUTED)
        painter.setPen(muted)
        painter.drawText(QRectF(0, 0, left - 4, 20), int(Qt.AlignmentFlag.AlignVCenter), self.title)
        bar = QRectF(left, 5, 220, 10)
        gradient = QLinearGradient(bar.topLeft(), bar.topRight())
        for t, c in theme.DIVERGENCE_STOPS:
            gradient.setColorAt(t, QColor(c))
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QBrush(gradient))
        painter.drawRoundedRect(bar, 4, 4)
        painter.setPen(muted)
        for label, value in (("0", 0.0), ("1e-5", 1e-5), ("1e-3", 1e-3), ("≥ 1", 1.0)):
            x = bar.left() + bar.width() * (divergence_fraction(value) if value else 0.0)
            painter.drawLine(QPointF(x, bar.bottom() + 1), QPointF(x, bar.bottom() + 4))
            painter.drawText(
                QRectF(x - 20, bar.bottom() + 4, 40, 14), int(Qt.AlignmentFlag.AlignCenter), label
            )
        x = bar.right() + 16
        for colour, label in ((theme.STRUCTURAL, "shape / one side"), (theme.NOT_COMPARED, "n/a")):
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(colour))
            painter.drawRoundedRect(QRectF(x, 5, 10, 10), 3, 3)
            painter.setPen(muted)
            painter.drawText(QRectF(x + 14, 0, 110, 20), int(Qt.AlignmentFlag.AlignVCenter), label)
            x += 14 + painter.fontMetrics().horizontalAdvance(label) + 14
        painter.end()
