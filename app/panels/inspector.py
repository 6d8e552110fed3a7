"""The inspector: the right-hand panel that shows what one step of a trace did to its tensors.

::

    ┌ step 33 / 104 · softmax ─────────────────────────────┐
    │ blocks.0.self_attn.attention · attention.py:57 ...   │
    ├ [Tensors] [Attention] ───────────────────────────────┤
    │ shape table: in/out tensors, shapes, dims, stats     │   Tensors: the table, and the
    │ ──────────────────────────────────────────────────── │   selected row's tensor as a
    │ slice  B [0]  H [2]               [B=0, H=2] → T × T │   heatmap (leading axes picked
    │ heatmap with token labels and a colour bar           │   with spin boxes)
    ├──────────────────────────────────────────────────────┤
    │ stats strip: shape · dtype · min max mean std · NaN  │
    └──────────────────────────────────────────────────────┘

The main window drives it with ``set_trace(trace)`` and ``set_step(index)``, and listens to
``stepRequested`` (emitted when the user clicks an attention thumbnail or "Go to step").

``set_step`` has to keep up with a held-down arrow key on a gpt2-small trace, so nothing
is rebuilt per step: the table model is reset over a few rows, the one ``ImageItem`` gets
new pixels (huge tensors are strided down for display), recently viewed values are cached,
and the attention tab only redraws while it is visible.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from pathlib import Path

import torch
from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableView,
    QTabWidget,
    QWidget,
)

from app import theme
from app.panels.attention import AttentionPanel
from app.panels.gradient import GradientPanel
from app.theme import ERROR_TEXT
from app.widgets.common import ElidedLabel, LayoutFirewall, column, make_heading
from app.widgets.heatmap import HeatmapView
from app.widgets.shape_table import ShapeTableModel
from app.widgets.tensor_view import TensorView, token_labels
from tracing.analysis.compute import NOTE, compute_of, format_mult_adds
from tracing.analysis.postmortem import failure_lines
from tracing.formatting import format_number, step_number, step_text
from tracing.record import TensorRecord, Trace

_ROW = QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows

VALUE_CACHE_SIZE = 24
"""Tensor values kept at hand (a trace opened from disk reads each one lazily)."""


COLUMN_SAMPLES = {
    ShapeTableModel.SHAPE: "(1, 12, 256, 256)",
    ShapeTableModel.DIMS: "(B, H, T, T)",
    ShapeTableModel.DTYPE: "bfloat16",
    ShapeTableModel.MIN: "-0.0001234",
    ShapeTableModel.MAX: "-0.0001234",
    ShapeTableModel.MEAN: "-0.0001234",
    ShapeTableModel.STD: "-0.0001234",
    ShapeTableModel.NONFINITE: "1234 Inf",
}
"""Text as wide as a column's usual content: sets the shape table's initial widths."""


class Inspector(QWidget):
    """Shape table, tensor heatmap, attention maps and statistics for the current step."""

    stepRequested = Signal(int)
    """The user asked to jump to this step (e.g. clicked an attention thumbnail)."""

    TENSORS_TAB, ATTENTION_TAB, GRADIENT_TAB = 0, 1, 2

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._trace: Trace | None = None
        self._compute: dict[str, tuple[int, int]] = {}  # torchinfo mult-adds, params by path
        self._step_index = -1
        self._tokens: list[str] | None = None
        self._values: OrderedDict[int, torch.Tensor | None] = OrderedDict()
        self._selecting = False  # set while set_step selects the default row itself
        self._tensor_dirty = False  # the Tensors tab is hidden and behind the current step
        self._attention_strip: tuple = (None, "")  # (layer/head key, strip text) cache
        self._build_header()
        self._build_tensors_tab()
        self._build_tabs()
        self._build_strip()
        # opaque: what changes in here repaints from here down, not the window behind
        self.setAutoFillBackground(True)
        column(
            self._title,
            self._where,
            self.failure_label,
            (self.tabs, 1),
            self._strip_box,
            margins=(6, 6, 6, 6),
            spacing=4,
            on=self,
        )
        self.tensor_view.show_message("Open a trace to inspect its tensors.")

    # ---- building

    def _build_header(self) -> None:
        """The step's title, where it ran, and the post-mortem of a partial trace."""
        self._title = ElidedLabel("No trace loaded")
        self._title.setObjectName("inspectorTitle")
        make_heading(self._title)
        self._where = ElidedLabel()
        self._where.setObjectName("inspectorWhere")
        self._where.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        # ---- the post-mortem of a partial trace, on its failing step
        self.failure_label = QLabel()
        self.failure_label.setObjectName("inspectorFailure")
        self.failure_label.setWordWrap(True)
        self.failure_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.failure_label.setStyleSheet(
            f"QLabel {{ color: {ERROR_TEXT}; font-family: monospace; padding: 4px; }}"
        )
        self.failure_label.hide()

    def _build_tensors_tab(self) -> None:
        """The Tensors tab: the shape table over the tensor heatmap."""
        self.table_model = ShapeTableModel(self)
        self.table = QTableView()
        self.table.setObjectName("shapeTable")
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        header = self.table.horizontalHeader()
        # Fixed widths sized for typical content (measuring every cell on every step would
        # cost more than the rest of the step); the name column takes what is left and
        # elides in the middle. The user can still drag the columns.
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(ShapeTableModel.NAME, QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(36)
        metrics = self.table.fontMetrics()
        for col, sample in COLUMN_SAMPLES.items():
            self.table.setColumnWidth(col, metrics.horizontalAdvance(sample) + 16)
        header.setHighlightSections(False)
        # The header shares the table's selection unless told otherwise, and repaints
        # itself whenever the selected row changes (every step): give it its own.
        header.setSelectionModel(QItemSelectionModel(self.table_model, header))
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.table.selectionModel().currentRowChanged.connect(self._on_row_changed)

        self.tensor_view = TensorView()
        self.tensor_view.sliceChanged.connect(self._update_strip)

        self._tensor_splitter = QSplitter(Qt.Orientation.Vertical)
        self._tensor_splitter.setChildrenCollapsible(False)
        self._tensor_splitter.addWidget(self.table)
        self._tensor_splitter.addWidget(self.tensor_view)
        self._tensor_splitter.setStretchFactor(0, 0)
        self._tensor_splitter.setStretchFactor(1, 1)
        self._tensor_splitter.setSizes([140, 520])

    def _build_tabs(self) -> None:
        """Tensors, Attention, and Gradient (training-step traces: value beside gradient)."""
        self.attention = AttentionPanel()
        self.attention.stepRequested.connect(self.stepRequested)
        self.attention.selectionChanged.connect(self._update_strip)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self._tensor_splitter, "Tensors")
        self.tabs.addTab(self.attention, "Attention")
        self.gradient = GradientPanel()
        self._gradient_dirty = False
        self.tabs.addTab(self.gradient, "Gradient")
        self.tabs.currentChanged.connect(self._on_tab_changed)

    def _build_strip(self) -> None:
        """The statistics strip under the tabs: three lines of a fixed height."""
        self._strip = QLabel(" ")
        self._strip.setObjectName("statsStrip")
        self._strip.setTextFormat(Qt.TextFormat.RichText)
        self._strip.setWordWrap(True)
        self._strip.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._strip.setMargin(4)
        self._strip.setAutoFillBackground(True)
        self._strip.setBackgroundRole(QPalette.ColorRole.AlternateBase)
        # a fixed height behind a firewall: the new text of every step (whose wrapped
        # height Qt would measure) never re-lays out the heatmap or repaints the tabs
        # three lines: the tensor, its statistics, the slice shown (see _strip_text),
        # measured as laid out (a rich-text line, bold or not, is taller than lineSpacing)
        self._strip.ensurePolished()
        self._strip.setText("<b>Ag</b><br>Ag<br>Ag")
        strip_height = self._strip.heightForWidth(10_000) + 2
        self._strip.setText(" ")
        self._strip_box = LayoutFirewall(self._strip, strip_height)

    # ---- the interface the main window uses

    def set_trace(self, trace: Trace | None) -> None:
        """Show a new trace (None clears). Starts at step 0 when it has steps."""
        self._trace = trace
        self._compute = compute_of(trace) if trace is not None else {}
        self._values.clear()
        self._step_index = -1
        self._tokens = token_labels(trace) if trace is not None else None
        self.table_model.set_trace(trace)
        self.attention.set_trace(trace, self._tokens)
        self.gradient.set_trace(trace, self._tokens)
        if trace is None or not trace.steps:
            self._title.setText("No trace loaded" if trace is None else "The trace is empty")
            self._where.setText(" ")
            self.tensor_view.show_message(
                "Open a trace to inspect its tensors."
                if trace is None
                else "This trace recorded no steps."
            )
            self._update_strip()
            return
        self.set_step(0)

    def set_step(self, index: int) -> None:
        """Show step ``index``: its tensors, the first output as a heatmap, its layer."""
        trace = self._trace
        if trace is None:
            raise ValueError("set_trace() first: the inspector has no trace")
        if not 0 <= index < len(trace.steps):
            raise IndexError(f"step {index} is out of range: the trace has {len(trace.steps)}")
        self._step_index = index
        step = trace.steps[index]
        self._set_header(index)
        # rows removed or replaced under the selection move the current row: the heatmap
        # waits for the row chosen below instead of drawing every intermediate one
        self._selecting = True
        try:
            self.table_model.set_step(step)
            self._fit_whole_columns()
            row = self.table_model.default_row()
            if row >= 0:
                self.table.selectionModel().setCurrentIndex(self.table_model.index(row, 0), _ROW)
        finally:
            self._selecting = False
        if self.tabs.currentIndex() == self.TENSORS_TAB:
            self._show_row(row)
        else:  # hidden: draw the heatmap when the tab is shown again
            self._tensor_dirty = True
            self._update_strip()
        if self.tabs.currentIndex() == self.GRADIENT_TAB:
            self.gradient.set_step(index)
        else:
            self._gradient_dirty = True
        layer = self.attention.layer_for_step(index)
        if layer is not None:
            self.attention.set_layer(layer)  # keeps the head the user chose

    def _fit_whole_columns(self) -> None:
        """Widen the shape and dims columns to this step's widest cell, so that a 5-D
        ``(B, KV, H/KV, T, D)`` reads whole (they only grow: stepping never makes them jump
        back and forth; the table scrolls sideways when they outgrow it)."""
        model, metrics = self.table_model, self.table.fontMetrics()
        for col in (ShapeTableModel.SHAPE, ShapeTableModel.DIMS):
            texts = [model.data(model.index(r, col)) or "" for r in range(model.rowCount())]
            if not texts:
                continue
            need = max(metrics.horizontalAdvance(t) for t in texts) + 16
            if need > self.table.columnWidth(col):
                self.table.setColumnWidth(col, need)

    def export_heatmap(self, path: str | Path) -> Path:
        """Save the heatmap on show (attention tab: the attention map) as PNG or SVG."""
        return self.current_heatmap().export(path)

    # ---- parts, for the main window and tests

    @property
    def trace(self) -> Trace | None:
        return self._trace

    @property
    def step_index(self) -> int:
        return self._step_index

    @property
    def heatmap(self) -> HeatmapView:
        """The tensor heatmap of the Tensors tab."""
        return self.tensor_view.heatmap

    def current_heatmap(self) -> HeatmapView:
        """The heatmap of the tab on show."""
        if self.tabs.currentIndex() == self.ATTENTION_TAB and self.attention.paths:
            self.attention.refresh()
            return self.attention.heatmap
        return self.tensor_view.heatmap

    def select_row(self, row: int) -> None:
        """Show the tensor in row ``row`` of the shape table (as a click would)."""
        self.table.selectRow(row)

    def value(self, tensor_id: int) -> torch.Tensor | None:
        """``trace.value(tensor_id)``, through a small cache (values may load from disk)."""
        if tensor_id in self._values:
            self._values.move_to_end(tensor_id)
            return self._values[tensor_id]
        assert self._trace is not None
        value = self._trace.value(tensor_id)
        self._values[tensor_id] = value
        if len(self._values) > VALUE_CACHE_SIZE:
            self._values.popitem(last=False)
        return value

    # ---- internals

    def _set_header(self, index: int) -> None:
        assert self._trace is not None
        step = self._trace.steps[index]
        total = len(self._trace.steps)
        kind = "module" if step.kind == "module" else "op"
        if step.kind == "backward":  # "backward of step 37 (matmul)"
            kind = "backward"
            if step.forward is not None:
                kind += f" of {step_text(step.forward)} ({self._trace.steps[step.forward].op})"
        # 1-based, like the status line of the step bar ("step 34 / 104 · ...")
        self._title.setText(f"Step {step_number(index)} / {total} · {step.op}")
        where = f"{step.module or '<root>'} · {kind}"
        if step.kind == "module":  # where the compute goes: torchinfo's figures, if kept
            figures = self._compute.get(step.module)
            if figures is not None:
                macs, params = figures
                where += f" · {format_mult_adds(macs) or 0} mult-adds, {params:,} params"
        if step.source is not None:
            where += f" · {Path(step.source.file).name}:{step.source.line}"
            if step.source.text:
                where += f"  {step.source.text}"
        if step.error:
            where += f" · raised: {step.error}"
        self._where.setText(where)
        self._where.setToolTip(where + (f"\n({NOTE})" if self._compute else ""))
        lines = failure_lines(self._trace, index)
        self.failure_label.setText("\n".join(lines))
        self.failure_label.setVisible(bool(lines))

    def _on_tab_changed(self, tab: int) -> None:
        if tab == self.TENSORS_TAB and self._tensor_dirty:
            self._show_row(self.table.currentIndex().row())
        if tab == self.GRADIENT_TAB and self._gradient_dirty and self._step_index >= 0:
            self._gradient_dirty = False
            self.gradient.set_step(self._step_index)
        self._update_strip()

    def _on_row_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if not self._selecting:
            self._show_row(current.row() if current.isValid() else -1)

    def _show_row(self, row: int) -> None:
        self._tensor_dirty = False
        if row < 0 or row >= self.table_model.rowCount():
            self.tensor_view.show_message("This step has no tensor inputs or outputs.")
            self._update_strip()
            return
        record = self.table_model.record(row)
        value = self.value(record.id)
        self.tensor_view.show_tensor(
            record,
            value,
            token_labels=self._tokens,
            missing_reason=self._missing_reason(record) if value is None else "",
        )
        self._update_strip()

    def _missing_reason(self, record: TensorRecord) -> str:
        """Why there is no heatmap for ``record``, in words that say what to do."""
        assert self._trace is not None
        capture = self._trace.meta.get("capture")
        if capture in ("shapes", "stats"):
            return (
                "<b>Values were not captured.</b><br>This trace was recorded at capture "
                f"level <code>{capture}</code>, which keeps "
                f"{'shapes only' if capture == 'shapes' else 'shapes and statistics'}."
                "<br>Trace again with capture <code>values</code> to see heatmaps."
            )
        cap = self._trace.meta.get("value_cap")
        if capture == "values" and cap:
            return (
                "<b>This tensor's values were not kept.</b><br>It has "
                f"{record.numel:,} elements, more than the capture's value cap of "
                f"{int(cap):,}."
            )
        return "<b>No values were kept for this tensor.</b>"

    def _update_strip(self, *_args) -> None:
        self._strip.setText(self._strip_text())

    def _strip_text(self) -> str:
        if self.tabs.currentIndex() == self.GRADIENT_TAB:
            return " "  # the tab's own table holds the statistics
        if self.tabs.currentIndex() == self.ATTENTION_TAB:
            a = self.attention.current_map()
            if a is None:
                return " "
            key = (id(self._trace), self.attention.layer, self.attention.head, self.attention.batch)
            if self._attention_strip[0] == key:
                return self._attention_strip[1]
            row_sums = a.float().sum(-1)
            text = (
                f"<b>attention</b> L{self.attention.layer} · head {self.attention.head} · "
                f"({a.shape[0]} × {a.shape[1]}) · max {format_number(float(a.max()))} · "
                f"row sums {format_number(float(row_sums.min()))}"
                f"–{format_number(float(row_sums.max()))}"
            )
            self._attention_strip = (key, text)
            return text
        record = self.tensor_view.record
        if record is None:
            return " "
        row = self.table.currentIndex().row()
        name = ""
        if 0 <= row < self.table_model.rowCount():
            direction = self.table_model.direction(row)
            name = self.table_model.data(self.table_model.index(row, 0)) or direction
        # one line each (the strip is three lines high): the tensor, its statistics, the
        # slice on screen; a line too long for the width wraps into the next one's place
        lines = [
            " · ".join(
                [
                    f"<b>{html.escape(name)}</b>",
                    html.escape(record.shape_str(symbolic=True)),
                    record.dtype,
                    f"{record.numel:,} el",
                ]
            )
        ]
        stats = record.stats
        if stats is not None:
            nonfinite = f"NaN {stats.nan} · Inf {stats.inf}"
            if stats.has_nonfinite:
                nonfinite = f"<span style='color:{theme.NONFINITE}'><b>{nonfinite}</b></span>"
            if record.numel and stats.nan + stats.inf >= record.numel:  # min... are of nothing
                summary = "no finite value"
                if stats.nan == record.numel:
                    summary = "all NaN"
                lines.append(f"<span style='color:{theme.NONFINITE}'><b>{summary}</b></span> · "
                             + nonfinite)  # fmt: skip
            else:
                lines.append(
                    f"min {format_number(stats.min)} · max {format_number(stats.max)} · "
                    f"mean {format_number(stats.mean)} · std {format_number(stats.std)} · "
                    + nonfinite
                )
        cut = self.tensor_view.current_slice
        if cut is not None and self.heatmap.matrix is not None:
            shown = f"showing {html.escape(cut.describe())}"
            sr, sc = self.heatmap.stride
            if sr > 1 or sc > 1:
                shown += f" (every {sr}th row, {sc}th col)"
            lines.append(shown)
        return "<br>".join(lines)


__all__ = ["Inspector"]
