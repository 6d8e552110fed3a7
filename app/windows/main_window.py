"""The main window: module tree | block diagram over source | inspector, step bar below.

The window owns the current trace and the current step and keeps every pane on that
step: :meth:`MainWindow.go_to` is the one place a move happens, whoever asked for it (the
step bar, a key, a click on a box or a tree row, an attention thumbnail). File work goes
through :mod:`app.core.session`; every failure ends in ``dialogs.show_error`` and the window
keeps going.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QProgressDialog,
    QSplitter,
    QStyle,
    QVBoxLayout,
    QWidget,
)

import scratchformer
from app.core import session
from app.core.long_lived import long_lived
from app.diagram.view import DiagramView
from app.panels import breakpoints, dims, edits, find, generation, lens, retrace
from app.panels.inspector import Inspector
from app.panels.module_tree import ModuleTree
from app.panels.source import SourceView
from app.panels.step_bar import StepBar
from app.widgets.common import LayoutFirewall, titled
from app.windows import compare_window, dialogs, rank_window
from app.workers import TraceJob
from tracing.analysis import report
from tracing.formatting import step_text

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace

APP_NAME = "Scratchformer"
REPORT_FILTERS = {
    "md": "Markdown (*.md)",
    "csv": "CSV (*.csv)",
    "json": "JSON (*.json)",
    "html": "HTML page (*.html)",
    "graphml": "GraphML (*.graphml)",
}
MAX_RECENT = 8


def short_source(step_source) -> str:
    """``attention.py:57 · scores = q @ k.transpose(-2, -1)``."""
    if step_source is None:
        return "(no source line)"
    name = Path(step_source.file).name if step_source.file else "?"
    text = f" · {step_source.text}" if step_source.text else ""
    return f"{name}:{step_source.line}{text}"


class MainWindow(QMainWindow):
    """The debugger window. ``settings`` is injectable so tests do not touch the user's."""

    traceChanged = Signal()
    stepChanged = Signal(int)
    traceJobEnded = Signal()  # a background trace finished, failed or was cancelled

    def __init__(self, settings: QSettings | None = None):
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle(APP_NAME)
        self.resize(1500, 950)
        self.setAcceptDrops(True)
        self.settings = settings if settings is not None else QSettings(APP_NAME, APP_NAME)
        self.trace: Trace | None = None
        self.trace_path: Path | None = None
        self.current = 0
        self._first_steps: dict[str, int] = {}
        self.job: TraceJob | None = None
        self.progress_dialog: QProgressDialog | None = None
        self._last_prompt = ""
        # (trace, the request that traced it live): edits re-run that request
        self._live: tuple[Trace, session.TraceRequest] | None = None
        self._pending_request: session.TraceRequest | None = None
        self.last_request: session.TraceRequest | None = None
        self.trace_models: dict[int, object] = {}  # id(trace) -> the model that produced it

        # ---- panes
        self.tree = ModuleTree(self)
        self.diagram = DiagramView(self)
        self.source_view = SourceView(self)
        self.inspector = Inspector(self)
        self.step_bar = StepBar(self)

        self.centre = QSplitter(Qt.Orientation.Vertical, self)
        self.centre.addWidget(self.diagram)
        self.centre.addWidget(self.source_view)
        self.centre.setStretchFactor(0, 4)
        self.centre.setStretchFactor(1, 1)
        self.centre.setSizes([700, 170])
        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(titled("Modules", self.tree))
        self.splitter.addWidget(self.centre)
        self.splitter.addWidget(LayoutFirewall(self.inspector, minimum=QSize(320, 240)))
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setSizes([400, 640, 460])
        for s in (self.splitter, self.centre):
            s.setChildrenCollapsible(False)
            s.setHandleWidth(5)
        central = QWidget(self)
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.splitter, 1)
        layout.addWidget(self.step_bar)
        self.setCentralWidget(central)
        self.summary_label = QLabel("", self)
        self.zoom_label = QLabel("", self)
        self.statusBar().addWidget(self.summary_label, 1)
        self.statusBar().addPermanentWidget(self.zoom_label)

        # ---- wiring: every move goes through go_to
        self.step_bar.stepRequested.connect(self.go_to)
        self.step_bar.stepOverRequested.connect(self.step_over)
        self.step_bar.stepOutRequested.connect(self.step_out)
        self.step_bar.nextNonfiniteRequested.connect(self.run_to_nonfinite)
        self.diagram.stepActivated.connect(self.go_to)
        self.diagram.layoutChanged.connect(self._update_zoom_label)
        self.tree.moduleActivated.connect(self.go_to_module)
        self.inspector.stepRequested.connect(self.jump_to)

        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        # ---- analysis: File ▸ Compare with… / Trace generation…, Breakpoints and Lens docks
        self.compare = compare_window.attach(self)
        self.retrace = retrace.attach(self)
        self.ranks_launcher = rank_window.attach(self)  # File ▸ Open ranks…
        self.breakpoints_dock = breakpoints.attach(self)
        self.lens_dock = lens.attach(self)
        self.dims_dock = dims.attach(self)  # View ▸ Dims legend: the trace's axis letters
        self.generation = generation.attach(self)
        self.edits = edits.attach(self)
        self.finder = find.attach(self)  # Ctrl+F, Ctrl+G, F3: app.panels.find
        self.set_trace(None)

    # --------------------------------------------------------------------- actions

    def _action(self, text: str, slot, shortcuts=(), tip: str = "", icon=None) -> QAction:
        action = QAction(text, self)
        if shortcuts:
            action.setShortcuts([QKeySequence(s) for s in shortcuts])
            action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if tip:
            action.setToolTip(tip)
            action.setStatusTip(tip)
        if icon is not None:
            action.setIcon(self.style().standardIcon(icon))
        action.triggered.connect(lambda _checked=False: slot())
        self.addAction(action)  # shortcuts work even with the menu bar hidden
        return action

    def _build_actions(self) -> None:
        SP = QStyle.StandardPixmap
        K = QKeySequence.StandardKey
        self.new_action = self._action(
            "&New trace…",
            self.new_trace_dialog,
            [K.New],
            "Trace a prompt through a model",
            SP.SP_FileIcon,
        )
        self.open_action = self._action(
            "&Open…", self.open_dialog, [K.Open], "Open a trace file", SP.SP_DialogOpenButton
        )
        self.save_action = self._action(
            "Save &As…",
            self.save_dialog,
            [K.SaveAs, "Ctrl+S"],
            "Save this trace to a file",
            SP.SP_DialogSaveButton,
        )
        self.report_action = self._action(
            "Export shape &report…",
            self.export_report_dialog,
            ["Ctrl+Shift+E"],  # Ctrl+R is File ▸ Reload and re-trace (app.panels.retrace)
            "Markdown, CSV, JSON, HTML or GraphML",
        )
        self.proofs_report_action = self._action(
            "Export shape report with axis &proofs…",
            lambda: self.export_report_dialog(proofs=True),
            [],
            "The shape report, with why each axis has its name and which passes moved each letter",
        )
        self.diagram_export_action = self._action(
            "Export &diagram…", self.export_diagram_dialog, [], "The block diagram as PNG or SVG"
        )
        self.heatmap_export_action = self._action(
            "Export &heatmap…", self.export_heatmap_dialog, [], "The heatmap on show as PNG or SVG"
        )
        self.quit_action = self._action("&Quit", self.close, [K.Quit])

        self.first_action = self._action("First step", lambda: self.go_to(0), ["Home"])
        self.prev_action = self._action("Previous step", self.prev, ["Left", "F7"])
        self.next_action = self._action("Next step (step into)", self.next, ["Right", "F11"])
        self.last_action = self._action("Last step", self.last, ["End"])
        self.over_action = self._action(
            "Step over module",
            self.step_over,
            ["F10", "O"],
            "Jump past the current module's internals",
        )
        self.out_action = self._action(
            "Step out of module",
            self.step_out,
            ["Shift+F11", "U"],
            "Run to the step after the enclosing module",
        )
        self.nan_action = self._action(
            "Run to next NaN/Inf",
            self.run_to_nonfinite,
            ["N", "F8"],
            "Run to the next step whose tensors hold NaN or Inf",
        )
        self.play_action = self._action("Play / pause", self.step_bar.toggle_play, ["Space"])

        self.fit_action = self._action(
            "&Fit diagram", self.diagram.fit, ["F"], "Fit the whole diagram in the window"
        )
        self.zoom_in_action = self._action("Zoom in", lambda: self._zoom(1.25), [K.ZoomIn, "="])
        self.zoom_out_action = self._action("Zoom out", lambda: self._zoom(0.8), [K.ZoomOut, "-"])
        self.collapse_all_action = self._action("Collapse all blocks", self.collapse_all, ["C"])
        self.expand_all_action = self._action("Expand all blocks", self.expand_all, ["E"])
        self.expand_current_action = self._action(
            "Expand the current step's box",
            self.expand_current,
            ["X"],
            "Open the collapsed box that holds the current step",
        )
        self.fold_action = self._action(
            "Fold &repetition",
            lambda: self.diagram.set_fold_repetition(self.fold_action.isChecked()),
            ["R"],
            "Fold a loop's calls, identical sibling blocks and repeating ops into one box",
        )
        self.fold_action.setCheckable(True)
        self.fold_action.setChecked(True)
        self.grad_colour_action = self._action(
            "Colour boxes by &gradient norm",
            lambda: self.diagram.set_grad_colouring(self.grad_colour_action.isChecked()),
            ["G"],
            "Training-step traces: blue = smallest gradient norm, red = largest (log scale)",
        )
        self.grad_colour_action.setCheckable(True)
        self.shortcuts_action = self._action("&Keyboard shortcuts", self.show_shortcuts, ["F1"])
        self.about_action = self._action("&About Scratchformer", self.show_about)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        debug = bar.addMenu("&Debug")
        view = bar.addMenu("&View")
        help_menu = bar.addMenu("&Help")
        self.menus = {"File": file_menu, "Debug": debug, "View": view, "Help": help_menu}
        file_menu.addAction(self.new_action)
        file_menu.addAction(self.open_action)
        self.recent_menu = QMenu("Open &Recent", self)
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        file_menu.addMenu(self.recent_menu)
        file_menu.addAction(self.save_action)
        file_menu.addSeparator()
        file_menu.addAction(self.report_action)
        file_menu.addAction(self.proofs_report_action)
        file_menu.addAction(self.diagram_export_action)
        file_menu.addAction(self.heatmap_export_action)
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)
        for a in (
            self.play_action,
            None,
            self.first_action,
            self.prev_action,
            self.next_action,
            self.last_action,
            None,
            self.over_action,
            self.out_action,
            self.nan_action,
        ):
            debug.addSeparator() if a is None else debug.addAction(a)
        for a in (
            self.fit_action,
            self.zoom_in_action,
            self.zoom_out_action,
            None,
            self.expand_current_action,
            self.expand_all_action,
            self.collapse_all_action,
            self.fold_action,
            None,
            self.grad_colour_action,
        ):
            view.addSeparator() if a is None else view.addAction(a)
        help_menu.addAction(self.shortcuts_action)
        help_menu.addAction(self.about_action)

    def add_menu_action(
        self,
        menu: str,
        action: QAction,
        *,
        after: QAction | None = None,
        separator: bool = False,
    ) -> QAction:
        """Put a panel's ``action`` into the ``menu`` called "File", "Debug", "View" or "Help".

        It goes right after ``after`` when that is in the menu, else at the end, where
        ``separator`` starts a new group before it. The window also owns the action, so its
        shortcut works with the menu bar hidden.
        """
        if menu not in self.menus:
            raise KeyError(f"no menu {menu!r}; the menus are {', '.join(self.menus)}")
        target = self.menus[menu]
        actions = target.actions()
        if after is not None and after in actions:
            index = actions.index(after) + 1
            target.insertAction(actions[index] if index < len(actions) else None, action)
        else:
            if separator:
                target.addSeparator()
            target.addAction(action)
        self.addAction(action)
        return action

    def add_dock(
        self,
        dock: QDockWidget,
        area: Qt.DockWidgetArea,
        toggle_text: str,
        *,
        shortcut: str = "",
        tip: str = "",
        separator: bool = False,
    ) -> QAction:
        """Add ``dock`` hidden at ``area``, with a View menu entry that shows and hides it.

        Returns that toggle action (``toggle_text``, optional ``shortcut`` and status ``tip``).
        """
        self.addDockWidget(area, dock)
        dock.hide()
        toggle = dock.toggleViewAction()
        toggle.setText(toggle_text)
        if shortcut:
            toggle.setShortcut(QKeySequence(shortcut))
        if tip:
            toggle.setStatusTip(tip)
        return self.add_menu_action("View", toggle, separator=separator)

    def _build_toolbar(self) -> None:
        tools = self.toolbar = self.addToolBar("Main")
        tools.setObjectName("mainToolbar")
        tools.setMovable(False)
        tools.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        tools.addAction(self.new_action)
        tools.addAction(self.open_action)
        tools.addAction(self.save_action)
        tools.addSeparator()
        for a in (
            self.fit_action,
            self.zoom_in_action,
            self.zoom_out_action,
            self.collapse_all_action,
            self.expand_current_action,
        ):
            tools.addAction(a)
        tools.addSeparator()
        tools.addAction(self.report_action)

    # --------------------------------------------------------------------- trace

    @property
    def trace_request(self) -> session.TraceRequest | None:
        """How the shown trace was traced from a live model (edits re-run it); None for a
        trace opened from a file or made elsewhere."""
        live = self._live
        return live[1] if live is not None and live[0] is self.trace else None

    def set_trace(
        self, trace: Trace | None, path: Path | None = None, start: int | None = None
    ) -> None:
        """Show ``trace`` (None clears) at step ``start``; by default the first step, or
        the step that raised for a partial trace (``trace.failure``)."""
        if start is None:
            start = session.failing_step(trace) if trace is not None and not trace.complete else 0
        self.step_bar.stop()
        self.source_view.set_sources(trace.sources if trace is not None else {})
        self.trace = trace
        self.trace_path = Path(path) if path is not None else None
        # a trace from a file may come from anyone: read the sources it names on request
        self.source_view.set_ask_before_reading(path is not None)
        if trace is not None:
            dialogs.warn_on_unreadable_values(self, trace)
        has_steps = trace is not None and bool(trace.steps)
        self._first_steps = session.first_steps_by_module(trace) if trace is not None else {}
        self.tree.set_trace(trace)
        self.diagram.set_trace(trace)
        self.inspector.set_trace(trace)
        self.step_bar.set_count(len(trace.steps) if trace is not None else 0)
        backward = trace.backward_start if trace is not None else None
        self.step_bar.set_phases(backward, len(trace.steps) if trace is not None else 0)
        for a in (
            self.save_action,
            self.report_action,
            self.proofs_report_action,
            self.diagram_export_action,
            self.heatmap_export_action,
        ):
            a.setEnabled(has_steps)
        self._update_title()
        self._update_summary()
        self._update_zoom_label()
        if has_steps:
            self.current = -1
            self.go_to(session.clamp_step(trace, start))
        else:
            self.current = 0
            self.source_view.show_location(None)
        self.traceChanged.emit()

    def _update_title(self) -> None:
        if self.trace is None:
            self.setWindowTitle(APP_NAME)
            return
        name = self.trace_path.name if self.trace_path else "untitled trace"
        self.setWindowTitle(f"{name} — {APP_NAME}")

    def _update_summary(self) -> None:
        trace = self.trace
        if trace is None:
            self.summary_label.setText("No trace. File ▸ New trace… or Open…, or drop a file here.")
            return
        meta = trace.meta
        model = meta.get("model_class") or (
            trace.modules[""].type if "" in trace.modules else "model"
        )
        parts = [str(model).rsplit(".", 1)[-1]]
        tokens = meta.get("tokens")
        if tokens:
            n = len(tokens[0]) if isinstance(tokens[0], (list, tuple)) else len(tokens)
            parts.append(f"{n} tokens")
        if meta.get("capture"):
            parts.append(f"capture {meta['capture']}")
        parts.append(f"{len(trace.steps)} steps")
        if not trace.complete:
            parts.append(f"⚠ partial: {trace.error}")
        self.summary_label.setText("  ·  ".join(parts))

    def _update_zoom_label(self) -> None:
        self.zoom_label.setText(f"zoom {self.diagram.zoom_level() * 100:.0f}%")

    def _zoom(self, factor: float) -> None:
        self.diagram.zoom(factor)
        self._update_zoom_label()

    # --------------------------------------------------------------------- stepping

    def go_to(self, index: int) -> None:
        """Move every pane to step ``index`` (clamped)."""
        trace = self.trace
        if trace is None or not trace.steps:
            return
        index = session.clamp_step(trace, int(index))
        if index == self.current:
            return
        self.current = index
        step = trace.steps[index]
        self.step_bar.set_position(
            index, session.status_text(trace, index), short_source(step.source), step.error
        )
        self.diagram.set_current(index)
        self.tree.select_module(step.module)
        failure = trace.failure
        if failure is not None and failure.step == index and failure.location is not None:
            self.source_view.show_location(failure.location, failed=True)  # the raising line
        else:  # the line where it went non-finite is red too
            self.source_view.show_location(step.source, failed=index in self._origins(trace))
        self.inspector.set_step(index)
        self.stepChanged.emit(index)

    def _origins(self, trace: Trace) -> set[int]:
        """The steps where the trace went non-finite (``tracing.breakpoints``' one definition),
        found once per trace, and only when some tensor of it holds a NaN or an Inf."""
        cached = getattr(self, "_origins_of", None)
        if cached is not None and cached[0] is trace:
            return cached[1]
        steps: set[int] = set()
        if any(r.stats is not None and (r.stats.nan or r.stats.inf) for r in trace.tensors):
            from tracing.breakpoints import iter_origins

            steps = {hit.step for hit in iter_origins(trace)}
        self._origins_of = (trace, steps)
        return steps

    def jump_to(self, index: int) -> None:
        """A jump (find, go to step, N, a breakpoint, a thumbnail): like :meth:`go_to`, and
        the diagram opens the boxes around the step and keeps it in view."""
        trace = self.trace
        if trace is None or not trace.steps:
            return
        index = session.clamp_step(trace, int(index))
        self.diagram.reveal(index)
        if index == self.current:
            self.diagram.set_current(index)
        self.go_to(index)

    def status_text(self) -> str:
        return self.step_bar.status.text()

    def next(self) -> None:
        self.go_to(self.current + 1)

    def prev(self) -> None:
        self.go_to(self.current - 1)

    def last(self) -> None:
        if self.trace is not None:
            self.go_to(len(self.trace.steps) - 1)

    def step_over(self) -> None:
        if self.trace is not None and self.trace.steps:
            self.go_to(session.step_over(self.trace, self.current))

    def step_out(self) -> None:
        if self.trace is not None and self.trace.steps:
            self.go_to(session.step_out(self.trace, self.current))

    def run_to_nonfinite(self) -> None:
        if self.trace is None or not self.trace.steps:
            return
        hit = session.nonfinite_origin(self.trace, self.current)
        if hit is None:
            self.statusBar().showMessage("No NaN or Inf is made after this step.", 4000)
            return
        self.jump_to(hit.step)
        where = f" · {hit.source}" if hit.source else ""
        self.statusBar().showMessage(f"⚠ {hit.label}: {hit.reason}{where}", 30000)

    def go_to_module(self, path: str) -> None:
        """Jump to the first call of the module at ``path`` (from the tree)."""
        index = self._first_steps.get(path)
        if index is None:
            self.statusBar().showMessage(f"{path or 'model'} did not run in this trace.", 4000)
            return
        self.jump_to(index)

    # --------------------------------------------------------------------- diagram

    def collapse_all(self) -> None:
        if self.trace is not None:
            self.diagram.set_expanded(s.index for s in self.trace.steps if s.parent is None)
            self.diagram.set_current(self.current)

    def expand_all(self) -> None:
        if self.trace is not None:
            self.diagram.set_expanded(s.index for s in self.trace.steps if s.kind == "module")
            self.diagram.set_current(self.current)  # and the current step stays in view

    def expand_current(self) -> None:
        """Open the collapsed box holding the current step, so the step itself shows."""
        if self.trace is None or not self.trace.steps:
            return
        step = self.trace.steps[self.current]
        target = step.parent if step.kind == "op" or step.end is None else step.index
        if target is not None:
            self.diagram.expand(target)
        self.diagram.set_current(self.current)

    # --------------------------------------------------------------------- files

    def open_path(self, path: str | Path) -> bool:
        """Open a trace file; a bad file gets a dialog and changes nothing."""
        path = Path(path)
        with long_lived():  # half a million objects: no collector passes over them
            try:
                trace = session.open_trace(path)
            except session.SessionError as e:
                problem = str(e)
            else:
                problem = None
                self.set_trace(trace, path=path)
        if problem is not None:
            dialogs.show_error(self, "Cannot open trace", problem)
            return False
        self._remember(path)
        self.statusBar().showMessage(f"Opened {path}", 4000)
        return True

    def inputs(self, *, with_trace_file: bool = True) -> list[Path]:
        """Every file the shown trace came from: its file (values are read from it as
        they are shown), and what its model source read (a model folder whole, the
        tokenizer beside a config, a checkpoint). No save or export may replace one."""
        request = self.trace_request
        files = request.source.reads() if request is not None else []
        if with_trace_file and self.trace_path is not None:
            files.append(self.trace_path)
        return files

    def may_write(self, path: str | Path, title: str, *, with_trace_file: bool = True) -> bool:
        """Whether ``path`` may be written (the command line's rule,
        ``app.commands.checks.output_file``); if not, a dialog says why."""
        from app.commands.checks import PathProblem, output_file

        try:
            output_file(path, inputs=self.inputs(with_trace_file=with_trace_file))
        except PathProblem as e:
            dialogs.show_error(self, title, str(e))
            return False
        return True

    def save_to(self, path: str | Path) -> bool:
        if self.trace is None:
            return False
        path = Path(path)
        # saving over the open trace file itself is fine: its values are read first
        if not self.may_write(path, "Cannot save trace", with_trace_file=False):
            return False
        try:
            self.trace.save(path)
        except Exception as e:
            dialogs.show_error(self, "Cannot save trace", f"Could not write {path}: {e}")
            return False
        self.trace_path = path
        self._update_title()
        self._remember(path)
        self.statusBar().showMessage(f"Saved {path}", 4000)
        return True

    def export_report(self, path: str | Path, fmt: str | None = None, proofs: bool = False) -> bool:
        """Write the shape report; ``proofs``: with each axis's proof (``report --proofs``)."""
        if self.trace is None:
            return False
        if not self.may_write(path, "Cannot export report"):
            return False
        try:
            report.write(self.trace, path, fmt, proofs=proofs)
        except Exception as e:
            dialogs.show_error(self, "Cannot export report", f"{Path(path).name}: {e}")
            return False
        self.statusBar().showMessage(f"Wrote {path}", 4000)
        return True

    def export_diagram(self, path: str | Path) -> bool:
        if not self.may_write(path, "Cannot export diagram"):
            return False
        try:
            self.diagram.export_image(path)
        except Exception as e:
            dialogs.show_error(self, "Cannot export diagram", f"{Path(path).name}: {e}")
            return False
        self.statusBar().showMessage(f"Wrote {path}", 4000)
        return True

    def export_heatmap(self, path: str | Path) -> bool:
        if not self.may_write(path, "Cannot export heatmap"):
            return False
        try:
            self.inspector.export_heatmap(path)
        except Exception as e:
            dialogs.show_error(self, "Cannot export heatmap", f"{Path(path).name}: {e}")
            return False
        self.statusBar().showMessage(f"Wrote {path}", 4000)
        return True

    # ---- the dialogs around them

    def start_dir(self) -> str:
        """Where file dialogs start: the open trace's folder, else the working folder."""
        return str(self.trace_path.parent) if self.trace_path else str(Path.cwd())

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open trace", self.start_dir(), dialogs.TRACE_FILTER
        )
        if path:
            self.open_path(path)

    def save_dialog(self) -> None:
        default = str(Path(self.start_dir()) / "trace.safetensors")
        path, _ = QFileDialog.getSaveFileName(self, "Save trace as", default, dialogs.TRACE_FILTER)
        if path:
            self.save_to(path)

    def export_report_dialog(self, proofs: bool = False) -> None:
        filters = ";;".join(REPORT_FILTERS.values())
        default = str(Path(self.start_dir()) / ("proofs.md" if proofs else "shapes.md"))
        title = "Export shape report with axis proofs" if proofs else "Export shape report"
        path, chosen = QFileDialog.getSaveFileName(self, title, default, filters)
        if not path:
            return
        fmt = next((f for f, label in REPORT_FILTERS.items() if label == chosen), None)
        if Path(path).suffix.lower().lstrip(".") in REPORT_FILTERS:
            fmt = Path(path).suffix.lower().lstrip(".")
        elif fmt is not None:
            path += f".{fmt}"
        self.export_report(path, fmt, proofs=proofs)

    def export_diagram_dialog(self) -> None:
        default = str(Path(self.start_dir()) / "diagram.png")
        path, _ = QFileDialog.getSaveFileName(
            self, "Export diagram", default, "PNG image (*.png);;SVG drawing (*.svg)"
        )
        if path:
            self.export_diagram(path)

    def export_heatmap_dialog(self) -> None:
        default = str(Path(self.start_dir()) / "heatmap.png")
        path, _ = QFileDialog.getSaveFileName(
            self, "Export heatmap", default, "PNG image (*.png);;SVG drawing (*.svg)"
        )
        if path:
            self.export_heatmap(path)

    # ---- recent files

    def recent_files(self) -> list[str]:
        value = self.settings.value("recentFiles", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _remember(self, path: Path) -> None:
        entry = str(Path(path).resolve())
        files = [f for f in self.recent_files() if f != entry]
        self.settings.setValue("recentFiles", [entry, *files][:MAX_RECENT])
        self.settings.sync()

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        files = self.recent_files()
        if not files:
            self.recent_menu.addAction("(none)").setEnabled(False)
            return
        for f in files:
            action = self.recent_menu.addAction(f)
            action.triggered.connect(lambda _checked=False, f=f: self.open_path(f))
        self.recent_menu.addSeparator()
        self.recent_menu.addAction("Clear list").triggered.connect(
            lambda: self.settings.setValue("recentFiles", [])
        )

    # ---- drag and drop

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(url.isLocalFile() for url in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        files = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        if files:
            event.acceptProposedAction()
            QTimer.singleShot(0, lambda: self.open_path(files[0]))

    # --------------------------------------------------------------------- tracing

    def new_trace_dialog(self) -> None:
        dialog = dialogs.NewTraceDialog(self, self._last_prompt or scratchformer.DEMO_PROMPT)
        if dialog.exec():
            request = dialog.request()
            self._last_prompt = request.prompt
            self.start_trace(request)

    def load_demo(self, background: bool = True) -> None:
        """Trace the bundled demo model on its prompt (what a bare ``scratchformer app`` does)."""
        request = session.TraceRequest(
            prompt=scratchformer.DEMO_PROMPT, source=session.ModelSource("demo")
        )
        if background:
            self.start_trace(request)
            return
        try:
            outcome = session.run_trace(request)
        except session.SessionError as e:
            dialogs.show_error(self, "Cannot load the demo", str(e))
            return
        self._pending_request = request
        self._on_trace_finished(outcome)

    def start_trace(self, request: session.TraceRequest) -> TraceJob | None:
        """Trace in a worker thread, with a progress dialog that can cancel it."""
        if self.job is not None:
            self.statusBar().showMessage("A trace is already running.", 4000)
            return None
        job = TraceJob(request)
        self.job = job
        self._pending_request = request
        self.last_request = request  # what File ▸ Reload and re-trace runs again
        self.progress_dialog = dialogs.cancellable_progress(
            self, "Tracing the forward pass…", "New trace", 100, job.cancel
        )
        job.progress.connect(self._on_trace_progress)
        job.finished.connect(self._on_trace_finished)
        job.failed.connect(self._on_trace_failed)
        self.statusBar().showMessage(f"Tracing with {request.source.describe()}…")
        job.start()
        return job

    def cancel_trace(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def _on_trace_progress(self, done: int, total: int) -> None:
        dialog = self.progress_dialog
        if dialog is None:
            return
        dialog.setLabelText(f"Tracing… module call {done} of {total}")
        dialog.setMaximum(max(1, total))
        dialog.setValue(min(done, total))  # may process events (the dialog is modal)

    def _on_trace_finished(self, outcome: session.TraceOutcome) -> None:
        self._close_progress()
        self.statusBar().clearMessage()  # "Tracing with …" is over, however it ended
        try:
            self._show_outcome(outcome)
        finally:
            self._end_job()

    def _show_outcome(self, outcome: session.TraceOutcome) -> None:
        if outcome.status == "cancelled":
            self.statusBar().showMessage("Tracing cancelled.", 5000)
            return
        if outcome.trace is None:
            dialogs.show_error(self, "Tracing failed", outcome.message or "No trace was recorded.")
            return
        if self._pending_request is not None:
            self._live = (outcome.trace, self._pending_request)
        self.set_trace(outcome.trace, path=None, start=outcome.start_step)
        if outcome.status == "failed":
            step = outcome.trace.steps[self.current] if outcome.trace.steps else None
            where = f" at {step_text(self.current)} ({step.label})" if step else ""
            dialogs.show_error(
                self,
                "The forward pass raised",
                f"{outcome.message}\n\nThe partial trace is shown, stopped{where}.",
            )
        else:
            self.statusBar().showMessage(f"Traced {len(outcome.trace.steps)} steps.", 5000)

    def _on_trace_failed(self, title: str, text: str) -> None:
        self._close_progress()
        self.statusBar().clearMessage()
        text, _, trace_back = text.partition("\n\nTraceback")  # the user's code failed
        try:
            dialogs.show_error(self, title, text, "Traceback" + trace_back if trace_back else "")
        finally:
            self._end_job()

    def _end_job(self) -> None:
        job, self.job = self.job, None
        if job is not None:
            job.wait()
            job.deleteLater()
        self.traceJobEnded.emit()

    def _close_progress(self) -> None:
        dialogs.close_progress(self.progress_dialog)
        self.progress_dialog = None

    # --------------------------------------------------------------------- help

    def show_shortcuts(self) -> None:
        rows = [
            ("Right / F11", "next step (into modules)"),
            ("Left / F7", "previous step"),
            ("Home / End", "first / last step"),
            ("F10 or O", "step over the current module"),
            ("Shift+F11 or U", "step out of the enclosing module"),
            ("N or F8", "run to the next step holding NaN or Inf"),
            ("Space", "play / pause"),
            ("Ctrl+F", "find a module, op, source line, tensor, shape, NaN"),
            ("Enter / F3 / Shift+F3", "jump to the match / next / previous"),
            ("Ctrl+G", "go to step: type its number, Enter"),
            ("F", "fit the diagram · wheel zooms · drag pans"),
            ("X", "expand the box holding the current step"),
            ("C / E", "collapse / expand all blocks"),
            ("R", "fold repetition (loops, identical blocks) on / off"),
            ("double-click", "expand or collapse a box, open or fold a run"),
        ]
        text = "".join(f"<tr><td><b>{k}</b>&nbsp;&nbsp;</td><td>{v}</td></tr>" for k, v in rows)
        dialogs.show_info(self, "Keyboard shortcuts", f"<table>{text}</table>")

    def show_about(self) -> None:
        dialogs.show_info(
            self,
            "About Scratchformer",
            "Scratchformer — step through one forward pass of a Transformer written from "
            "scratch: every module call and tensor op, with shapes, statistics and "
            "attention maps.",
        )

    def closeEvent(self, event: QCloseEvent) -> None:
        self.step_bar.stop()
        if self.job is not None:
            self.job.cancel()
            self.job.wait(10_000)
        super().closeEvent(event)


# --------------------------------------------------------------------------- app-wide


def install_excepthook(window: QWidget) -> None:
    """Show unexpected exceptions in a dialog instead of letting Qt abort the app."""
    busy = False

    def hook(kind, value, tb) -> None:
        nonlocal busy
        text = "".join(traceback.format_exception(kind, value, tb))
        print(text, file=sys.stderr)
        if busy or issubclass(kind, KeyboardInterrupt):
            return
        busy = True
        try:
            dialogs.show_error(
                window, "Unexpected error", f"{kind.__name__}: {value}", details=text
            )
        finally:
            busy = False

    sys.excepthook = hook
