"""A thin strip under the step slider showing a training-step trace's two phases.

The forward steps take the left part, the backward steps the right part, each in its
own colour and named; a tick marks the current step. For a forward-only trace the strip
hides itself.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.theme import BACKWARD_PHASE, CURRENT, FORWARD_PHASE, TEXT


class PhaseStrip(QWidget):
    """``forward (194 steps) | backward (307 steps)``, to scale, with the current step."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("phaseStrip")
        self.backward_start: int | None = None
        self.count = 0
        self.index = 0
        self.setFixedHeight(self.fontMetrics().height() + 4)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setToolTip("Forward steps, then backward steps (one per autograd node)")
        self.hide()

    def set_phases(self, backward_start: int | None, count: int) -> None:
        self.backward_start, self.count = backward_start, count
        self.setVisible(backward_start is not None and count > 0)
        self.update()

    def set_index(self, index: int) -> None:
        if index != self.index:
            self.index = index
            self.update()

    def phase(self, index: int) -> str:
        """``"forward"`` or ``"backward"`` for step ``index``."""
        start = self.backward_start
        return "backward" if start is not None and index >= start else "forward"

    def paintEvent(self, event) -> None:
        if self.backward_start is None or self.count <= 0:
            return
        painter = QPainter(self)
        w, h = float(self.width()), float(self.height())
        split = w * self.backward_start / self.count
        forward, backward = QRectF(0, 0, split, h), QRectF(split, 0, w - split, h)
        painter.fillRect(forward, QColor(FORWARD_PHASE))
        painter.fillRect(backward, QColor(BACKWARD_PHASE))
        painter.setPen(QColor(TEXT))
        n_back = self.count - self.backward_start
        centre = Qt.AlignmentFlag.AlignCenter
        painter.drawText(forward, centre, f"forward · {self.backward_start} steps")
        painter.drawText(backward, centre, f"backward · {n_back} steps")
        x = w * (self.index + 0.5) / self.count
        painter.fillRect(QRectF(x - 1.5, 0, 3, h), QColor(CURRENT))
        painter.end()
