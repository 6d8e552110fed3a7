"""Edit, re-trace, look: File ▸ Reload and re-trace (Ctrl+R), Compare with previous trace,
and Re-trace when the model file is saved.

A re-trace re-imports the user's file (``app.core.user_model``: never the cached module), traces
with the same inputs and capture level, and lands on the step the window was on when that
step still exists: the same module path, op and occurrence (:func:`step_key`). The trace it
replaces is kept, so comparing the two is one click. Watching uses a
``QFileSystemWatcher`` on the model file (re-armed after editors that save by replacing
the file) with a short delay, so one save is one re-trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer
from PySide6.QtGui import QAction, QKeySequence

from app.core import session

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace

WATCH_DELAY_MS = 300
"""Wait this long after a change before re-tracing (editors write a file in bursts)."""


def step_key(trace: Trace, index: int) -> tuple[str, str, str, int]:
    """``(kind, module, op, occurrence)``: which step this is, stable across re-traces of
    an edited model as long as the code before it calls the same things."""
    step = trace.steps[index]
    n = sum(
        1
        for s in trace.steps[:index]
        if s.kind == step.kind and s.module == step.module and s.op == step.op
    )
    return step.kind, step.module, step.op, n


def find_step(trace: Trace, key: tuple[str, str, str, int]) -> int | None:
    """The index of the step with ``key`` in ``trace``, or None when it is gone."""
    kind, module, op, occurrence = key
    n = 0
    for s in trace.steps:
        if s.kind == kind and s.module == module and s.op == op:
            if n == occurrence:
                return s.index
            n += 1
    return None


def request_for(trace: Trace) -> session.TraceRequest | None:
    """The request that traces the same model file with the same inputs again (from the
    trace's meta), or None for a trace that did not come from a model file."""
    meta = trace.meta
    file, name = meta.get("model_file"), meta.get("model_name")
    model = f"{file}:{name}" if file and name else meta.get("model_path")
    if not model or not isinstance(model, str):
        return None
    spec = meta.get("input_spec") or {}
    shape = spec.get("shape")
    source = session.ModelSource(
        "file",
        model=model,
        device=str(meta.get("device") or "cpu"),
        tokenizer=str(meta.get("tokenizer") or ""),
        input_shape=",".join(str(s) for s in shape) if shape else "",
        input_dtype=spec.get("dtype") or "long",
    )
    return session.TraceRequest(
        prompt=spec.get("prompt") or "", source=source, capture=meta.get("capture") or "values"
    )


class Retrace(QObject):
    """The re-trace actions of one main window."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.previous: Trace | None = None  # the trace the last re-trace replaced
        self._landing: tuple | None = None  # step key to land on when the new trace comes
        self._outgoing: Trace | None = None  # the trace on show when a re-trace started
        self._watched: str | None = None
        self.watcher = QFileSystemWatcher(self)
        self.watcher.fileChanged.connect(self._on_file_changed)
        self._delay = QTimer(self)
        self._delay.setSingleShot(True)
        self._delay.setInterval(WATCH_DELAY_MS)
        self._delay.timeout.connect(self.reload)

        self.reload_action = QAction("&Reload and re-trace", window)
        self.reload_action.setShortcut(QKeySequence("Ctrl+R"))
        self.reload_action.setStatusTip(
            "Import the model file again and trace it with the same inputs and capture"
        )
        self.reload_action.triggered.connect(lambda _checked=False: self.reload())
        self.compare_action = QAction("Compare with &previous trace", window)
        self.compare_action.setShortcut(QKeySequence("Ctrl+Shift+R"))
        self.compare_action.setStatusTip("This trace against the one the last re-trace replaced")
        self.compare_action.triggered.connect(lambda _checked=False: self.compare_previous())
        self.watch_action = QAction("Re-trace when the model file is &saved", window)
        self.watch_action.setCheckable(True)
        self.watch_action.toggled.connect(lambda _on: self._update_watch())
        window.add_menu_action("File", self.reload_action, after=window.new_action)
        window.add_menu_action("File", self.watch_action, after=self.reload_action)
        window.add_menu_action("File", self.compare_action, after=self.watch_action)
        window.traceChanged.connect(self._on_trace_changed)
        self._on_trace_changed()

    # ---- what can be re-traced

    def request(self) -> session.TraceRequest | None:
        trace = self.window.trace
        found = request_for(trace) if trace is not None else None
        return found or getattr(self.window, "last_request", None)

    def model_file(self) -> str | None:
        request = self.request()
        if request is None or request.source.kind != "file":
            return None
        return request.source.model.rpartition(":")[0] or None

    # ---- actions

    def reload(self) -> bool:
        """Re-import and re-trace; False (with a status message) when there is nothing to
        re-trace or a trace is already running."""
        request = self.request()
        if request is None:
            self.window.statusBar().showMessage("Nothing to re-trace: trace a model first.", 4000)
            return False
        trace = self.window.trace
        if trace is not None and trace.steps:
            self._landing = step_key(trace, self.window.current)
        job = self.window.start_trace(request)
        if job is None:
            self._landing = None
            return False
        self._outgoing = trace
        return True

    def compare_previous(self):
        trace = self.window.trace
        if self.previous is None or trace is None:
            self.window.statusBar().showMessage("No previous trace: re-trace first (Ctrl+R).", 4000)
            return None
        return self.window.compare.show_pair(self.previous, trace, "previous", "re-traced")

    # ---- reacting

    def _on_trace_changed(self) -> None:
        trace = self.window.trace
        outgoing = self._outgoing
        if outgoing is not None and trace is not outgoing:
            self.previous = outgoing
            self._outgoing = None
            if self._landing is not None and trace is not None:
                index = find_step(trace, self._landing)
                if index is not None:
                    self.window.go_to(index)
            self._landing = None
        can = self.request() is not None
        self.reload_action.setEnabled(can)
        self.watch_action.setEnabled(self.model_file() is not None)
        self.compare_action.setEnabled(self.previous is not None and trace is not None)
        self._update_watch()

    def _update_watch(self) -> None:
        file = self.model_file() if self.watch_action.isChecked() else None
        if file == self._watched and (file is None or file in self.watcher.files()):
            return
        if self.watcher.files():
            self.watcher.removePaths(self.watcher.files())
        self._watched = file
        if file and Path(file).is_file():
            self.watcher.addPath(file)

    def _on_file_changed(self, path: str) -> None:
        if Path(path).is_file() and path not in self.watcher.files():
            self.watcher.addPath(path)  # saved by replacing the file: watch the new one
        self._delay.start()


def attach(window) -> Retrace:
    """Add the re-trace entries to the File menu of ``window``."""
    return Retrace(window)


__all__ = ["Retrace", "attach", "find_step", "request_for", "step_key"]
