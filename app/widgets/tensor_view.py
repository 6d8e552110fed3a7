"""How to look at a tensor of any rank on a flat screen, and the widget that does it.

A heatmap shows a matrix, so a tensor is cut down to one:

- the **last two axes** are the matrix: rows run down, columns across. ``(B, H, T, T)``
  attention shows ``T x T``; ``(B, T, C)`` activations show ``T x C``;
- every **leading axis** (batch ``B``, heads ``H`` ...) is held at one index the user picks
  with a spin box named after the axis. The choice is remembered by axis name, so head 3
  stays head 3 while stepping from one ``(B, H, T, D)`` tensor to the next, except that a
  tensor holding NaN or ±Inf only in other slices opens on the first slice that holds them;
- a **1-D** tensor is one row; a **scalar** is shown as text.

Axes that run over time (``T``) get the prompt's tokens as tick labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from app.widgets.common import LayoutFirewall
from app.widgets.heatmap import HeatmapView
from tracing.record import TensorRecord, Trace
from tracing.token_names import byte_label, prompt_labels

MAX_LEADING_AXES = 6
"""Spin boxes built up front; a tensor of rank > 8 is rare and gets more on demand."""


# --------------------------------------------------------------------------- tokens


def token_label(token: int) -> str:
    """A short printable label for one byte token: ``'a'``, ``'␣'``, ``'\\n'``, ``'0xc3'``.

    Ids outside the byte range (a model with a bigger vocabulary) show as ``#50256``; a
    trace with its own tokenizer names them with :func:`tracing.token_names.token_namer`.
    """
    return byte_label(token)


def token_labels(trace: Trace) -> list[str] | None:
    """Labels for the traced prompt's tokens: the tokenizer's strings where the trace
    carries them (``meta["token_labels"]``), else bytes; None without tokens."""
    return prompt_labels(trace.meta)


# --------------------------------------------------------------------------- slicing


@dataclass(frozen=True)
class MatrixSlice:
    """Which 2-D cut of a tensor is on show, in words a person can read."""

    leading: tuple[tuple[str, int, int], ...]  # (axis name, chosen index, size) per axis
    row_name: str  # e.g. "T"
    col_name: str  # e.g. "C"

    def describe(self) -> str:
        """``[B=0, H=3] → T × C`` (or ``T × C`` with no leading axes)."""
        cut = ", ".join(f"{name}={i}" for name, i, _ in self.leading)
        return (f"[{cut}] → " if cut else "") + f"{self.row_name} × {self.col_name}"


def axis_names(record: TensorRecord) -> list[str]:
    """Symbolic names for each axis (``B``, ``T``...), ``dim0``... where unknown."""
    dims = record.dims if record.dims and len(record.dims) == len(record.shape) else None
    names = []
    for i in range(len(record.shape)):
        name = dims[i] if dims and dims[i] != "?" else f"dim{i}"
        names.append(name)
    return names


def leading_axes(record: TensorRecord) -> list[tuple[str, int]]:
    """(name, size) of the axes held fixed when showing ``record`` as a matrix."""
    names = axis_names(record)
    return [(names[i], record.shape[i]) for i in range(max(0, len(record.shape) - 2))]


def as_matrix(value: torch.Tensor, leading_index: Sequence[int]) -> torch.Tensor:
    """Cut ``value`` to 2-D: fix each leading axis at ``leading_index``; 1-D becomes one row.

    >>> as_matrix(torch.zeros(2, 3, 4, 5), (1, 2)).shape
    torch.Size([4, 5])
    """
    if value.dim() == 0:
        raise ValueError("a scalar has no matrix view")
    if value.dim() == 1:
        return value.unsqueeze(0)  # (N,) -> (1, N)
    n_leading = value.dim() - 2
    if len(leading_index) != n_leading:
        raise ValueError(
            f"a {value.dim()}-D tensor needs {n_leading} leading indices, got {len(leading_index)}"
        )
    for axis, (i, size) in enumerate(zip(leading_index, value.shape)):
        if not 0 <= i < size:
            raise IndexError(f"index {i} is out of range for axis {axis} of size {size}")
    return value[tuple(leading_index)] if n_leading else value


def nonfinite_slice(
    record: TensorRecord, value: torch.Tensor, index: Sequence[int]
) -> tuple[int, ...] | None:
    """The leading index of the first slice that holds a NaN or ±Inf, when the slice at
    ``index`` holds none but another does (a step that went non-finite in batch element 1
    opens on B=1, not on an all-finite B=0); None otherwise."""
    if record.stats is not None and not record.stats.has_nonfinite:
        return None  # the recorded counts say all finite: no pass over the values
    return first_nonfinite_slice(value, index)


def first_nonfinite_slice(value: torch.Tensor, index: Sequence[int]) -> tuple[int, ...] | None:
    """:func:`nonfinite_slice` for any tensor (``index``: one per leading axis)."""
    n_leading = value.dim() - 2
    if n_leading <= 0 or not value.is_floating_point() or len(index) != n_leading:
        return None
    bad = (~torch.isfinite(value)).flatten(n_leading).any(-1)  # one flag per slice
    if not bad.any() or bad[tuple(index)]:
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


# --------------------------------------------------------------------------- widget


class TensorView(QWidget):
    """A tensor as a heatmap, with one spin box per leading axis to choose the slice.

    ``show_tensor`` takes the record and its value (None when values were not captured,
    which the view explains instead of showing an empty box).
    """

    sliceChanged = Signal()
    """The user picked another leading index (the heatmap is already updated)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._record: TensorRecord | None = None
        self._value: torch.Tensor | None = None
        self._row_labels: Sequence[str] | None = None
        self._scale = "auto"
        self._chosen: dict[str, int] = {}  # axis name -> index, remembered across steps
        self._slice: MatrixSlice | None = None

        # ---- slice bar: "slice  B [0]  H [3]   → T × C"
        self._bar = QWidget()
        bar = QHBoxLayout(self._bar)
        bar.setContentsMargins(4, 0, 4, 0)
        bar.setSpacing(6)
        self._bar_title = QLabel("slice")
        self._bar_title.setForegroundRole(self._bar_title.foregroundRole())
        bar.addWidget(self._bar_title)
        self._spin_labels: list[QLabel] = []
        self._spins: list[QSpinBox] = []
        self._bar_layout = bar
        for _ in range(MAX_LEADING_AXES):
            self._add_spin()
        self._slice_label = QLabel()
        self._slice_label.setObjectName("sliceDescription")
        self._slice_label.setAutoFillBackground(True)
        bar.addStretch(1)
        bar.addWidget(self._slice_label)

        self.heatmap = HeatmapView(scale_key="tensor")

        # The bar changes with every tensor (spin boxes come and go, the description
        # changes); behind a firewall at a fixed height, that never re-lays out the heatmap.
        self._bar_box = LayoutFirewall(self._bar, self._spins[0].sizeHint().height() + 2)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self._bar_box)
        layout.addWidget(self.heatmap, 1)

    def _add_spin(self) -> None:
        label = QLabel()
        spin = QSpinBox()
        spin.setKeyboardTracking(False)
        spin.setAccelerated(True)
        spin.setMinimumWidth(56)
        spin.valueChanged.connect(self._on_spin_changed)
        position = 1 + 2 * len(self._spins)
        self._bar_layout.insertWidget(position, label)
        self._bar_layout.insertWidget(position + 1, spin)
        label.hide()
        spin.hide()
        self._spin_labels.append(label)
        self._spins.append(spin)

    # ---- state, for callers and tests

    @property
    def record(self) -> TensorRecord | None:
        return self._record

    @property
    def current_slice(self) -> MatrixSlice | None:
        return self._slice

    def leading_index(self) -> tuple[int, ...]:
        """The chosen index of each leading axis of the tensor on show."""
        if self._record is None:
            return ()
        return tuple(self._spins[i].value() for i in range(len(leading_axes(self._record))))

    def set_leading_index(self, index: Sequence[int]) -> None:
        """Choose the slice programmatically (as if the user turned the spin boxes)."""
        for spin, i in zip(self._spins, index):
            spin.blockSignals(True)
            spin.setValue(i)
            spin.blockSignals(False)
        self._remember()
        self._render()
        self.sliceChanged.emit()  # what shows the slice (the stats strip) follows

    # ---- showing

    def show_tensor(
        self,
        record: TensorRecord,
        value: torch.Tensor | None,
        *,
        token_labels: Sequence[str] | None = None,
        missing_reason: str = "",
    ) -> None:
        """Show ``record``; ``value`` None means no copy was kept (``missing_reason`` says why)."""
        if (
            value is not None
            and value is self._value
            and record == self._record
            and token_labels is self._row_labels
            and self._slice is not None
            and self.heatmap.matrix is not None
        ):
            # The same tensor again (a module's output is its last op's output, so about
            # a step in four shows what the step before showed): nothing to redraw.
            return
        self._record, self._value = record, value
        self._row_labels = token_labels
        self._scale = "probability" if record.role == "attention" else "auto"

        leading = leading_axes(record) if value is not None else []
        while len(self._spins) < len(leading):
            self._add_spin()
        # Only what differs is touched: each spin box or label change asks for a relayout.
        for i, (label, spin) in enumerate(zip(self._spin_labels, self._spins)):
            if i < len(leading):
                name, size = leading[i]
                top = max(0, size - 1)
                index = min(self._chosen.get(name, 0), top)
                spin.blockSignals(True)
                if spin.maximum() != top:
                    spin.setRange(0, top)
                if spin.value() != index:
                    spin.setValue(index)
                spin.blockSignals(False)
                if spin.isEnabled() != (size > 1):
                    spin.setEnabled(size > 1)
                tip = f"index along axis {name} (size {size})"
                if spin.toolTip() != tip:
                    spin.setToolTip(tip)
                if label.text() != name:
                    label.setText(name)
                if spin.isHidden():
                    label.setVisible(True)
                    spin.setVisible(True)
            elif not spin.isHidden():
                label.setVisible(False)
                spin.setVisible(False)

        jump = nonfinite_slice(record, value, self.leading_index()) if leading else None
        if jump is not None:  # open on the slice that holds the NaN/Inf, and keep it
            for spin, i in zip(self._spins, jump):
                spin.blockSignals(True)
                spin.setValue(i)
                spin.blockSignals(False)
            self._remember()

        if value is None or value.dim() == 0:
            self._slice = None
            self._set_slice_text("")
            if value is None:
                text = missing_reason or "No values were kept for this tensor."
            else:
                text = (
                    f"<p style='font-size:15pt'>{float(value):.6g}</p>"
                    f"<p>a scalar ({record.dtype})</p>"
                )
            self.heatmap.show_message(text)
            return
        self._render()

    def show_message(self, text: str) -> None:
        """No tensor to show (e.g. a step without tensors): say why."""
        self._record = self._value = None
        self._slice = None
        for label, spin in zip(self._spin_labels, self._spins):
            if not spin.isHidden():
                label.setVisible(False)
                spin.setVisible(False)
        self._set_slice_text("")
        self.heatmap.show_message(text)

    def _set_slice_text(self, text: str) -> None:
        if self._slice_label.text() != text:
            self._slice_label.setText(text)

    def _on_spin_changed(self, _value: int) -> None:
        self._remember()
        self._render()
        self.sliceChanged.emit()

    def _remember(self) -> None:
        if self._record is None:
            return
        for (name, _size), i in zip(leading_axes(self._record), self.leading_index()):
            self._chosen[name] = i

    def _render(self) -> None:
        record, value = self._record, self._value
        if record is None or value is None or value.dim() == 0:
            return
        index = self.leading_index()
        names = axis_names(record)
        if value.dim() == 1:
            row_name, col_name = "", names[0]
        else:
            row_name, col_name = names[-2], names[-1]
        leading = tuple((name, i, size) for (name, size), i in zip(leading_axes(record), index))
        self._slice = MatrixSlice(leading, row_name or "row", col_name)
        self._set_slice_text(self._slice.describe())

        matrix = as_matrix(value, index)
        rows, cols = matrix.shape
        tokens = self._row_labels
        row_labels = tokens if tokens and row_name == "T" and len(tokens) == rows else None
        col_labels = tokens if tokens and col_name == "T" and len(tokens) == cols else None
        self.heatmap.set_matrix(
            matrix,
            row_labels=row_labels,
            col_labels=col_labels,
            row_name=row_name or " ",
            col_name=col_name,
            scale=self._scale,  # type: ignore[arg-type]
        )


__all__ = [
    "MatrixSlice",
    "TensorView",
    "as_matrix",
    "axis_names",
    "first_nonfinite_slice",
    "leading_axes",
    "nonfinite_slice",
    "token_label",
    "token_labels",
]
