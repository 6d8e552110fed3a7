"""The Dims legend: every axis letter of the trace, its size, where the size came from, and
what it names (View ▸ Dims legend, Ctrl+Shift+D)::

    letter  size  origin                          meaning
    B       3     input: the first input's axis 0 batch: the first input's axis 0
    KV      2     config.num_key_value_heads      key/value heads (grouped-query attention…)
    ...
    second pass on the device at B=4, T=9: which axes move with the inputs

The letters the current step's tensors use are bold. The table is ``meta["dim_letters"]``
read by :func:`tracing.dim_legend.letter_legend`; a trace saved before letters kept their
evidence has none, and the legend says so (the dims cells then show sizes only).
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDockWidget,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from tracing.dim_legend import NO_LETTERS, LegendRow, evidence_text, letter_legend, letters_of
from tracing.record import Trace

COLUMNS = ("letter", "size", "origin", "meaning")
_RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter


class DimsLegend(QWidget):
    """The letters of one trace as a table; ``set_step`` bolds the current step's."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("dimsLegend")
        self.rows: list[LegendRow] | None = None
        self._trace: Trace | None = None
        self.note = QLabel()
        self.note.setObjectName("dimsLegendNote")
        self.note.setWordWrap(True)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("dimsLegendTable")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setShowGrid(False)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        for col in range(len(COLUMNS) - 1):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.note)
        self._bold = QFont()
        self._bold.setBold(True)
        self.set_trace(None)

    def set_trace(self, trace: Trace | None) -> None:
        self._trace = trace
        self.rows = letter_legend(trace.meta) if trace is not None else None
        rows = self.rows or []
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            cells = (row.letter, "?" if row.size is None else str(row.size), row.origin)
            for c, text in enumerate((*cells, row.meaning)):
                item = QTableWidgetItem(text)
                item.setToolTip(row.line())
                if c == 1:
                    item.setTextAlignment(_RIGHT)
                self.table.setItem(r, c, item)
        if trace is None:
            self.note.setText("No trace.")
        elif self.rows is None:
            self.note.setText(NO_LETTERS[0].upper() + NO_LETTERS[1:] + ".")
        else:
            note = evidence_text(trace.meta)
            unnamed = "An axis no evidence names reads ?=size."
            self.note.setText(f"{note} {unnamed}".strip())
        self.table.setVisible(bool(rows))

    def height_for_rows(self) -> int:
        """Pixels that show every letter at once (the dock is sized to it when shown)."""
        table = self.table.horizontalHeader().sizeHint().height()
        table += self.table.verticalHeader().length() + 2 * self.table.frameWidth()
        note = self.note.heightForWidth(max(self.width(), 600))
        return table + max(note, 0) + 16

    def sizeHint(self) -> QSize:  # Qt's name: the dock opens showing every letter
        return QSize(640, self.height_for_rows())

    def letters(self) -> list[str]:
        """The letters listed, top to bottom."""
        return [self.table.item(r, 0).text() for r in range(self.table.rowCount())]

    def set_step(self, index: int) -> None:
        """Bold the letters the tensors of step ``index`` are named with."""
        trace = self._trace
        if trace is None or not self.rows or not 0 <= index < len(trace.steps):
            return
        step = trace.steps[index]
        used: set[str] = set()
        for tid in (*step.inputs, *step.outputs):
            for name in trace.tensors[tid].dims or ():
                used.update(letters_of(name, self.rows))
        for r in range(self.table.rowCount()):
            on = self.table.item(r, 0).text() in used
            for c in range(len(COLUMNS)):
                item = self.table.item(r, c)
                if item.font().bold() != on:
                    item.setFont(self._bold if on else QFont())


def attach(window) -> QDockWidget:
    """Add the Dims legend dock to the main window (hidden; View ▸ Dims legend)."""
    dock = QDockWidget("Dims", window)
    dock.setObjectName("dimsDock")
    legend = DimsLegend(dock)
    dock.setWidget(legend)

    def on_trace_changed() -> None:
        legend.set_trace(window.trace)
        legend.set_step(window.current)

    window.traceChanged.connect(on_trace_changed)
    window.stepChanged.connect(legend.set_step)
    on_trace_changed()
    window.add_dock(
        dock,
        Qt.DockWidgetArea.BottomDockWidgetArea,  # wide: a letter's origin and meaning on one line
        "&Dims legend (axis letters)",
        shortcut="Ctrl+Shift+D",
        tip="Each axis letter of the trace: its size, where it came from, what it names",
    )
    dock.legend = legend
    return dock


__all__ = ["DimsLegend", "attach", "evidence_text"]
