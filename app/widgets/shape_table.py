"""``ShapeTableModel``: the tensors of one step as a table (a thin Qt adapter over ``Step``).

One row per tensor the step saw, inputs first, then outputs::

    tensor          shape          dims           dtype    min     max    mean    std  NaN/Inf
    in · x          (1, 24, 64)    (B, T, C)      float32  -3.1    2.9    0.002   1    0
    out · output    (1, 24, 64)    (B, T, C)      float32  ...

The model reads the plain-Python ``Trace``; switching steps formats the few cell texts
once and updates the rows in place (no model reset, so the view keeps its header, layout
and selection and only repaints the cells). Statistics come from the record (captured at "stats" and
"values"); at "shapes" they show as a dash. A tensor holding NaN or Inf gets its NaN/Inf
cell painted red, so a blow-up is visible at a glance.
"""

from __future__ import annotations

from typing import Any, ClassVar

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QBrush, QColor, QFont

from app import theme
from tracing.dim_legend import dims_hover, dims_text, letter_legend
from tracing.formatting import format_number
from tracing.record import Step, TensorRecord, Trace

AnyIndex = QModelIndex | QPersistentModelIndex


# Roles as plain ints: ``data`` runs for every cell and role on every repaint, and an
# int comparison is much cheaper than one against a Python enum member.
_DISPLAY = int(Qt.ItemDataRole.DisplayRole)
_TOOLTIP = int(Qt.ItemDataRole.ToolTipRole)
_ALIGNMENT = int(Qt.ItemDataRole.TextAlignmentRole)
_BACKGROUND = int(Qt.ItemDataRole.BackgroundRole)
_FOREGROUND = int(Qt.ItemDataRole.ForegroundRole)
_FONT = int(Qt.ItemDataRole.FontRole)
_LEFT = int((Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter).value)
_RIGHT = int((Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter).value)
_CELL_FLAGS = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
_NO_FLAGS = Qt.ItemFlag.NoItemFlags


class ShapeTableModel(QAbstractTableModel):
    """Rows: the current step's input then output tensors. Columns: see ``COLUMNS``."""

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "tensor",
        "shape",
        "dims",
        "dtype",
        "min",
        "max",
        "mean",
        "std",
        "NaN/Inf",
    )
    NAME, SHAPE, DIMS, DTYPE, MIN, MAX, MEAN, STD, NONFINITE = range(9)
    STAT_COLUMNS: ClassVar[tuple[int, ...]] = (MIN, MAX, MEAN, STD)

    TensorIdRole = Qt.ItemDataRole.UserRole + 1
    """``data(index, TensorIdRole)`` -> the tensor id (index into ``Trace.tensors``)."""
    DirectionRole = Qt.ItemDataRole.UserRole + 2
    """``data(index, DirectionRole)`` -> ``"in"`` or ``"out"``."""

    _TOOLTIPS: ClassVar[dict[int, str]] = {
        NAME: "Input (in) or output (out) of this step, and its argument name",
        SHAPE: "Size of each axis",
        DIMS: "Axis names, whole; hover a cell for each letter's size and origin "
        "(View ▸ Dims legend lists the trace's letters)",
        DTYPE: "Element type",
        MIN: "Smallest finite element",
        MAX: "Largest finite element",
        MEAN: "Mean of the finite elements",
        STD: "Standard deviation of the finite elements",
        NONFINITE: "Number of NaN and Inf elements (red when any)",
    }

    def __init__(self, parent=None):
        super().__init__(parent)
        self._trace: Trace | None = None
        self._legend = None  # the trace's letters (tracing.dim_legend), None: sizes only
        self._step: Step | None = None
        # (direction, name, record) per row, filled on set_step
        self._rows: list[tuple[str, str, TensorRecord]] = []
        self._texts: list[tuple[str, ...]] = []  # display text per row and column
        self._bold = QFont()
        self._bold.setBold(True)
        self._name_brushes = {d: QBrush(QColor(c)) for d, c in theme.DIRECTION_COLOURS.items()}
        self._bad_background = QBrush(QColor(theme.NONFINITE))
        self._bad_foreground = QBrush(QColor(theme.WHITE))
        self._alignments = tuple(
            _RIGHT if c in self.STAT_COLUMNS or c == self.NONFINITE else _LEFT
            for c in range(len(self.COLUMNS))
        )
        self._header_alignments = tuple(
            _RIGHT if c in self.STAT_COLUMNS else _LEFT for c in range(len(self.COLUMNS))
        )

    # ---- feeding

    def set_trace(self, trace: Trace | None) -> None:
        self.beginResetModel()
        self._trace, self._step, self._rows, self._texts = trace, None, [], []
        self._legend = letter_legend(trace.meta) if trace is not None else None
        self.endResetModel()

    def set_step(self, step: Step | int | None) -> None:
        """Show the tensors of ``step`` (a ``Step`` or its index)."""
        if isinstance(step, int):
            if self._trace is None:
                raise ValueError("set_trace() first: there is no trace to take a step from")
            step = self._trace.steps[step]
        rows: list[tuple[str, str, TensorRecord]] = []
        if step is not None and self._trace is not None:
            for direction, ids, names in (
                ("in", step.inputs, step.input_names),
                ("out", step.outputs, step.output_names),
            ):
                for k, tensor_id in enumerate(ids):
                    name = names[k] if k < len(names) else f"{direction}[{k}]"
                    rows.append((direction, name, self._trace.tensors[tensor_id]))
        texts = [
            tuple(self._display(d, n, r, c) for c in range(len(self.COLUMNS))) for d, n, r in rows
        ]
        self._step = step
        # No model reset: rows the two steps share get new cell data, and only the
        # difference is inserted or removed, so the view keeps its layout, header and
        # selection and just repaints the cells.
        old, new = len(self._rows), len(rows)
        if new < old:
            self.beginRemoveRows(QModelIndex(), new, old - 1)
            self._rows, self._texts = self._rows[:new], self._texts[:new]
            self.endRemoveRows()
        elif new > old:
            self.beginInsertRows(QModelIndex(), old, new - 1)
            self._rows, self._texts = self._rows + rows[old:], self._texts + texts[old:]
            self.endInsertRows()
        shared = min(old, new)
        changed = [
            r for r in range(shared) if texts[r] != self._texts[r] or rows[r] != self._rows[r]
        ]
        self._rows, self._texts = rows, texts
        if changed:
            last = len(self.COLUMNS) - 1
            self.dataChanged.emit(self.index(changed[0], 0), self.index(changed[-1], last))

    @property
    def step(self) -> Step | None:
        return self._step

    def record(self, row: int) -> TensorRecord:
        return self._rows[row][2]

    def direction(self, row: int) -> str:
        return self._rows[row][0]

    def default_row(self) -> int:
        """The row to show first: the first output, else the first input, else -1."""
        for row, (direction, _name, _record) in enumerate(self._rows):
            if direction == "out":
                return row
        return 0 if self._rows else -1

    def row_of(self, tensor_id: int, direction: str | None = None) -> int:
        """The first row showing ``tensor_id`` (optionally only "in" or "out"), or -1."""
        for row, (d, _name, record) in enumerate(self._rows):
            if record.id == tensor_id and (direction is None or d == direction):
                return row
        return -1

    # ---- QAbstractTableModel

    def rowCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = 0) -> Any:
        if orientation == Qt.Orientation.Horizontal and 0 <= section < len(self.COLUMNS):
            if role == _DISPLAY:
                return self.COLUMNS[section]
            if role == _TOOLTIP:
                return self._TOOLTIPS[section]
            if role == _ALIGNMENT:
                return self._header_alignments[section]
        if orientation == Qt.Orientation.Vertical and role == _DISPLAY:
            return section + 1
        return None

    def flags(self, index: AnyIndex) -> Qt.ItemFlag:
        return _CELL_FLAGS if index.isValid() else _NO_FLAGS

    def data(self, index: AnyIndex, role: int = _DISPLAY) -> Any:
        row = index.row()  # -1 for an invalid index
        if not 0 <= row < len(self._texts):
            return None
        column = index.column()
        if role == _DISPLAY:
            return self._texts[row][column]
        if role == _ALIGNMENT:
            return self._alignments[column]
        if role == _FOREGROUND:
            if column == self.NAME:
                return self._name_brushes[self._rows[row][0]]
            if column == self.NONFINITE and self._nonfinite(row):
                return self._bad_foreground
            return None
        if role == _BACKGROUND:
            return (
                self._bad_background if column == self.NONFINITE and self._nonfinite(row) else None
            )
        if role == _FONT:
            return self._bold if column == self.NONFINITE and self._nonfinite(row) else None
        if role == _TOOLTIP:
            return self._tooltip(*self._rows[row], column)
        if role == self.TensorIdRole:
            return self._rows[row][2].id
        if role == self.DirectionRole:
            return self._rows[row][0]
        return None

    def _nonfinite(self, row: int) -> bool:
        stats = self._rows[row][2].stats
        return stats is not None and stats.has_nonfinite

    # ---- cell text

    def _display(self, direction: str, name: str, record: TensorRecord, column: int) -> str:
        stats = record.stats
        if column == self.NAME:
            return f"{direction} · {name}"
        if column == self.SHAPE:
            return record.shape_str(symbolic=False)
        if column == self.DIMS:
            if record.dims and len(record.dims) == len(record.shape):
                return dims_text(record.shape, record.dims)  # whole: the view never cuts it
            return "—"
        if column == self.DTYPE:
            return record.dtype
        if column in self.STAT_COLUMNS:
            if stats is None:
                return "—"
            value = (stats.min, stats.max, stats.mean, stats.std)[column - self.MIN]
            return format_number(value)
        if column == self.NONFINITE:
            if stats is None:
                return "—"
            if not stats.has_nonfinite:
                return "0"
            parts = []
            if stats.nan:
                parts.append(f"{stats.nan} NaN")
            if stats.inf:
                parts.append(f"{stats.inf} Inf")
            return " · ".join(parts)
        return ""

    def _tooltip(self, direction: str, name: str, record: TensorRecord, column: int) -> str:
        what = "input" if direction == "in" else "output"
        head = f"{what} {name!r} · tensor #{record.id}"
        if record.role:
            head += f" · {record.role}"
        if column == self.DIMS:  # each letter's size, meaning and origin
            return head + "\n" + dims_hover(record.shape, record.dims, self._legend, record.why)
        lines = [head, record.shape_str(symbolic=True), f"{record.numel:,} elements"]
        if record.stats is None:
            lines.append("no statistics captured (capture level 'shapes')")
        elif column == self.NONFINITE and record.stats.has_nonfinite:
            lines.append(f"{record.stats.nan} NaN and {record.stats.inf} Inf elements")
        return "\n".join(lines)


__all__ = ["ShapeTableModel"]
