"""The module tree (left pane): the model's hierarchy with a filter box.

:class:`ModuleTreeModel` is a thin ``QAbstractItemModel`` over ``Trace.modules`` (plain
``ModuleInfo`` records); :class:`ModuleFilterProxy` keeps the rows whose path or type
contains the filter text, with their ancestors; :class:`ModuleTree` is the widget (a filter
line edit over a tree view) and emits ``moduleActivated(path)`` when the user picks a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLineEdit,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace

COLUMNS = ("Module", "Type", "Output", "Params")
PATH_ROLE = Qt.ItemDataRole.UserRole + 1  # the module's dotted path
_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()  # the invisible root, as a default argument


def format_count(n: int) -> str:
    """``124.4M``, ``2.4K``, ``512`` — short parameter counts for a column."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1_000:.1f}K"
    return str(n) if n else ""


class ModuleTreeModel(QAbstractItemModel):
    """Rows are modules; children in definition order. Internal ids index ``self._paths``."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._paths: list[str] = []
        self._ids: dict[str, int] = {}
        self._children: dict[str, list[str]] = {}
        self._row: dict[str, int] = {}
        self._info: dict[str, Any] = {}
        self._output: dict[str, str] = {}
        self._ran: set[str] = set()

    def set_trace(self, trace: Trace | None) -> None:
        self.beginResetModel()
        self._paths, self._ids, self._children, self._row = [], {}, {}, {}
        self._info, self._output, self._ran = {}, {}, set()
        if trace is not None:
            self._build(trace)
        self.endResetModel()

    def _build(self, trace: Trace) -> None:
        from app.diagram import shape_label

        modules = trace.modules
        self._info = dict(modules)
        for path, info in modules.items():
            kids = [c for c in info.children if c in modules]
            self._children[path] = kids
            for row, child in enumerate(kids):
                self._row[child] = row
        roots = [
            p for p, info in modules.items() if info.parent is None or info.parent not in modules
        ]
        self._children[None] = roots  # type: ignore[index]
        for row, path in enumerate(roots):
            self._row[path] = row
        # only modules reachable from the roots are rows
        stack = list(reversed(roots))
        while stack:
            path = stack.pop()
            if path in self._ids:
                continue
            self._ids[path] = len(self._paths)
            self._paths.append(path)
            stack.extend(reversed(self._children.get(path, [])))
        for step in trace.steps:
            if step.kind == "module" and step.module not in self._output:
                self._ran.add(step.module)
                if step.outputs:
                    self._output[step.module] = shape_label(trace, step.outputs[0])

    # ---- lookup

    def index_for_path(self, path: str) -> QModelIndex:
        if path not in self._ids:
            return QModelIndex()
        return self.createIndex(self._row[path], 0, self._ids[path])

    def path_for_index(self, index: _Index) -> str | None:
        if not index.isValid():
            return None
        return self._paths[index.internalId()]

    # ---- QAbstractItemModel (Qt's camelCase names)

    def index(self, row: int, column: int, parent: _Index = _ROOT) -> QModelIndex:
        if column < 0 or column >= len(COLUMNS) or row < 0:
            return QModelIndex()
        parent_path = self.path_for_index(parent) if parent.isValid() else None
        kids = self._children.get(parent_path, []) if self._paths else []  # type: ignore[arg-type]
        if row >= len(kids):
            return QModelIndex()
        return self.createIndex(row, column, self._ids[kids[row]])

    def parent(self, index: _Index = _ROOT) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        info = self._info[self._paths[index.internalId()]]
        if info.parent is None or info.parent not in self._ids:
            return QModelIndex()
        return self.createIndex(self._row[info.parent], 0, self._ids[info.parent])

    def rowCount(self, parent: _Index = _ROOT) -> int:
        if not self._paths:
            return 0
        if parent.isValid():
            if parent.column() != 0:
                return 0
            return len(self._children.get(self._paths[parent.internalId()], []))
        return len(self._children.get(None, []))  # type: ignore[arg-type]

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return len(COLUMNS)

    def headerData(self, section: int, orientation, role: int = Qt.ItemDataRole.DisplayRole):
        if (
            orientation == Qt.Orientation.Horizontal
            and role == Qt.ItemDataRole.DisplayRole
            and 0 <= section < len(COLUMNS)
        ):
            return COLUMNS[section]
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        path = self._paths[index.internalId()]
        info = self._info[path]
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if column == 0:
                return info.name if path else "model"
            if column == 1:
                return info.type
            if column == 2:
                return self._output.get(path, "")
            if column == 3:
                return format_count(info.params_total)
            return None
        if role == PATH_ROLE:
            return path
        if role == Qt.ItemDataRole.ToolTipRole:
            lines = [f"{path or '<root>'} ({info.type})"]
            if info.extra:
                lines.append(info.extra)
            lines.append(f"{info.params_total:,} parameters")
            if path not in self._ran:
                lines.append("did not run in this forward pass")
            return "\n".join(lines)
        if role == Qt.ItemDataRole.ForegroundRole:
            if path not in self._ran:
                return QColor("#6b7385")
            if column == 2:
                return QColor("#8fd3ff")
            if column in (1, 3):
                return QColor("#9aa3b2")
            return None
        if role == Qt.ItemDataRole.TextAlignmentRole and column == 3:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable


class ModuleFilterProxy(QSortFilterProxyModel):
    """Keeps modules whose path or type contains the text (case-insensitive), and ancestors."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setRecursiveFilteringEnabled(True)
        self._needle = ""

    def set_text(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):  # Qt >= 6.10
            self.beginFilterChange()
            self._needle = text.strip().lower()
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:  # pragma: no cover - older Qt
            self._needle = text.strip().lower()
            self.invalidateFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: _Index) -> bool:
        if not self._needle:
            return True
        model = self.sourceModel()
        index = model.index(source_row, 0, source_parent)
        path = model.data(index, PATH_ROLE) or ""
        type_name = model.data(model.index(source_row, 1, source_parent)) or ""
        return self._needle in path.lower() or self._needle in type_name.lower()


class ModuleTree(QWidget):
    """Filter box + tree. ``select_module(path)`` follows the step without echoing back."""

    moduleActivated = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model = ModuleTreeModel(self)
        self.proxy = ModuleFilterProxy(self)
        self.proxy.setSourceModel(self.model)
        self.filter_edit = QLineEdit(self)
        self.filter_edit.setPlaceholderText("Filter modules (name or type)…")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self.set_filter)
        self.view = QTreeView(self)
        self.view.setObjectName("moduleTree")
        self.view.setModel(self.proxy)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(False)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.view.header()
        header.setStretchLastSection(True)
        for col in (0, 1):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.view.setColumnHidden(3, True)  # parameter counts live in the tooltip
        self.view.selectionModel().currentChanged.connect(self._on_current_changed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.filter_edit)
        layout.addWidget(self.view)
        self._syncing = False

    def set_trace(self, trace: Trace | None) -> None:
        self.model.set_trace(trace)
        root = self.proxy.index(0, 0)
        if root.isValid():
            self.view.expand(root)

    def set_filter(self, text: str) -> None:
        if self.filter_edit.text() != text:
            self.filter_edit.setText(text)  # comes back here through textChanged
            return
        self.proxy.set_text(text)
        if text.strip():
            self.view.expandAll()

    def visible_paths(self) -> list[str]:
        """Paths of the rows the filter keeps, depth first (for tests and the status bar)."""
        out: list[str] = []

        def walk(parent: QModelIndex) -> None:
            for row in range(self.proxy.rowCount(parent)):
                index = self.proxy.index(row, 0, parent)
                out.append(self.proxy.data(index, PATH_ROLE))
                walk(index)

        walk(QModelIndex())
        return out

    def selected_path(self) -> str | None:
        index = self.view.currentIndex()
        return self.proxy.data(index, PATH_ROLE) if index.isValid() else None

    def select_module(self, path: str) -> None:
        """Make ``path`` the current row (expanding its ancestors) without emitting."""
        source = self.model.index_for_path(path)
        index = self.proxy.mapFromSource(source)
        if index == self.view.currentIndex():
            return
        self._syncing = True
        try:
            if not index.isValid():
                self.view.selectionModel().clearSelection()
                self.view.setCurrentIndex(QModelIndex())
                return
            parent = index.parent()
            while parent.isValid():
                if not self.view.isExpanded(parent):
                    self.view.expand(parent)
                parent = parent.parent()
            self.view.setCurrentIndex(index)
            self.view.scrollTo(index)
        finally:
            self._syncing = False

    def _on_current_changed(self, current: QModelIndex, previous: QModelIndex) -> None:
        if self._syncing or not current.isValid():
            return
        path = self.proxy.data(current, PATH_ROLE)
        if path is not None:
            self.moduleActivated.emit(path)
