"""Edit actions in the app: change a value, re-run, and see what it changed.

Right-click a box in the diagram (a module call or an op) or a head in the attention grid:

    Zero · Mean-ablate · Scale… · Patch from another prompt…

The window's model is traced again with the edit (``app.core.edit_session.run_edits``, off the
GUI thread, cancellable) and the compare view opens, original against edited, on the first
step whose values differ, with the change in the final prediction on top (the top tokens
before and after, and how much each one's probability moved). The Edits panel (View ▸
Edits, Ctrl+Shift+E) lists the edits: tick or untick them, remove them, re-run. Edit ▸
Patching sweep… opens :class:`app.windows.sweep_dialog.SweepDialog`.

Edits need the live model; on a trace opened from a file every action says so
(``app.core.edit_session.missing_model``) instead of doing nothing.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QPoint, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QWidget,
)

from app import theme
from app.core import edit_session, session
from app.core.session import SessionError
from app.widgets.common import column, hint_label
from app.windows import dialogs
from app.windows.compare_window import CompareWindow
from app.windows.sweep_dialog import SweepDialog
from app.workers import BackgroundJob, JobWithProgress
from tracing.capture.edits import Action, Edit, EditError
from tracing.formatting import step_text
from tracing.token_names import token_namer

if TYPE_CHECKING:  # pragma: no cover
    from app.core.session import TraceOutcome
    from tracing import Trace

MENU_TEXT = {
    "zero": "Zero",
    "mean": "Mean-ablate (mean over positions)",
    "scale": "Scale…",
    "patch": "Patch from another prompt…",
    "patch_file": "Patch from a trace file…",
}


class EditsPanel(QWidget):
    """The list of edits (tick to enable) and Remove / Clear / Re-run / Sweep buttons."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.status = hint_label(wrap=True)
        self.list = QListWidget()
        self.list.setObjectName("editsList")
        self.list.setWordWrap(True)  # an edit found inside an attention says where, at length
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.remove_button = QPushButton("Remove")
        self.clear_button = QPushButton("Clear")
        self.run_button = QPushButton("Re-run ▶")
        self.run_button.setObjectName("rerunEdits")
        self.sweep_button = QPushButton("Sweep…")
        buttons = QHBoxLayout()
        for b in (self.remove_button, self.clear_button, self.sweep_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.run_button)
        column(self.status, (self.list, 1), buttons, margins=(6, 6, 6, 6), on=self)

    def set_edits(self, edits: list[Edit], enabled: list[bool]) -> None:
        self.list.clear()
        for edit, on in zip(edits, enabled):
            item = QListWidgetItem(edit.describe())
            item.setToolTip(edit.describe())
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
            self.list.addItem(item)
        if not edits:
            item = QListWidgetItem("No edits yet: right-click a box or an attention head.")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(item)
        self.remove_button.setEnabled(bool(edits))
        self.clear_button.setEnabled(bool(edits))
        self.run_button.setEnabled(bool(edits))

    def enabled(self) -> list[bool]:
        return [
            self.list.item(i).checkState() == Qt.CheckState.Checked
            for i in range(self.list.count())
            if self.list.item(i).flags() & Qt.ItemFlag.ItemIsUserCheckable
        ]


def percent(p: float) -> str:
    """A probability with enough digits to tell a small change: ``0.734%``, ``3.1e-05%``."""
    return f"{p * 100:.3f}%" if p == 0 or p >= 1e-5 else f"{p * 100:.1e}%"


def signed(x: float, unit: str = "", scale: float = 1.0) -> str:
    """``+0.0370``, ``-2.4e-06``; ``0`` only when it is exactly zero."""
    if x == 0:
        return "0"
    v = x * scale
    text = f"{v:+.4f}" if abs(v) >= 1e-3 else f"{v:+.1e}"
    return text + unit


def change_line(change: edit_session.OutputChange | None) -> str:
    """``no change (bit-identical outputs)`` or ``KL(before ‖ after) 3.2e-05 nats · ...``."""
    if change is None:
        return ""
    if change.identical:
        return "no change: the edited run's outputs are bit-identical to the original's"
    return f"KL(before ‖ after) = {change.kl:.3g} nats · max |Δlogit| {change.max_logit_change:.3g}"


def prediction_card(
    rows: list[edit_session.PredictionRow] | None,
    change: edit_session.OutputChange | None = None,
) -> QLabel:
    """The change in the final prediction: the top tokens' probability and logit before and
    after, their change, and the KL divergence of the two output distributions."""
    label = QLabel()
    label.setObjectName("predictionChange")
    label.setTextFormat(Qt.TextFormat.RichText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if not rows:
        label.setText(edit_session.prediction_summary(rows))
        return label
    right = "align='right'"
    cells = [
        f"<tr><th align='left'>token&nbsp;</th><th {right}>p before&nbsp;</th>"
        f"<th {right}>p after&nbsp;</th><th {right}>Δp&nbsp;</th>"
        f"<th {right}>logit before&nbsp;</th><th {right}>Δlogit</th></tr>"
    ]
    for r in rows:
        colour = (
            theme.RESIDUAL_EDGE if r.change > 0 else theme.ERROR_TEXT if r.change < 0 else
            theme.TEXT_MUTED
        )  # fmt: skip
        cells.append(
            f"<tr><td><code>{html.escape(repr(r.label), quote=False)}</code></td>"
            f"<td {right}>{percent(r.before)}&nbsp;</td><td {right}>{percent(r.after)}&nbsp;</td>"
            f"<td {right} style='color:{colour}'>{signed(r.change, ' pp', 100)}&nbsp;</td>"
            f"<td {right}>{r.logit_before:.4f}&nbsp;</td>"
            f"<td {right} style='color:{colour}'>{signed(r.logit_change)}</td></tr>"
        )
    summary = html.escape(edit_session.prediction_summary(rows), quote=False)
    line = html.escape(change_line(change), quote=False)
    extra = f"<br>{line}" if line else ""
    label.setText(
        f"<b>{summary}</b>{extra}<table cellspacing='2'>{''.join(cells)}</table>"
        f"<span style='color:{theme.TEXT_MUTED}'>pp: percentage points</span>"
    )
    return label


class EditsController(QObject):
    """The window's edit actions, the Edits dock, and the compare views they open."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.edits: list[Edit] = []
        self.enabled: list[bool] = []
        self.job: JobWithProgress | None = None
        self.compare_windows: list[CompareWindow] = []
        self.last_compare: CompareWindow | None = None
        self.sweep_dialog = None

        self.panel = EditsPanel()
        self.dock = QDockWidget("Edits", window)
        self.dock.setObjectName("editsDock")
        self.dock.setWidget(self.panel)
        self.panel.remove_button.clicked.connect(self.remove_selected)
        self.panel.clear_button.clicked.connect(self.clear)
        self.panel.run_button.clicked.connect(lambda: self.run())
        self.panel.sweep_button.clicked.connect(self.open_sweep)
        self.panel.list.itemChanged.connect(self._on_item_changed)
        self.panel.set_edits([], [])

        window.diagram.stepContextMenu.connect(self.show_step_menu)
        window.inspector.attention.headContextMenu.connect(self.show_head_menu)
        window.traceChanged.connect(self._on_trace_changed)

    # ---- menus

    def step_menu(self, index: int) -> QMenu:
        """Zero / Mean-ablate / Scale… / Patch… for step ``index``'s output."""
        step = self.window.trace.steps[index]
        title = f"Edit {step_text(index)}: {step.label}"
        return self._menu(
            title, lambda action: edit_session.edit_for_step(self.window.trace, index, action)
        )

    def head_menu(self, map_step: int, head: int) -> QMenu:
        """The same actions for one head of the layer whose map step ``map_step`` made."""
        module = self.window.trace.steps[map_step].module
        title = f"Edit head {head} of {module}"
        return self._menu(
            title,
            lambda action: edit_session.edit_for_head(self.window.trace, map_step, head, action),
        )

    def show_step_menu(self, index: int, where: QPoint) -> None:
        trace = self.window.trace
        if trace is not None and 0 <= index < len(trace.steps):
            self.step_menu(index).exec(where)

    def show_head_menu(self, map_step: int, head: int, where: QPoint) -> None:
        if self.window.trace is not None:
            self.head_menu(map_step, head).exec(where)

    def _menu(self, title: str, make: Callable[[Action], Edit]) -> QMenu:
        menu = QMenu(self.window)
        header = menu.addAction(title)
        header.setEnabled(False)
        problem = edit_session.missing_model(self.window.trace_request, self.window.trace)
        if problem is not None:
            note = menu.addAction("needs a live model (trace opened from a file)")
            note.setEnabled(False)
            note.setToolTip(problem)
        menu.setToolTipsVisible(True)
        menu.addSeparator()
        for kind in edit_session.ACTIONS:
            action = menu.addAction(MENU_TEXT[kind])
            action.setObjectName(f"edit_{kind}")
            if problem is not None:  # disabled, saying why: never enabled-then-failing
                action.setEnabled(False)
                action.setToolTip(problem)
            action.triggered.connect(lambda _c=False, k=kind: self.apply(k, make))
        return menu

    # ---- adding and running

    def apply(self, kind: str, make: Callable[[Action], Edit], background: bool = True) -> bool:
        """Ask what the action needs (a factor, a prompt), add the edit, re-run."""
        problem = edit_session.missing_model(self.window.trace_request, self.window.trace)
        if problem is not None:
            dialogs.show_error(self.window, "Edits need a live model", problem)
            return False
        scale, source = 0.0, None
        if kind == "scale":
            scale, ok = QInputDialog.getDouble(
                self.window, "Scale", "Multiply the value by:", 0.5, -1e6, 1e6, 4
            )
            if not ok:
                return False
        elif kind == "patch":
            prompt, ok = QInputDialog.getText(
                self.window,
                "Patch from another prompt",
                "Take the value from the run on this prompt (same number of tokens):",
                text=self.window.trace_request.prompt,
            )
            if not ok or not prompt:
                return False
            source = edit_session.PatchFromPrompt(prompt)
        elif kind == "patch_file":
            source = self._choose_trace_file()
            if source is None:
                return False
        try:
            edit = make(edit_session.make_action(kind, scale, source))
        except (SessionError, EditError) as e:
            dialogs.show_error(self.window, "Cannot edit here", str(e))
            return False
        self.add(edit)
        return self.run(background=background)

    def _choose_trace_file(self):
        """A values trace file of the same model to patch from (None: cancelled or bad)."""
        path, _ = QFileDialog.getOpenFileName(
            self.window,
            "Patch from a trace file (captured at values)",
            self.window.start_dir(),
            dialogs.TRACE_FILTER,
        )
        if not path:
            return None
        try:
            return session.open_trace(path)
        except session.SessionError as e:
            dialogs.show_error(self.window, "Cannot patch from that file", str(e))
            return None

    def add(self, edit: Edit) -> None:
        self._edited_trace = self.window.trace  # the edits belong to this trace's run
        self.edits.append(edit)
        self.enabled.append(True)
        self.panel.set_edits(self.edits, self.enabled)
        self.dock.show()

    def remove_selected(self) -> None:
        row = self.panel.list.currentRow()
        if 0 <= row < len(self.edits):
            del self.edits[row]
            del self.enabled[row]
            self.panel.set_edits(self.edits, self.enabled)

    def clear(self) -> None:
        self.edits, self.enabled = [], []
        self.panel.set_edits([], [])

    def _on_item_changed(self, _item) -> None:
        self.enabled = self.panel.enabled()

    def active_edits(self) -> tuple[Edit, ...]:
        return tuple(e for e, on in zip(self.edits, self.enabled) if on)

    def run(self, background: bool = True) -> bool:
        """Re-trace the window's live model with the ticked edits; opens the compare view."""
        window = self.window
        problem = edit_session.missing_model(window.trace_request, window.trace)
        if problem is not None:
            dialogs.show_error(window, "Edits need a live model", problem)
            return False
        if self.job is not None:
            window.statusBar().showMessage("An edited run is already going.", 4000)
            return False
        request = edit_session.EditRequest(window.trace_request, self.active_edits())
        if not background:
            try:
                outcome = edit_session.run_edits(request)
            except SessionError as e:
                dialogs.show_error(window, "Cannot run the edits", str(e))
                return False
            return self._show_outcome(outcome)
        job = BackgroundJob(
            request,
            edit_session.run_edits,
            refused_title="Cannot run the edits",
            failed_title="The edited run failed",
        )
        self.job = JobWithProgress(
            window,
            job,
            "Running the model with the edits…",
            "Edits",
            self._on_finished,
            self._on_failed,
        )
        return True

    def _on_finished(self, outcome: TraceOutcome) -> None:
        self.job = None
        self._show_outcome(outcome)

    def _on_failed(self, title: str, text: str) -> None:
        self.job = None
        dialogs.show_error(self.window, title, text)

    def _show_outcome(self, outcome: TraceOutcome) -> bool:
        if outcome.status == "cancelled":
            self.window.statusBar().showMessage("Edited run cancelled.", 4000)
            return False
        if outcome.trace is None:
            dialogs.show_error(self.window, "The edited run failed", outcome.message)
            return False
        self.show_comparison(self.window.trace, outcome.trace)
        if outcome.status == "failed":
            dialogs.show_error(self.window, "The edited forward pass raised", outcome.message)
        return True

    def show_comparison(self, original: Trace, edited: Trace) -> CompareWindow:
        """The compare view, original (A) against edited (B), with the prediction change."""
        described = "; ".join(e.describe() for e in self.active_edits()) or "edited"
        compare = CompareWindow(original, edited, "original", "edited", parent=self.window)
        compare.setWindowTitle(f"Edit: {described} — Scratchformer")
        rows = edit_session.prediction_change(original, edited, token_namer(original.meta))
        change = edit_session.output_change(original, edited)
        compare.add_card("Prediction (last position)", prediction_card(rows, change))
        edits_label = hint_label(html.escape(described), wrap=True)
        compare.add_card("Edits", edits_label)
        heads = [e.head for e in self.active_edits() if isinstance(e.head, int)]
        if heads:  # A − B on the edited head, not on head 0
            for spin in compare.slice_bar.spins:
                if spin.toolTip().startswith("index along axis H "):
                    spin.setValue(heads[0])
        compare.setWindowFlag(Qt.WindowType.Window, True)
        compare.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        compare.destroyed.connect(lambda _o=None, c=compare: self._forget(c))
        self.compare_windows.append(compare)
        self.last_compare = compare
        compare.show()
        return compare

    def _forget(self, compare) -> None:
        if compare in self.compare_windows:
            self.compare_windows.remove(compare)
        if self.last_compare is compare:
            self.last_compare = None

    # ---- the rest

    def open_sweep(self):
        problem = edit_session.missing_model(self.window.trace_request, self.window.trace)
        if problem is not None:
            dialogs.show_error(self.window, "Sweeps need a live model", problem)
            return None
        if self.sweep_dialog is None:
            self.sweep_dialog = SweepDialog(self.window)
        self.sweep_dialog.set_request(self.window.trace_request)
        self.sweep_dialog.show()
        self.sweep_dialog.raise_()
        return self.sweep_dialog

    def _on_trace_changed(self) -> None:
        if self.edits and self.window.trace is not getattr(self, "_edited_trace", None):
            # another trace: the edits of the last one are not this one's; the dock goes
            self.clear()
            self.dock.hide()
        request = self.window.trace_request
        if self.window.trace is None:
            text = "No trace."
        elif request is None:
            text = "Trace opened from a file: edits need a live model (File ▸ New trace…)."
        else:
            text = f"Live model: {request.source.describe()} · prompt {request.prompt!r}"
        self.panel.status.setText(text)

    def edit_current_step(self, kind: str) -> None:
        window = self.window
        if window.trace is None or not window.trace.steps:
            return
        index = window.current
        self.apply(kind, lambda a: edit_session.edit_for_step(window.trace, index, a))


def attach(window) -> EditsController:
    """Add the Edits dock (View ▸ Edits, Ctrl+Shift+E) and an Edit menu to the window."""
    controller = EditsController(window)
    window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, controller.dock)
    controller.dock.hide()
    toggle = controller.dock.toggleViewAction()
    toggle.setText("&Edits")
    toggle.setShortcut(QKeySequence("Ctrl+Shift+E"))
    window.addAction(toggle)
    bar = window.menuBar()
    help_action = next((a for a in bar.actions() if a.text().replace("&", "") == "Help"), None)
    menu = QMenu("E&dit", window)
    bar.insertMenu(help_action, menu)
    for kind in edit_session.ACTIONS:
        action = QAction(f"{MENU_TEXT[kind]} (current step)", window)
        action.triggered.connect(lambda _c=False, k=kind: controller.edit_current_step(k))
        menu.addAction(action)
    menu.addSeparator()
    sweep = QAction("Patching &sweep…", window)
    sweep.triggered.connect(lambda _c=False: controller.open_sweep())
    menu.addAction(sweep)
    rerun = QAction("&Re-run edits", window)
    rerun.triggered.connect(lambda _c=False: controller.run())
    menu.addAction(rerun)
    menu.addAction(toggle)
    controller.menu = menu
    # right-click on the step bar's status line: the current step's menu
    status = window.step_bar.status
    status.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
    status.customContextMenuRequested.connect(
        lambda pos: controller.show_step_menu(window.current, status.mapToGlobal(pos))
    )
    controller._on_trace_changed()
    return controller
