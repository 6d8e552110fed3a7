"""The breakpoints panel: conditions to stop at, and "run to next breakpoint" over a trace.

::

    ┌ Breakpoints ─────────────────────────────────────────┐
    │ [+ Module]  [+ Condition ▾]              [✕] [Clear] │
    │ ☑ ◆ module blocks.1.self_attn                 1 hit  │   a tick enables / disables,
    │ ☑ ⚠ NaN or Inf appears                        2 hits │   the count is over the open
    │ ☐ ↑ |x| > 100                                 0 hits │   trace
    ├──────────────────────────────────────────────────────┤
    │ [▶ Run to next breakpoint  F5]                       │
    │ ● step 57 · blocks.1.feed_forward.linear1 · linear   │
    │   3 Inf values in output                             │
    └──────────────────────────────────────────────────────┘

The panel holds no stepping logic of its own: it asks :func:`tracing.breakpoints.find_hit`
for the next hit after the current step and emits :attr:`BreakpointsPanel.stepRequested`
with the step to jump to; the main window moves there. Module breakpoints come from the
current step (a click on a diagram box or a tree row moves the current step), condition
breakpoints from a menu: NaN/Inf, ``|x| >`` a threshold, attention entropy below a
threshold, an op name.

The causal mask is not a numerical problem: ``tracing.breakpoints.NonFinite`` and
``AbsAbove`` ignore the ``-inf`` a mask op writes (a NaN still counts), here, in the step
bar's "Next NaN/Inf" and in a live ``break_on`` alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PySide6.QtCore import (
    QAbstractListModel,
    QModelIndex,
    QPersistentModelIndex,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import QAction, QColor, QFont, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDockWidget,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListView,
    QMenu,
    QPushButton,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.widgets.common import hint_label
from tracing.breakpoints import (
    AbsAbove,
    AttentionEntropyBelow,
    BreakHit,
    Condition,
    GradNormAbove,
    GradNormBelow,
    ModuleIs,
    NonFinite,
    OpIs,
    find_all,
    find_hit,
)
from tracing.formatting import step_text

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace

MAX_STEPS_FOR_COUNTS = 50_000
"""Hit counts are computed for traces up to this many steps (they read every output)."""

KIND_ICONS = {
    "module": "◆", "nonfinite": "⚠", "abs": "↑", "entropy": "≈", "op": "ƒ", "grad": "∇",
}  # fmt: skip


@dataclass
class Breakpoint:
    """One row of the panel: what it checks, how it reads, whether it is on."""

    kind: str  # "module", "nonfinite", "abs", "entropy", "op"
    condition: Condition
    text: str  # "module blocks.1.self_attn", "|x| > 100"...
    enabled: bool = True
    hits: int | None = None  # hits in the open trace (None: not counted)
    hit_steps: list[int] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return (self.kind, self.text)


def module_breakpoint(path: str) -> Breakpoint:
    return Breakpoint("module", ModuleIs(path), f"module {path or '<root>'}")


def nonfinite_breakpoint() -> Breakpoint:
    return Breakpoint("nonfinite", NonFinite(), "NaN or Inf appears")


def abs_breakpoint(threshold: float) -> Breakpoint:
    _check_threshold(threshold, "|x| threshold")
    return Breakpoint("abs", AbsAbove(float(threshold)), f"|x| > {threshold:g}")


def entropy_breakpoint(threshold: float) -> Breakpoint:
    _check_threshold(threshold, "entropy threshold")
    return Breakpoint(
        "entropy",
        AttentionEntropyBelow(float(threshold)),
        f"attention entropy < {threshold:g} nats",
    )


def grad_norm_breakpoint(threshold: float, above: bool = True) -> Breakpoint:
    """A backward step whose gradient norm is above (exploding) or below (vanishing)."""
    _check_threshold(threshold, "gradient-norm threshold")
    if above:
        return Breakpoint("grad", GradNormAbove(float(threshold)), f"‖∇‖ > {threshold:g}")
    return Breakpoint("grad", GradNormBelow(float(threshold)), f"‖∇‖ < {threshold:g}")


def op_breakpoint(name: str) -> Breakpoint:
    name = name.strip()
    if not name:
        raise ValueError("an op breakpoint needs an op name, e.g. softmax or matmul")
    return Breakpoint("op", OpIs(name), f"op {name}")


def _check_threshold(value: float, what: str) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"the {what} must be a number >= 0, got {value!r}")


# --------------------------------------------------------------------------- item model


class BreakpointListModel(QAbstractListModel):
    """A thin adapter over a list of :class:`Breakpoint`: checkable rows, hit counts."""

    HitsRole = Qt.ItemDataRole.UserRole + 1
    KindRole = Qt.ItemDataRole.UserRole + 2

    def __init__(self, parent=None):
        super().__init__(parent)
        self.items: list[Breakpoint] = []

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex | None = None) -> int:
        return 0 if parent is not None and parent.isValid() else len(self.items)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.items):
            return None
        bp = self.items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{KIND_ICONS.get(bp.kind, '•')}  {bp.text}"
        if role == Qt.ItemDataRole.CheckStateRole:
            return Qt.CheckState.Checked if bp.enabled else Qt.CheckState.Unchecked
        if role == Qt.ItemDataRole.ForegroundRole:
            colour = theme.BREAKPOINT_COLOURS.get(bp.kind, theme.BODY_TEXT)
            return QColor(colour if bp.enabled else theme.TEXT_DISABLED)
        if role == Qt.ItemDataRole.ToolTipRole:
            hits = "not counted" if bp.hits is None else f"{bp.hits} hit(s) in this trace"
            state = "enabled" if bp.enabled else "disabled"
            return f"{bp.text} · {state} · {hits}"
        if role == self.HitsRole:
            return bp.hits
        if role == self.KindRole:
            return bp.kind
        return None

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole) -> bool:
        if not index.isValid() or role != Qt.ItemDataRole.CheckStateRole:
            return False
        state = value.value if hasattr(value, "value") else value
        self.items[index.row()].enabled = state == Qt.CheckState.Checked.value
        self.dataChanged.emit(index, index, [role, Qt.ItemDataRole.ForegroundRole])
        return True

    def flags(self, index):
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return (
            Qt.ItemFlag.ItemIsEnabled
            | Qt.ItemFlag.ItemIsSelectable
            | Qt.ItemFlag.ItemIsUserCheckable
            | Qt.ItemFlag.ItemNeverHasChildren
        )

    # ---- edits

    def add(self, bp: Breakpoint) -> int:
        """Append ``bp`` (or re-enable an identical one); return its row."""
        for row, existing in enumerate(self.items):
            if existing.key == bp.key:
                if not existing.enabled:
                    existing.enabled = True
                    i = self.index(row)
                    self.dataChanged.emit(i, i)
                return row
        row = len(self.items)
        self.beginInsertRows(QModelIndex(), row, row)
        self.items.append(bp)
        self.endInsertRows()
        return row

    def remove(self, row: int) -> None:
        if 0 <= row < len(self.items):
            self.beginRemoveRows(QModelIndex(), row, row)
            del self.items[row]
            self.endRemoveRows()

    def clear(self) -> None:
        self.beginResetModel()
        self.items = []
        self.endResetModel()

    def refresh(self, row: int) -> None:
        i = self.index(row)
        self.dataChanged.emit(i, i)


# --------------------------------------------------------------------------- panel


class BreakpointsPanel(QWidget):
    """List of breakpoints with "run to next breakpoint" over the open trace.

    Drive it with :meth:`set_trace` and :meth:`set_current_step`; listen to
    :attr:`stepRequested` (the step a run stopped at).
    """

    stepRequested = Signal(int)
    """Run to next breakpoint found this step: jump there."""

    hitFound = Signal(object)
    """The :class:`tracing.breakpoints.BreakHit` behind the last jump."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("breakpointsPanel")
        self.trace: Trace | None = None
        self.current = -1
        self.last_hit: BreakHit | None = None
        self._exhausted_from: int | None = None  # a run from here found nothing

        header = self._build_header()
        self._build_list()
        self._build_run()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(6)
        layout.addLayout(header)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.placeholder)
        layout.addWidget(self.run_button)
        layout.addWidget(self.result)
        self.model.rowsInserted.connect(self._update_enabled)
        self.model.rowsRemoved.connect(self._update_enabled)
        self.model.modelReset.connect(self._update_enabled)
        self.model.dataChanged.connect(self._on_data_changed)
        self._update_enabled()

    def _build_header(self) -> QHBoxLayout:
        """Add the current module, add a condition (a menu), remove one, clear all."""
        self.add_module_button = QToolButton(self)
        self.add_module_button.setObjectName("addModuleBreakpoint")
        self.add_module_button.setText("+ Module")
        self.add_module_button.setToolTip(
            "Break when the current step's module is entered (click a box or a tree row first)"
        )
        self.add_module_button.clicked.connect(self.add_current_module)

        self.condition_menu = QMenu(self)
        self.condition_menu.setObjectName("conditionMenu")
        self.nonfinite_action = self.condition_menu.addAction(
            "⚠  NaN or Inf appears", self.add_nonfinite
        )
        self.abs_action = self.condition_menu.addAction("↑  |x| above a threshold…", self._ask_abs)
        self.entropy_action = self.condition_menu.addAction(
            "≈  Attention entropy below a threshold…", self._ask_entropy
        )
        self.op_action = self.condition_menu.addAction("ƒ  Op name…", self._ask_op)
        self.grad_above_action = self.condition_menu.addAction(
            "∇  Gradient norm above (exploding)…", lambda: self._ask_grad(above=True)
        )
        self.grad_below_action = self.condition_menu.addAction(
            "∇  Gradient norm below (vanishing)…", lambda: self._ask_grad(above=False)
        )
        self.add_condition_button = QToolButton(self)
        self.add_condition_button.setObjectName("addConditionBreakpoint")
        self.add_condition_button.setText("+ Condition")
        self.add_condition_button.setToolTip("Break on a tensor condition or an op name")
        self.add_condition_button.setMenu(self.condition_menu)
        self.add_condition_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)

        self.remove_button = QToolButton(self)
        self.remove_button.setObjectName("removeBreakpoint")
        self.remove_button.setIcon(
            self.style().standardIcon(QStyle.StandardPixmap.SP_DialogDiscardButton)
        )
        self.remove_button.setToolTip("Remove the selected breakpoint (Delete)")
        self.remove_button.clicked.connect(self.remove_selected)
        self.clear_button = QToolButton(self)
        self.clear_button.setObjectName("clearBreakpoints")
        self.clear_button.setText("Clear")
        self.clear_button.setToolTip("Remove every breakpoint")
        self.clear_button.clicked.connect(self.clear)

        header = QHBoxLayout()
        header.setSpacing(4)
        header.addWidget(self.add_module_button)
        header.addWidget(self.add_condition_button)
        header.addStretch(1)
        header.addWidget(self.remove_button)
        header.addWidget(self.clear_button)
        return header

    def _build_list(self) -> None:
        """The breakpoints with their hit counts (Delete removes one), or a hint when none."""
        self.model = BreakpointListModel(self)
        self.list = QListView(self)
        self.list.setObjectName("breakpointList")
        self.list.setModel(self.model)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.setUniformItemSizes(True)
        self.list.setAlternatingRowColors(True)
        self.list.setItemDelegate(_HitsDelegate(self.list))
        self.list.setMinimumHeight(90)
        self.list.doubleClicked.connect(self._on_double_click)
        remove = QAction("Remove breakpoint", self.list)
        remove.setShortcut(QKeySequence(QKeySequence.StandardKey.Delete))
        remove.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        remove.triggered.connect(self.remove_selected)
        self.list.addAction(remove)
        self.placeholder = hint_label(
            "No breakpoints. Add the current module, or a condition: NaN/Inf, |x| above a "
            "threshold, a sharp attention row, an op.",
            wrap=True,
        )

    def _build_run(self) -> None:
        """Run to the next breakpoint, and what the last run found."""
        self.run_button = QPushButton("Run to next breakpoint", self)
        self.run_button.setObjectName("runToBreakpoint")
        self.run_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_MediaPlay))
        self.run_button.setToolTip(
            "From the current step to the next step where a breakpoint holds (F5)"
        )
        self.run_button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.run_button.clicked.connect(self.run_to_next)
        self.result = QLabel(" ")
        self.result.setObjectName("breakpointResult")
        self.result.setWordWrap(True)
        self.result.setTextFormat(Qt.TextFormat.RichText)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

    def sizeHint(self) -> QSize:
        return QSize(330, 420)

    # --------------------------------------------------------------------- the trace

    def set_trace(self, trace: Trace | None) -> None:
        """A new trace: recount every breakpoint's hits; start before the first step."""
        self.trace = trace
        self.current = -1
        self.last_hit = None
        self._exhausted_from = None
        self._count_all()
        self.result.setText(" ")
        self._update_enabled()

    def set_current_step(self, index: int) -> None:
        """The window moved to step ``index`` (runs start after it)."""
        if index != self.current:
            self._exhausted_from = None
        self.current = index

    @property
    def breakpoints(self) -> list[Breakpoint]:
        return list(self.model.items)

    def enabled_conditions(self) -> list[Condition]:
        return [bp.condition for bp in self.model.items if bp.enabled]

    # --------------------------------------------------------------------- adding

    def add(self, bp: Breakpoint) -> int:
        """Add a breakpoint (an identical one is re-enabled instead); return its row."""
        row = self.model.add(bp)
        self._count(self.model.items[row])
        self.model.refresh(row)
        self.list.setCurrentIndex(self.model.index(row))
        self._exhausted_from = None
        return row

    def add_current_module(self) -> int | None:
        """A module breakpoint on the current step's module (None without a trace)."""
        if self.trace is None or not self.trace.steps:
            return None
        step = self.trace.steps[max(0, min(self.current, len(self.trace.steps) - 1))]
        return self.add(module_breakpoint(step.module))

    def add_module(self, path: str) -> int:
        return self.add(module_breakpoint(path))

    def add_nonfinite(self) -> int:
        return self.add(nonfinite_breakpoint())

    def add_abs_above(self, threshold: float) -> int:
        return self.add(abs_breakpoint(threshold))

    def add_entropy_below(self, threshold: float) -> int:
        return self.add(entropy_breakpoint(threshold))

    def add_op(self, name: str) -> int:
        return self.add(op_breakpoint(name))

    def add_grad_norm(self, threshold: float, above: bool = True) -> int:
        return self.add(grad_norm_breakpoint(threshold, above))

    def _ask_grad(self, above: bool) -> None:
        what = "above" if above else "below"
        value, ok = QInputDialog.getDouble(
            self,
            f"Break when a gradient norm is {what}",
            "L2 norm threshold (training-step traces: backward steps):",
            1e3 if above else 1e-6,
            0,
            1e300,
            8,
        )
        if ok:
            self.add_grad_norm(value, above)

    def _ask_abs(self) -> None:
        value, ok = QInputDialog.getDouble(
            self, "Break when |x| exceeds", "Threshold (absolute value):", 1e4, 0, 1e300, 4
        )
        if ok:
            self.add_abs_above(value)

    def _ask_entropy(self) -> None:
        value, ok = QInputDialog.getDouble(
            self,
            "Break on a sharp attention row",
            "Entropy threshold in nats (a row spread over n keys has ln n):",
            0.1,
            0,
            100,
            3,
        )
        if ok:
            self.add_entropy_below(value)

    def _ask_op(self) -> None:
        names = self.op_names()
        name, ok = QInputDialog.getItem(
            self, "Break on an op", "Op name:", names or ["softmax"], 0, True
        )
        if ok and name.strip():
            self.add_op(name)

    def op_names(self) -> list[str]:
        """Op names in the open trace, most frequent first (for the op menu)."""
        if self.trace is None:
            return []
        counts: dict[str, int] = {}
        for s in self.trace.steps:
            if s.kind == "op":
                counts[s.op] = counts.get(s.op, 0) + 1
        return sorted(counts, key=lambda n: (-counts[n], n))

    # --------------------------------------------------------------------- removing

    def remove_selected(self) -> None:
        row = self.list.currentIndex().row()
        if row >= 0:
            self.model.remove(row)
            self._exhausted_from = None

    def remove(self, row: int) -> None:
        self.model.remove(row)
        self._exhausted_from = None

    def set_enabled(self, row: int, enabled: bool) -> None:
        state = Qt.CheckState.Checked if enabled else Qt.CheckState.Unchecked
        self.model.setData(self.model.index(row), state, Qt.ItemDataRole.CheckStateRole)

    def clear(self) -> None:
        self.model.clear()
        self.result.setText(" ")

    # --------------------------------------------------------------------- running

    def run_to_next(self) -> int | None:
        """Find the next hit after the current step and emit ``stepRequested``.

        Returns the step, or None when no enabled breakpoint holds after the current step
        (a second run from the same place then searches from the start).
        """
        trace = self.trace
        conditions = self.enabled_conditions()
        if trace is None or not trace.steps:
            self._say("No trace is open.", theme.TEXT_MUTED)
            return None
        if not conditions:
            self._say("No enabled breakpoint: add one above.", theme.TEXT_MUTED)
            return None
        start = self.current
        wrapped = self._exhausted_from is not None and self._exhausted_from == self.current
        if wrapped:
            start = -1
        try:
            hit = find_hit(trace, float(start), conditions)
        except Exception as e:  # a condition that cannot read a tensor: say so, keep going
            self._say(f"Cannot check the breakpoints: {_escape(str(e))}", theme.ERROR_TEXT)
            return None
        if hit is None:
            self._exhausted_from = self.current
            where = "in the trace" if wrapped else f"after {step_text(self.current)}"
            self._say(
                f"No breakpoint holds {where}."
                + ("" if wrapped else " Run again to search from the first step."),
                theme.TEXT_MUTED,
            )
            return None
        self._exhausted_from = None
        self.last_hit = hit
        self.current = hit.step
        step = trace.steps[hit.step]
        event = "entered" if hit.event == "enter" else ("returned" if step.kind == "module" else "")
        head = f"{step_text(hit.step)} / {len(trace.steps)} · {_escape(hit.label)}"
        if event:
            head += f" <span style='color:{theme.TEXT_MUTED}'>({event})</span>"
        text = f"<b style='color:{theme.CURRENT}'>● {head}</b><br>{_escape(hit.reason)}"
        if step.source is not None and step.source.text:
            name = step.source.file.rsplit("/", 1)[-1]
            text += (
                f"<br><code style='color:{theme.TEXT_SHAPE}'>{_escape(name)}:{step.source.line}  "
                f"{_escape(step.source.text)}</code>"
            )
        self.result.setText(text)
        self.hitFound.emit(hit)
        self.stepRequested.emit(hit.step)
        return hit.step

    # --------------------------------------------------------------------- internals

    def _say(self, text: str, colour: str) -> None:
        self.result.setText(f"<span style='color:{colour}'>{text}</span>")

    def _count(self, bp: Breakpoint) -> None:
        trace = self.trace
        if trace is None or len(trace.steps) > MAX_STEPS_FOR_COUNTS:
            bp.hits, bp.hit_steps = None, []
            return
        try:
            hits = find_all(trace, [bp.condition])
        except Exception:  # counting is a courtesy; running reports the problem
            bp.hits, bp.hit_steps = None, []
            return
        bp.hits, bp.hit_steps = len(hits), [h.step for h in hits]

    def _count_all(self) -> None:
        for row, bp in enumerate(self.model.items):
            self._count(bp)
            self.model.refresh(row)

    def _on_data_changed(self, *_args) -> None:
        self._exhausted_from = None
        self._update_enabled()

    def _update_enabled(self, *_args) -> None:
        has_trace = self.trace is not None and bool(self.trace.steps)
        has_items = bool(self.model.items)
        self.placeholder.setVisible(not has_items)
        self.add_module_button.setEnabled(has_trace)
        self.remove_button.setEnabled(has_items)
        self.clear_button.setEnabled(has_items)
        self.run_button.setEnabled(has_trace and any(bp.enabled for bp in self.model.items))

    def _on_double_click(self, index: QModelIndex) -> None:
        """Double-click a breakpoint: jump to its first hit after the current step."""
        bp = self.model.items[index.row()] if index.isValid() else None
        if bp is None or not bp.hit_steps:
            return
        after = [s for s in bp.hit_steps if s > self.current] or bp.hit_steps
        self.current = after[0]
        self.stepRequested.emit(after[0])


class _HitsDelegate(QStyledItemDelegate):
    """Draws the row as usual plus a right-aligned hit count ("2 hits")."""

    def paint(self, painter, option, index) -> None:
        super().paint(painter, option, index)
        hits = index.data(BreakpointListModel.HitsRole)
        if hits is None:
            return
        painter.save()
        font = QFont(option.font)
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        painter.setFont(font)
        enabled = index.data(Qt.ItemDataRole.CheckStateRole) == Qt.CheckState.Checked
        painter.setPen(QColor(theme.CURRENT if hits and enabled else theme.TEXT_DISABLED))
        text = f"{hits} hit" + ("" if hits == 1 else "s")
        rect = option.rect.adjusted(0, 0, -8, 0)
        painter.drawText(
            rect, int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter), text
        )
        painter.restore()


class BreakpointsDock(QDockWidget):
    """The panel in a dock (the main window's View menu toggles it)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Breakpoints", parent)
        self.setObjectName("breakpointsDock")
        self.panel = BreakpointsPanel(self)
        self.setWidget(self.panel)
        self.setAllowedAreas(
            Qt.DockWidgetArea.LeftDockWidgetArea
            | Qt.DockWidgetArea.RightDockWidgetArea
            | Qt.DockWidgetArea.BottomDockWidgetArea
        )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


__all__ = [
    "Breakpoint",
    "BreakpointListModel",
    "BreakpointsDock",
    "BreakpointsPanel",
    "abs_breakpoint",
    "entropy_breakpoint",
    "module_breakpoint",
    "nonfinite_breakpoint",
    "op_breakpoint",
]


# --------------------------------------------------------------------------- main window


def attach(window) -> BreakpointsDock:
    """Add the Breakpoints dock to the main window (hidden; View ▸ Breakpoints, Ctrl+B).

    The dock follows the window's trace and current step; "Run to next breakpoint" (F5,
    also in the Debug menu) moves the window to the step found.
    """
    dock = BreakpointsDock(window)
    panel = dock.panel
    panel.stepRequested.connect(window.jump_to)
    window.stepChanged.connect(panel.set_current_step)

    def on_trace_changed() -> None:
        panel.set_trace(window.trace)
        panel.set_current_step(window.current if window.trace is not None else -1)

    window.traceChanged.connect(on_trace_changed)
    on_trace_changed()

    run = QAction("Run to next &breakpoint", window)
    run.setShortcut(QKeySequence("F5"))
    run.setStatusTip("Run from the current step to the next step where a breakpoint holds")

    def run_to_next() -> None:
        dock.show()
        dock.raise_()
        panel.run_to_next()

    run.triggered.connect(lambda _checked=False: run_to_next())
    window.add_menu_action("Debug", run, separator=True)
    window.add_dock(
        dock,
        Qt.DockWidgetArea.LeftDockWidgetArea,
        "&Breakpoints",
        shortcut="Ctrl+B",
        tip="Show the breakpoints panel",
        separator=True,
    )
    dock.run_action = run
    return dock
