"""Find (Ctrl+F) and go to step (Ctrl+G): a dock with the find field above its results.

The field lives in the dock itself, not in the toolbar: a toolbar hides what does not fit
(behind an overflow arrow, or not at all), so at a small window the field would be out of
sight and the keys typed after Ctrl+F would reach the window's one-key shortcuts instead.
Ctrl+F and Ctrl+G show and raise the dock and put the cursor in the field, at any size.

Type in the field and the dock lists what the trace holds that matches, grouped by kind with
counts (modules, ops, steps, source lines, tensor names, shapes and dims, non-finite steps:
:mod:`tracing.analysis.find`, one index per trace, built on the first query). Enter jumps to
the first match at or after the current step (again: the next one), F3 / Shift+F3 to the
next and previous match; Enter (or a double-click) on a result row jumps to that row's next
step. ``#4120`` (what Ctrl+G starts) is step 4120, counted from 1 as the step bar counts
(:mod:`tracing.formatting`). For ``nan`` and ``inf`` the non-finite steps come first and
Enter goes to where it went non-finite. Every jump goes through
:meth:`MainWindow.jump_to`, so the diagram opens down to the step and the step bar follows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QLineEdit,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from tracing.analysis.find import KIND_TITLES, Entry, FindIndex, FindResult
from tracing.formatting import step_number

ROWS_PER_KIND = 200
"""Result rows listed per kind; the rest are counted in a last row (F3 still visits them)."""
ENTRY_ROLE = Qt.ItemDataRole.UserRole + 1


def steps_text(steps: tuple[int, ...], most: int = 4) -> str:
    """``#34, #79`` or ``#3, #9, #15, #21 … +40``: 1-based, as the step bar counts."""
    if not steps:
        return "did not run"
    text = ", ".join(f"#{step_number(s)}" for s in steps[:most])
    return text + (f" … +{len(steps) - most}" if len(steps) > most else "")


class FindController(QObject):
    """The find field, its results dock and the Ctrl+F, Ctrl+G, F3 and Shift+F3 actions."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self._index: FindIndex | None = None
        self._indexed = None  # the trace the index was built for
        self.result: FindResult | None = None
        self._jumped = False  # Enter once went to this query's first match: next Enter moves on

        self.field = QLineEdit()
        self.field.setObjectName("findField")
        self.field.setPlaceholderText("Find: module, op, #step, file.py:78, (B, H, T, T), nan")
        self.field.setClearButtonEnabled(True)
        self.field.setToolTip(
            "Find (Ctrl+F) anything in the trace; Enter jumps, F3 / Shift+F3 next / previous. "
            "Go to step (Ctrl+G): #4120"
        )
        self.field.textChanged.connect(self._on_text)
        self.field.returnPressed.connect(self.enter)

        self.tree = QTreeWidget()
        self.tree.setObjectName("findResults")
        self.tree.setHeaderLabels(["Match", "Steps"])
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.itemActivated.connect(self._on_item)
        self.summary = QLabel("Type in the field above.")
        self.summary.setObjectName("findSummary")
        panel = QWidget()
        layout = QVBoxLayout(panel)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.field)
        layout.addWidget(self.summary)
        layout.addWidget(self.tree, 1)
        self.dock = QDockWidget("Find", window)
        self.dock.setObjectName("findDock")
        self.dock.setWidget(panel)

        self.find_action = self._action("&Find…", ["Ctrl+F"], self.focus_find)
        self.go_to_step_action = self._action("&Go to step…", ["Ctrl+G"], self.focus_go_to_step)
        self.next_action = self._action("Find &next", ["F3"], self.next)
        self.prev_action = self._action("Find &previous", ["Shift+F3"], self.previous)
        window.traceChanged.connect(self._on_trace_changed)

    def _action(self, text: str, keys: list[str], slot) -> QAction:
        action = QAction(text, self.window)
        action.setShortcuts([QKeySequence(k) for k in keys])
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        action.triggered.connect(lambda _checked=False: slot())
        return action

    # ---- the index and the query

    def index(self) -> FindIndex | None:
        trace = self.window.trace
        if trace is None:
            return None
        if self._indexed is not trace:
            self._index, self._indexed = FindIndex(trace), trace
        return self._index

    def _on_trace_changed(self) -> None:
        self._index, self._indexed = None, None
        self._on_text(self.field.text())

    def _on_text(self, text: str) -> None:
        self._jumped = False
        index = self.index()
        self.result = index.search(text) if index is not None and text.strip() else None
        self._fill()
        if text.strip() and not self.dock.isVisible():
            self.dock.show()

    def _fill(self) -> None:
        self.tree.clear()
        result = self.result
        if result is None:
            self.summary.setText(
                "No trace." if self.window.trace is None else "Type in the field above."
            )
            return
        if not result:
            self.summary.setText(f"No match for {result.query!r}.")
            return
        counts = [f"{result.count(k)} {KIND_TITLES[k].lower()}" for k in result.kinds]
        self.summary.setText(f"{len(result.steps):,} matching steps · " + " · ".join(counts))
        for kind in result.kinds:  # best first: the non-finite steps for "nan"
            entries = result.groups[kind]
            top = QTreeWidgetItem([f"{KIND_TITLES[kind]} ({len(entries)})", ""])
            top.setFlags(Qt.ItemFlag.ItemIsEnabled)
            self.tree.addTopLevelItem(top)
            for entry in entries[:ROWS_PER_KIND]:
                n = len(entry.steps)
                item = QTreeWidgetItem([entry.label, f"{n} × {steps_text(entry.steps)}"])
                item.setData(0, ENTRY_ROLE, entry)
                item.setToolTip(0, entry.label)
                top.addChild(item)
            if len(entries) > ROWS_PER_KIND:
                more = QTreeWidgetItem([f"… {len(entries) - ROWS_PER_KIND} more", ""])
                more.setFlags(Qt.ItemFlag.NoItemFlags)
                top.addChild(more)
            top.setExpanded(True)
        self.tree.resizeColumnToContents(0)

    # ---- keys

    def _show_field(self) -> None:
        """Show the dock (raised above docks tabbed with it) and put the cursor in the field."""
        if not self.dock.isVisible() and not self.dock.isFloating():  # leave the view room
            height = min(260, self.window.height() // 3)
            self.window.resizeDocks([self.dock], [height], Qt.Orientation.Vertical)
        self.dock.show()
        self.dock.raise_()
        self.field.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def focus_find(self) -> None:
        self._show_field()
        self.field.selectAll()

    def focus_go_to_step(self) -> None:
        """Ctrl+G: the field with ``#`` in it; type the step number and press Enter."""
        self._show_field()
        self.field.setText("#")
        self.field.setCursorPosition(1)

    def enter(self) -> None:
        """Enter in the field: the first match at or after the current step, then the next."""
        result = self.result
        if result is None:
            return
        if not result.steps:
            self.window.statusBar().showMessage(f"No match for {result.query!r}.", 4000)
            return
        if self._jumped:
            self.next()
            return
        self._jumped = True
        self._jump(result.first_from(self.window.current))

    def next(self) -> None:
        self._step(forward=True)

    def previous(self) -> None:
        self._step(forward=False)

    def _step(self, forward: bool) -> None:
        result = self.result
        if result is None or not result.steps:
            self.window.statusBar().showMessage("Nothing to find: type in the find field.", 4000)
            return
        current = self.window.current
        target = result.next_after(current) if forward else result.previous_before(current)
        self._jumped = True
        self._jump(target)

    def _jump(self, target: int | None) -> None:
        if target is None:
            return
        self.window.jump_to(target)
        result = self.result
        if result is not None and result.steps:
            n = bisect_left(result.steps, target) + 1
            self.window.statusBar().showMessage(
                f"match {n} of {len(result.steps):,} for {result.query!r}", 6000
            )

    def _on_item(self, item: QTreeWidgetItem, _column: int = 0) -> None:
        entry: Entry | None = item.data(0, ENTRY_ROLE)
        if entry is None:
            return
        if not entry.steps:
            self.window.statusBar().showMessage(f"{entry.label} did not run in this trace.", 4000)
            return
        i = bisect_right(entry.steps, self.window.current)
        self.window.jump_to(entry.steps[i] if i < len(entry.steps) else entry.steps[0])


def attach(window) -> FindController:
    """Put the find dock (its field on top) at the bottom, hidden until Ctrl+F, and the
    actions in the Debug menu."""
    controller = FindController(window)
    window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, controller.dock)
    controller.dock.hide()
    window.add_menu_action("Debug", controller.find_action, separator=True)
    for action in (controller.next_action, controller.prev_action, controller.go_to_step_action):
        window.add_menu_action("Debug", action)
    return controller
