"""A patching sweep's table as a heatmap: one painter for the dialog and the PNG file.

Cells show the *normalized* effect of each patch, ``(value - corrupted) / (clean -
corrupted)``: 0 (the background colour) does nothing, 1 (amber) restores the clean
prediction fully, negative (blue) pushes further away. The raw metric is written in each
cell when there is room. :func:`sweep_image` renders it without a screen (the
``scratchformer patch --png`` file); :class:`SweepHeatmap` shows it in a window.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QImage, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

from app import theme
from tracing.runs.patching import SweepResult

_POSITIVE = QColor(theme.CURRENT)
_NEGATIVE = QColor(theme.TEXT_SHAPE)
_ZERO = QColor(theme.BOX_FILL)
_MARGIN = 12


def effect_colour(x: float) -> QColor:
    """The colour of a normalized effect: background at 0, amber at 1, blue at -1."""
    if math.isnan(x):
        return QColor(theme.BACKGROUND)
    t = max(-1.0, min(1.0, x))
    end = _POSITIVE if t >= 0 else _NEGATIVE
    t = abs(t)
    return QColor(
        round(_ZERO.red() + (end.red() - _ZERO.red()) * t),
        round(_ZERO.green() + (end.green() - _ZERO.green()) * t),
        round(_ZERO.blue() + (end.blue() - _ZERO.blue()) * t),
    )


class _Layout:
    """Where the title, the labels and the cells go for one result at one cell size."""

    def __init__(self, result: SweepResult, font: QFont, cell: float, title: str):
        metrics = QFontMetrics(font)
        self.line = metrics.height()
        self.row_width = max([metrics.horizontalAdvance(r) for r in result.rows] + [20]) + 10
        self.col_height = max([metrics.horizontalAdvance(c) for c in result.columns] + [20]) + 8
        self.cell = cell
        self.top = _MARGIN + 2 * self.line + 6 + self.col_height
        self.left = _MARGIN + self.row_width
        n_rows, n_cols = result.values.shape
        texts = (*_heading(result, title), _LEGEND)
        widest = max(metrics.horizontalAdvance(t) for t in texts)
        self.width = max(self.left + n_cols * cell, _MARGIN + widest) + _MARGIN
        self.height = self.top + n_rows * cell + 2 * self.line + _MARGIN


def _cell_size(result: SweepResult) -> float:
    n_cols = max(result.values.shape[1], 1)
    return 44.0 if n_cols <= 16 else max(14.0, 700.0 / n_cols)


_LEGEND = "-1    ·    0 no effect    ·    1 restores the clean run"


def _heading(result: SweepResult, title: str) -> tuple[str, str]:
    heading = title or f"patching sweep over {result.over}"
    if result.cancelled:
        heading += f" (cancelled after {result.runs} runs)"
    metric = (
        f"metric {result.metric_name}: clean {result.clean_metric:.3f}, "
        f"corrupted {result.corrupted_metric:.3f}"
    )
    return heading, metric


def sweep_size(result: SweepResult, font: QFont | None = None, title: str = "") -> QSize:
    layout = _Layout(result, font or QFont(), _cell_size(result), title)
    return QSize(math.ceil(layout.width), math.ceil(layout.height))


def paint_sweep(painter: QPainter, result: SweepResult, title: str = "") -> None:
    """Paint the heatmap at the painter's origin, at :func:`sweep_size`."""
    font = painter.font()
    layout = _Layout(result, font, _cell_size(result), title)
    norm = result.normalized()
    values = result.values
    n_rows, n_cols = values.shape
    cell = layout.cell
    painter.setPen(QColor(theme.TEXT))
    heading, metric = _heading(result, title)
    painter.drawText(QRectF(_MARGIN, _MARGIN, 2000, layout.line), heading)
    painter.setPen(QColor(theme.TEXT_MUTED))
    painter.drawText(QRectF(_MARGIN, _MARGIN + layout.line, 2000, layout.line), metric)
    # column labels, rotated so long ones fit
    for j, label in enumerate(result.columns):
        painter.save()
        painter.translate(layout.left + (j + 0.5) * cell + layout.line / 3, layout.top - 4)
        painter.rotate(-90)
        painter.drawText(QRectF(0, -layout.line, layout.col_height, layout.line), label)
        painter.restore()
    show_numbers = cell >= 40
    small = QFont(font)
    small.setPointSizeF(max(6.0, font.pointSizeF() * 0.8))
    for i, label in enumerate(result.rows):
        y = layout.top + i * cell
        painter.setPen(QColor(theme.TEXT_MUTED))
        painter.drawText(
            QRectF(_MARGIN, y, layout.row_width - 8, cell),
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
            label,
        )
        for j in range(n_cols):
            rect = QRectF(layout.left + j * cell, y, cell - 1, cell - 1)
            colour = effect_colour(float(norm[i, j]))
            painter.fillRect(rect, colour)
            value = float(values[i, j])
            if show_numbers and not math.isnan(value):
                painter.setFont(small)
                painter.setPen(
                    QColor(theme.TEXT_ON_LIGHT if colour.lightness() > 140 else theme.TEXT)
                )
                painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, f"{value:.2f}")
                painter.setFont(font)
    # legend
    y = layout.top + n_rows * cell + 6
    steps = 40
    width = min(240.0, n_cols * cell)
    for k in range(steps):
        x = -1 + 2 * k / (steps - 1)
        painter.fillRect(
            QRectF(layout.left + k * width / steps, y, width / steps + 1, layout.line * 0.6),
            effect_colour(x),
        )
    painter.setPen(QColor(theme.TEXT_MUTED))
    painter.drawText(QRectF(layout.left, y + layout.line * 0.7, 2000, layout.line), _LEGEND)


def sweep_image(result: SweepResult, title: str = "", scale: float = 2.0) -> QImage:
    """The heatmap as an image (needs a QGuiApplication, offscreen is fine)."""
    size = sweep_size(result, title=title)
    image = QImage(
        round(size.width() * scale), round(size.height() * scale), QImage.Format.Format_RGB32
    )
    image.setDevicePixelRatio(scale)
    image.fill(QColor(theme.BACKGROUND))
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
    paint_sweep(painter, result, title)
    painter.end()
    return image


class SweepHeatmap(QWidget):
    """Shows a :class:`SweepResult` (or nothing yet) as :func:`paint_sweep` draws it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.result: SweepResult | None = None
        self.title = ""
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def set_result(self, result: SweepResult | None, title: str = "") -> None:
        self.result = result
        self.title = title
        self.updateGeometry()
        self.update()

    def sizeHint(self) -> QSize:
        if self.result is None:
            return QSize(400, 240)
        return sweep_size(self.result, self.font(), self.title)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor(theme.BACKGROUND))
        if self.result is None:
            painter.setPen(QColor(theme.TEXT_MUTED))
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "no sweep yet")
        else:
            painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
            paint_sweep(painter, self.result, self.title)
        painter.end()
