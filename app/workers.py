"""Tracing off the GUI thread.

:class:`TraceJob` runs :func:`app.core.session.run_trace` in a ``QThread`` and reports through
signals (queued to the GUI thread): ``progress(done, total)`` for every module call,
``finished(TraceOutcome)`` at the end (complete, failed with a partial trace, or
cancelled), ``failed(title, text)`` when the request itself is bad (a checkpoint that does
not load, a prompt too long). :meth:`TraceJob.cancel` sets a flag that the session's
forward pre-hook turns into a ``Cancelled`` exception at the next module boundary.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from app.core.generation_session import GenerationRequest, run_generation
from app.core.session import SessionError, TraceRequest, run_trace
from app.windows import dialogs


class BackgroundJob(QObject):
    """Run ``work(request, progress=..., cancel=...)`` in its own thread, started by
    :meth:`start`; a bad request (``SessionError``) or any other exception becomes
    ``failed(title, text)``, never a dead app."""

    progress = Signal(int, int)
    finished = Signal(object)  # what ``work`` returned
    failed = Signal(str, str)  # title, text
    done = Signal()  # after finished or failed, once the thread has stopped

    thread_name = "worker"
    refused_title = "Cannot run"  # the request itself is bad
    failed_title = "Failed"  # it raised

    def __init__(
        self,
        request: Any,
        work: Callable[..., Any],
        *,
        refused_title: str | None = None,
        failed_title: str | None = None,
    ):
        super().__init__()
        if refused_title is not None:
            self.refused_title = refused_title
        if failed_title is not None:
            self.failed_title = failed_title
        self.request = request
        self._work = work
        self.cancel_flag = threading.Event()
        self.thread = QThread()
        self.thread.setObjectName(self.thread_name)
        self.moveToThread(self.thread)
        self.thread.started.connect(self._run)
        self.thread.finished.connect(self.done)

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        self.cancel_flag.set()

    def wait(self, ms: int = 30_000) -> bool:
        return self.thread.wait(ms)

    @Slot()
    def _run(self) -> None:
        try:
            outcome = self._work(self.request, progress=self.progress.emit, cancel=self.cancel_flag)
            self.finished.emit(outcome)
        except SessionError as e:
            self.failed.emit(self.refused_title, str(e))
        except Exception as e:  # never let a worker take the app down
            self.failed.emit(
                self.failed_title,
                f"{type(e).__name__}: {e}\n\n" + "".join(traceback.format_exception(e)[-6:]),
            )
        finally:
            self.thread.quit()


class TraceJob(BackgroundJob):
    """One trace request (:func:`app.core.session.run_trace`); ``finished`` carries a
    ``TraceOutcome``."""

    thread_name = "trace-worker"
    refused_title = "Cannot trace"
    failed_title = "Tracing failed"

    def __init__(self, request: TraceRequest):
        super().__init__(request, run_trace)


class GenerationJob(BackgroundJob):
    """One generation request (:func:`run_generation`) run off the GUI thread;
    ``finished`` carries a ``GenerationOutcome``."""

    thread_name = "generation-worker"
    refused_title = "Cannot trace the generation"
    failed_title = "Tracing the generation failed"

    def __init__(self, request: GenerationRequest):
        super().__init__(request, run_generation)

    def wait(self, ms: int = 60_000) -> bool:
        return super().wait(ms)


class JobWithProgress(QObject):
    """Run a :class:`BackgroundJob` behind a cancellable progress dialog over ``parent``:
    ``on_result(value)`` when it finishes, ``on_error(title, text)`` when it fails.

    The dialog is modal, so updating it processes events, and the job's end may arrive
    inside that update: the end is then handled once the update has returned, so the
    dialog is never taken down under its own feet.
    """

    def __init__(
        self,
        parent,
        job: BackgroundJob,
        label: str,
        title: str,
        on_result: Callable[[Any], None],
        on_error: Callable[[str, str], None],
        describe: Callable[[int, int], str] | None = None,
    ):
        super().__init__(parent)
        self.job = job
        self._on_result, self._on_error, self._describe = on_result, on_error, describe
        self._updating = False
        self.dialog = dialogs.cancellable_progress(parent, label, title, 100, job.cancel)
        # bound slots of an object of the GUI thread: queued there (a lambda would run in
        # the worker's thread)
        job.progress.connect(self._progress)
        job.finished.connect(self._finished)
        job.failed.connect(self._failed)
        job.start()

    def running(self) -> bool:
        return self.dialog is not None

    @Slot(int, int)
    def _progress(self, done: int, total: int) -> None:
        dialog = self.dialog
        if dialog is None or self._updating:
            return
        self._updating = True
        try:
            if self._describe is not None:
                dialog.setLabelText(self._describe(done, total))
            dialog.setMaximum(max(1, total))
            dialog.setValue(min(done, total))  # may process events (the dialog is modal)
        finally:
            self._updating = False

    @Slot(object)
    def _finished(self, value) -> None:
        self._end(self._on_result, value)

    @Slot(str, str)
    def _failed(self, title: str, text: str) -> None:
        self._end(self._on_error, title, text)

    def _end(self, callback, *args) -> None:
        if self._updating:  # inside the dialog's own update: finish once it returned
            QTimer.singleShot(0, lambda: self._end(callback, *args))
            return
        dialogs.close_progress(self.dialog)
        self.dialog = None
        self.job.wait()
        self.job.deleteLater()
        callback(*args)
