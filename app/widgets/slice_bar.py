"""A slice bar: one spin box per leading axis of a tensor, to pick the matrix a heatmap shows
(the compare window's A − B). An axis keeps its index, by name, when the axes change."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSpinBox, QWidget

from app.widgets.common import hint_label


class SliceBar(QWidget):
    """One spin box per leading axis of the difference tensor (``B [0]  H [2]``)."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self._widgets: list[QWidget] = []
        self.spins: list[QSpinBox] = []
        self.description = hint_label()
        self._layout.addStretch(1)
        self._layout.addWidget(self.description)
        self._chosen: dict[str, int] = {}

    def set_axes(self, axes: list[tuple[str, int]]) -> None:
        for w in self._widgets:  # hidden and detached now, deleted later
            w.hide()
            self._layout.removeWidget(w)
            w.deleteLater()
        self._widgets, self.spins = [], []
        for i, (name, size) in enumerate(axes):
            label = QLabel(name)
            spin = QSpinBox()
            spin.setRange(0, max(0, size - 1))
            spin.setValue(min(self._chosen.get(name, 0), max(0, size - 1)))
            spin.setEnabled(size > 1)
            spin.setMinimumWidth(52)
            spin.setToolTip(f"index along axis {name} (size {size})")
            spin.valueChanged.connect(lambda v, n=name: self._on_changed(n, v))
            self._layout.insertWidget(2 * i, label)
            self._layout.insertWidget(2 * i + 1, spin)
            self._widgets += [label, spin]
            self.spins.append(spin)

    def index(self) -> tuple[int, ...]:
        return tuple(s.value() for s in self.spins)

    def _on_changed(self, name: str, value: int) -> None:
        self._chosen[name] = value
        self.changed.emit()
