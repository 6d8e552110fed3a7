"""``ShapeTableModel``: the tensors of one step as a table (a thin Qt adapter over ``Step``).

One row per tensor the step saw, inputs first, then outputs::

    tensor          shape          dims           dtype    min     max    mean    std  NaN/Inf
    in · x          (1, 24, 64)    (B, T, C)      float32  -3.1    2.9    0.002   1    0
    out · output    (1, 24, 64)    (B, T, C)      float32  ...

The model reads the plain-Python ``Trace`` and copies nothing: switching steps is a model
reset over a handful of rows. Statistics come from the record (captured at "stats" and
"values"); at "shapes" they show as a dash. A tensor holding NaN or Inf gets its NaN/Inf
cell painted red, so a blow-up is visible at a glance.
"""

from __future__ import annotations

from typing import Any, ClassVar

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QBrush, QColor, QFont

from tracing.record import Step, TensorRecord, Trace

AnyIndex = QModelIndex | QPersistentModelIndex

NONFINITE_BACKGROUND = QColor("#d62728")
NONFINITE_FOREGROUND = QColor("#ffffff")
DIRECTION_COLOURS = {"in": QColor("#1f77b4"), "out": QColor("#2ca02c")}


def format_number(value: float) -> str:
    """Four significant digits: ``0.0001234`` stays, ``12345`` becomes ``1.234e+04``."""
    return f"{value:.4g}"


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
        DIMS: "Symbolic axis names: B batch, T time, C d_model, H heads, D d_head, V vocab, F d_ff",
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
        self._step: Step | None = None
        # (direction, name, record) per row, filled on set_step
        self._rows: list[tuple[str, str, TensorRecord]] = []
        self._bold = QFont()
        self._bold.setBold(True)

    # ---- feeding

    def set_trace(self, trace: Trace | None) -> None:
        self.beginResetModel()
        self._trace, self._step, self._rows = trace, None, []
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
        self._step = step
        if len(rows) == len(self._rows) and rows:
            # same number of rows (most steps): new cell data, no reset, so the view keeps
            # its layout and selection and only repaints
            self._rows = rows
            last = self.index(len(rows) - 1, len(self.COLUMNS) - 1)
            self.dataChanged.emit(self.index(0, 0), last)
        else:
            self.beginResetModel()
            self._rows = rows
            self.endResetModel()

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
            if role == Qt.ItemDataRole.DisplayRole:
                return self.COLUMNS[section]
            if role == Qt.ItemDataRole.ToolTipRole:
                return self._TOOLTIPS[section]
            if role == Qt.ItemDataRole.TextAlignmentRole:
                return int(
                    (Qt.AlignmentFlag.AlignRight if section in self.STAT_COLUMNS
                     else Qt.AlignmentFlag.AlignLeft) | Qt.AlignmentFlag.AlignVCenter
                )  # fmt: skip
        if orientation == Qt.Orientation.Vertical and role == Qt.ItemDataRole.DisplayRole:
            return section + 1
        return None

    def flags(self, index: AnyIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        direction, name, record = self._rows[index.row()]
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(direction, name, record, column)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(direction, name, record, column)
        if role == self.TensorIdRole:
            return record.id
        if role == self.DirectionRole:
            return direction
        if role == Qt.ItemDataRole.TextAlignmentRole:
            if column in self.STAT_COLUMNS or column == self.NONFINITE:
                return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            return int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        nonfinite = record.stats is not None and record.stats.has_nonfinite
        if role == Qt.ItemDataRole.BackgroundRole and column == self.NONFINITE and nonfinite:
            return QBrush(NONFINITE_BACKGROUND)
        if role == Qt.ItemDataRole.ForegroundRole:
            if column == self.NONFINITE and nonfinite:
                return QBrush(NONFINITE_FOREGROUND)
            if column == self.NAME:
                return QBrush(DIRECTION_COLOURS[direction])
        if role == Qt.ItemDataRole.FontRole and column == self.NONFINITE and nonfinite:
            return self._bold
        return None

    # ---- cell text

    def _display(self, direction: str, name: str, record: TensorRecord, column: int) -> str:
        stats = record.stats
        if column == self.NAME:
            return f"{direction} · {name}"
        if column == self.SHAPE:
            return record.shape_str(symbolic=False)
        if column == self.DIMS:
            if record.dims and len(record.dims) == len(record.shape):
                return "(" + ", ".join(record.dims) + ")"
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
        lines = [head, record.shape_str(symbolic=True), f"{record.numel:,} elements"]
        if record.stats is None:
            lines.append("no statistics captured (capture level 'shapes')")
        elif column == self.NONFINITE and record.stats.has_nonfinite:
            lines.append(f"{record.stats.nan} NaN and {record.stats.inf} Inf elements")
        return "\n".join(lines)


__all__ = ["ShapeTableModel", "format_number"]
