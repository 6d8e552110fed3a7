"""The Gradient tab: a step's forward value beside its gradient, and the layers' gradient norms.

For a training-step trace (``tracing.trace_step``): on a forward step, its first output
and that tensor's gradient; on a backward step, the forward tensor it differentiates and
the gradient it holds. A table gives both tensors' statistics and L2 norms; two heatmaps
show them side by side, on the same slice. Below, a strip of bars gives each layer's
parameter-gradient norm on a log scale (the current step's layer in the highlight
colour), so a vanishing or exploding stack shows as a slope. A forward-only trace says
how to get one.
"""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from app.theme import BACKGROUND, CURRENT, EDGE, ERROR, NONFINITE, TEXT_MUTED
from app.widgets.common import column
from app.widgets.tensor_view import TensorView
from tracing.analysis.gradients import layer_grad_norms, layer_of
from tracing.breakpoints import Output, grad_norm
from tracing.record import TensorRecord, Trace

COLUMNS = ("tensor", "shape", "norm", "min", "max", "mean", "std", "NaN", "Inf")
NO_TRAINING_STEP = (
    "<b>This trace has no backward pass.</b><br>Trace a training step (File ▸ New trace ▸ "
    "<i>training step</i>, <code>tracing.trace_step</code>, or "
    "<code>scratchformer train --trace-step N</code>) to see gradients here."
)


def value_and_grad(trace: Trace, index: int) -> tuple[TensorRecord | None, TensorRecord | None]:
    """(forward tensor, its gradient) for step ``index``; either may be None."""
    step = trace.steps[index]
    if not step.outputs:
        return None, None
    if step.kind == "backward":
        grad = trace.tensors[step.outputs[0]]
        forward = trace.tensors[grad.grad_of] if grad.grad_of is not None else None
        return forward, grad
    forward = trace.tensors[step.outputs[0]]
    return forward, trace.grad(forward.id)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


class GradientPanel(QWidget):
    """Value | gradient for the current step, over a per-layer gradient-norm strip."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._trace: Trace | None = None
        self._tokens = None
        self._layers: list[str] = []

        self.message = QLabel(NO_TRAINING_STEP)
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.RichText)
        self.message.setAlignment(Qt.AlignmentFlag.AlignCenter)

        self.table = QTableWidget(2, len(COLUMNS))
        self.table.setObjectName("gradientTable")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        row_h = self.table.fontMetrics().height() + 10
        self.table.verticalHeader().setDefaultSectionSize(row_h)
        self.table.verticalHeader().setMinimumSectionSize(row_h)
        header_h = self.table.horizontalHeader().sizeHint().height()
        self.table.setFixedHeight(header_h + 2 * row_h + 2 * self.table.frameWidth() + 16)

        self.value_view = TensorView()
        self.grad_view = TensorView()
        self.value_title = QLabel("forward value")
        self.grad_title = QLabel("gradient")
        pair = QSplitter(Qt.Orientation.Horizontal)
        for title, view in ((self.value_title, self.value_view), (self.grad_title, self.grad_view)):
            pair.addWidget(column(title, (view, 1), spacing=2))
        self.value_view.sliceChanged.connect(self._follow_slice)

        self.strip = pg.PlotWidget(background=BACKGROUND)
        self.strip.setObjectName("gradNormStrip")
        self.strip.setFixedHeight(150)
        self.strip.setMouseEnabled(x=False, y=False)
        self.strip.hideButtons()
        self.strip.setLabel("left", "log₁₀ ‖∇‖")
        self.strip.getPlotItem().setMenuEnabled(False)
        self.strip.getAxis("left").enableAutoSIPrefix(False)
        self.strip_title = QLabel("parameter-gradient norm per layer")
        self.strip_title.setStyleSheet(f"color: {TEXT_MUTED}")

        self.body = column(self.table, (pair, 1), self.strip_title, self.strip, spacing=4)
        column(self.message, (self.body, 1), on=self)
        self.set_trace(None)

    # ---- interface

    def set_trace(self, trace: Trace | None, tokens=None) -> None:
        self._trace = trace
        self._tokens = tokens
        training = trace is not None and trace.backward_start is not None
        self.message.setVisible(not training)
        self.body.setVisible(training)
        self._norms = layer_grad_norms(trace) if training else {}
        self._layers = list(self._norms)

    def set_step(self, index: int) -> None:
        trace = self._trace
        if trace is None or trace.backward_start is None:
            return
        forward, grad = value_and_grad(trace, index)
        step = trace.steps[index]
        what = "gradient" if grad is None else f"gradient (tensor {grad.id})"
        self.grad_title.setText(what if step.kind != "backward" else f"{what} · {step.op}")
        self.value_title.setText(
            "forward value" if forward is None else f"forward value (tensor {forward.id})"
        )
        for row, (name, rec) in enumerate((("value", forward), ("gradient", grad))):
            self._fill_row(row, name, rec)
        self._show(self.value_view, forward, "This step has no forward tensor.")
        self._show(self.grad_view, grad, "No gradient reached this tensor.")
        self._follow_slice()
        self._draw_strip(layer_of(step.module + ".x") if step.module else "")

    # ---- parts

    def _fill_row(self, row: int, name: str, rec: TensorRecord | None) -> None:
        cells = [name] + ["—"] * (len(COLUMNS) - 1)
        if rec is not None:
            s = rec.stats
            norm = grad_norm(Output(rec, loader=lambda: self._trace.value(rec.id)))
            cells[1] = rec.shape_str()
            cells[2] = _fmt(norm)
            if s is not None:
                cells[3:] = [
                    _fmt(s.min),
                    _fmt(s.max),
                    _fmt(s.mean),
                    _fmt(s.std),
                    str(s.nan),
                    str(s.inf),
                ]
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if rec is not None and rec.stats is not None and rec.stats.has_nonfinite and col >= 7:
                item.setForeground(QColor(NONFINITE))
            self.table.setItem(row, col, item)

    def _show(self, view: TensorView, rec: TensorRecord | None, missing: str) -> None:
        if rec is None:
            view.show_message(missing)
            return
        value = self._trace.value(rec.id)
        reason = ""
        if value is None:
            reason = "<b>No value kept</b><br>(trace at capture <code>values</code>)."
            if self._trace.meta.get("capture") == "values":
                reason = "<b>No value kept</b><br>(larger than the trace's value cap)."
        view.show_tensor(rec, value, token_labels=self._tokens, missing_reason=reason)

    def _follow_slice(self) -> None:
        """The gradient heatmap shows the slice the value heatmap shows."""
        index = self.value_view.leading_index()
        if index and self.grad_view.leading_index() != index:
            self.grad_view.set_leading_index(index)

    def _draw_strip(self, current: str) -> None:
        plot = self.strip.getPlotItem()
        plot.clear()
        if not self._norms:
            return
        names = self._layers
        finite = [math.log10(max(v, 1e-30)) for v in self._norms.values() if math.isfinite(v)]
        top = max(finite, default=0.0) + 0.5  # a NaN or Inf norm: a full-height error bar
        logs = [
            math.log10(max(v, 1e-30)) if math.isfinite(v) else top for v in self._norms.values()
        ]
        low = min(logs) - 0.5
        brushes = [
            pg.mkBrush(CURRENT if name == current else EDGE)
            if math.isfinite(v)
            else pg.mkBrush(ERROR)
            for name, v in zip(names, self._norms.values())
        ]
        bars = pg.BarGraphItem(
            x=list(range(len(names))),
            height=[v - low for v in logs],
            y0=low,
            width=0.7,
            brushes=brushes,
        )
        plot.addItem(bars)
        axis = plot.getAxis("bottom")
        step = max(1, len(names) // 12)
        values = list(self._norms.values())
        labels = [
            name if math.isfinite(v) else f"{name} ({'NaN' if math.isnan(v) else 'Inf'})"
            for name, v in zip(names, values)
        ]
        shown = set(range(0, len(names), step)) | {
            i for i, v in enumerate(values) if not math.isfinite(v)
        }
        axis.setTicks([[(i, labels[i]) for i in sorted(shown)]])
