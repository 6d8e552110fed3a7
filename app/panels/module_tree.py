"""The module tree (left pane): the model's hierarchy with a filter box.

:class:`ModuleTreeModel` mirrors ``Trace.modules`` (plain ``ModuleInfo`` records) as
standard items; :class:`ModuleFilterProxy` keeps the rows whose path or type
contains the filter text, with their ancestors; :class:`ModuleTree` is the widget (a filter
line edit over a tree view) and emits ``moduleActivated(path)`` when the user picks a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (
    QEvent,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLineEdit,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.diagram.plan.layout import shape_label
from app.widgets.common import make_scroll_area_opaque
from tracing.analysis.compute import NOTE, compute_of, format_mult_adds
from tracing.dim_legend import dims_hover, letter_legend

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace

COLUMNS = ("Module", "Type", "Output", "Params", "Mult-adds")
PATH_ROLE = Qt.ItemDataRole.UserRole + 1  # the module's dotted path
_Index = QModelIndex | QPersistentModelIndex


def format_count(n: int) -> str:
    """``124.4M``, ``2.4K``, ``512`` — short parameter counts for a column."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1_000:.1f}K"
    return str(n) if n else ""


#: models with more modules than this build their tree rows level by level, on demand
LAZY_ABOVE = 2000


class ModuleTreeModel(QStandardItemModel):
    """Rows are modules, children in definition order; columns name, type, output, params.

    Built once per trace as standard items, so painting the tree (on every step) never
    calls back into Python. ``PATH_ROLE`` holds each row's dotted module path.

    A model with more than :data:`LAZY_ABOVE` modules (a 1,000-layer stack has 8,000) is
    built lazily: the root and its children first, each deeper level when its parent is
    expanded, a step selects a module inside it (:meth:`index_for_path`) or a filter is
    typed (:meth:`build_all`). An unbuilt row holds one empty placeholder child, so it
    still shows its expand arrow.
    """

    def __init__(self, parent=None):
        super().__init__(parent)
        self._items: dict[str, QStandardItem] = {}
        self._info: dict[str, Any] = {}
        self._paths: list[str] = []
        self._unbuilt: dict[str, QStandardItem] = {}  # rows whose children wait to be built
        self._row_for = None
        self._output: dict[str, str] = {}
        self._compute: dict[str, tuple[int, int]] = {}
        self.setHorizontalHeaderLabels(list(COLUMNS))

    def set_trace(self, trace: Trace | None) -> None:
        self.clear()
        self.setHorizontalHeaderLabels(list(COLUMNS))
        self._items, self._info, self._paths, self._unbuilt = {}, {}, [], {}
        self._output, self._compute = {}, {}
        if trace is not None:
            self._build(trace)

    def _build(self, trace: Trace) -> None:
        modules = trace.modules
        self._info = dict(modules)
        compute = compute_of(trace)  # torchinfo's mult-adds and params, when traced live
        output: dict[str, str] = {}
        first_output: dict[str, int] = {}  # the tensor whose dims the output cell shows
        ran: set[str] = set()
        for step in trace.steps:
            if step.kind == "module" and step.module not in ran:
                ran.add(step.module)
                if step.outputs:
                    output[step.module] = shape_label(trace, step.outputs[0])
                    first_output[step.module] = step.outputs[0]
        legend = letter_legend(trace.meta)
        # brushes, flags and roles looked up once: a 1,000-layer model has 8,000 rows, and
        # each Qt enum access from Python costs more than the item it is set on
        muted, shape_colour = QBrush(QColor(theme.TEXT_DIM)), QBrush(QColor(theme.TEXT_SHAPE))
        type_colour = QBrush(QColor(theme.TEXT_MUTED))
        flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        foreground, tooltip = Qt.ItemDataRole.ForegroundRole, Qt.ItemDataRole.ToolTipRole
        colours = (None, type_colour, shape_colour, type_colour, type_colour)

        def row_for(path: str) -> list[QStandardItem]:
            info = modules[path]
            tip = [f"{path or '<root>'} ({info.type})"]
            if info.extra:
                tip.append(info.extra)
            tip.append(f"{info.params_total:,} parameters")
            macs = compute.get(path, (0, 0))[0]
            if compute:
                tip.append(f"{macs:,} mult-adds ({NOTE})")
            ran_here = path in ran
            if not ran_here:
                tip.append("did not run in this forward pass")
            tip_text = "\n".join(tip)
            texts = (
                info.name if path else "model",
                info.type,
                output.get(path, ""),
                format_count(info.params_total),
                format_mult_adds(macs),
            )
            items = []
            for column, text in enumerate(texts):
                item = QStandardItem(text)
                item.setFlags(flags)
                item.setData(path, PATH_ROLE)
                if column == 2 and path in first_output:  # the output's letters, explained
                    record = trace.tensors[first_output[path]]
                    hover = dims_hover(record.shape, record.dims, legend, record.why)
                    item.setData(f"{path or '<root>'} output\n{hover}", tooltip)
                else:
                    item.setData(tip_text, tooltip)
                colour = colours[column] if ran_here else muted
                if colour is not None:
                    item.setData(colour, foreground)
                items.append(item)
            items[3].setTextAlignment(right)
            items[4].setTextAlignment(right)
            return items

        self._row_for = row_for
        self._output, self._compute = output, compute
        lazy = len(modules) > LAZY_ABOVE
        roots = [
            p for p, info in modules.items() if info.parent is None or info.parent not in modules
        ]
        for root in roots:
            if root not in self._items:
                self._add_row(root, self.invisibleRootItem(), levels=1 if lazy else None)

    def _add_row(self, path: str, parent: QStandardItem, levels: int | None) -> None:
        """The row of ``path`` under ``parent``, its subtree ``levels`` deep (None: all)."""
        stack: list[tuple[str, QStandardItem, int]] = [(path, parent, 0)]
        modules = self._info
        while stack:
            path, parent, depth = stack.pop()
            if path in self._items:
                continue
            row = self._row_for(path)
            parent.appendRow(row)
            self._items[path] = row[0]
            self._paths.append(path)
            kids = [c for c in modules[path].children if c in modules]
            if not kids:
                continue
            if levels is not None and depth >= levels:
                self._unbuilt[path] = row[0]
                row[0].appendRow([QStandardItem("") for _ in COLUMNS])  # keeps the arrow
                continue
            stack.extend((c, row[0], depth + 1) for c in reversed(kids))

    def output_text(self, path: str) -> str:
        """The Output column's text of ``path`` (built or not)."""
        return self._output.get(path, "")

    def mult_adds_text(self, path: str) -> str:
        return format_mult_adds(self._compute.get(path, (0, 0))[0])

    def build_children(self, path: str) -> None:
        """Build the rows under ``path`` if they wait (one level; theirs wait in turn)."""
        item = self._unbuilt.pop(path, None)
        if item is None:
            return
        item.removeRows(0, item.rowCount())
        for child in self._info[path].children:
            if child in self._info:
                self._add_row(child, item, levels=0)

    def build_all(self) -> None:
        """Every row (a filter has to see all of them)."""
        while self._unbuilt:
            self.build_children(next(iter(self._unbuilt)))

    def _build_down_to(self, path: str) -> None:
        chain = []
        info = self._info.get(path)
        while info is not None and info.parent is not None:
            chain.append(info.parent)
            info = self._info.get(info.parent)
        for ancestor in reversed(chain):
            self.build_children(ancestor)

    # ---- lookup

    def index_for_path(self, path: str) -> QModelIndex:
        if path not in self._items and path in self._info:
            self._build_down_to(path)
        item = self._items.get(path)
        return item.index() if item is not None else QModelIndex()

    def path_for_index(self, index: _Index) -> str | None:
        if not index.isValid():
            return None
        return self.data(index, PATH_ROLE)


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
        # Enter goes to the first module the filter matches, Down / Up to the next / previous
        self.filter_edit.returnPressed.connect(lambda: self.activate_match(0))
        self.filter_edit.installEventFilter(self)
        self.view = QTreeView(self)
        self.view.setObjectName("moduleTree")
        self.view.setModel(self.proxy)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(False)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.view.header()
        # sized once per trace (ResizeToContents would measure every row on every step)
        header.setStretchLastSection(False)  # each column as wide as its text: none clipped
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.view.setColumnHidden(3, True)  # parameter counts live in the tooltip
        self.view.selectionModel().currentChanged.connect(self._on_current_changed)
        self.view.expanded.connect(self._on_expanded)
        make_scroll_area_opaque(self.view, QColor(theme.BASE))
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
        self._fit_columns()

    def _fit_columns(self) -> None:
        """Width of the name and type columns from the text they hold (once per trace)."""
        fm = self.view.fontMetrics()
        depth = max((p.count(".") + 2 for p in self.model._paths), default=1)
        names = [self.model._info[p].name for p in self.model._paths] or ["Module"]
        types = [self.model._info[p].type for p in self.model._paths] or ["Type"]
        indent = self.view.indentation()
        name_w = max(fm.horizontalAdvance(n) for n in names) + indent * min(depth, 4) + 28
        type_w = max(fm.horizontalAdvance(t) for t in types) + 16
        # capped so that the Output column (the dims) starts inside the default pane
        self.view.setColumnWidth(0, min(name_w, 175))
        self.view.setColumnWidth(1, min(type_w, 140))
        # the Output column holds a shape like (B=1, T=18, C=64): as wide as its widest
        outputs = [self.model.output_text(p) for p in self.model._paths] + ["Output"]
        self.view.setColumnWidth(2, max(fm.horizontalAdvance(t) for t in outputs) + 16)
        header = self.view.header()
        if header.count() > 2 and header.visualIndex(2) != 1:  # Output beside the name: a
            header.moveSection(header.visualIndex(2), 1)  # narrow pane clips Type, not shapes
        macs = [self.model.mult_adds_text(p) for p in self.model._paths]
        self.view.setColumnHidden(4, not any(macs))
        self.view.setColumnWidth(4, max(fm.horizontalAdvance(t) for t in [*macs, "Mult-adds"]) + 16)

    def set_filter(self, text: str) -> None:
        if self.filter_edit.text() != text:
            self.filter_edit.setText(text)  # comes back here through textChanged
            return
        if text.strip():
            self.model.build_all()
        self.proxy.set_text(text)
        if text.strip():
            self.view.expandAll()

    def visible_paths(self) -> list[str]:
        """Paths of the rows the filter keeps, depth first (for tests and the status bar)."""
        out: list[str] = []

        def walk(parent: QModelIndex) -> None:
            for row in range(self.proxy.rowCount(parent)):
                index = self.proxy.index(row, 0, parent)
                path = self.proxy.data(index, PATH_ROLE)
                if path is not None:  # not a placeholder of rows still to be built
                    out.append(path)
                walk(index)

        walk(QModelIndex())
        return out

    def matching_paths(self) -> list[str]:
        """The rows the filter text itself matches (not the ancestors kept around them)."""
        needle = self.proxy._needle
        if not needle:
            return []
        info = self.model._info
        return [
            p
            for p in self.visible_paths()
            if needle in p.lower() or (p in info and needle in info[p].type.lower())
        ]

    def activate_match(self, delta: int) -> None:
        """Go to a module the filter matches: the first (``delta`` 0), or the one after
        (+1) or before (-1) the selected row; the window jumps to its first call."""
        matches = self.matching_paths()
        if not matches:
            return
        current = self.selected_path()
        if delta == 0 or current not in matches:
            path = matches[0] if delta >= 0 else matches[-1]
        else:
            path = matches[(matches.index(current) + delta) % len(matches)]
        self.select_module(path)
        self.moduleActivated.emit(path)

    def eventFilter(self, watched, event) -> bool:  # Qt's name, or Qt never calls it
        if watched is self.filter_edit and event.type() == QEvent.Type.KeyPress:
            if event.key() == Qt.Key.Key_Down:
                self.activate_match(+1)
                return True
            if event.key() == Qt.Key.Key_Up:
                self.activate_match(-1)
                return True
        return super().eventFilter(watched, event)

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
            self.view.setAutoScroll(False)  # it would scroll by one row on every step
            self.view.setCurrentIndex(index)
            self.view.setAutoScroll(True)
            self._reveal(index)
        finally:
            self._syncing = False

    def _reveal(self, index: QModelIndex) -> None:
        """Scroll ``index`` into view, to the middle, and only when it is out of view.

        A tree that scrolled by one row on every step would repaint all of itself on
        every step; centred, the next dozens of modules are already on screen.
        """
        rect = self.view.visualRect(index)
        if not self.view.viewport().rect().contains(rect):
            across = self.view.horizontalScrollBar()
            left = across.value()  # scrollTo would also scroll sideways, hiding the names
            self.view.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtCenter)
            across.setValue(left)

    def _on_expanded(self, index: QModelIndex) -> None:
        path = self.proxy.data(index, PATH_ROLE)
        if path is not None:
            self.model.build_children(path)

    def _on_current_changed(self, current: QModelIndex, previous: QModelIndex) -> None:
        if self._syncing or not current.isValid():
            return
        path = self.proxy.data(current, PATH_ROLE)
        if path is not None:
            self.moduleActivated.emit(path)
