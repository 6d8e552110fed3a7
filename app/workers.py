"""Tracing off the GUI thread.

:class:`TraceJob` runs :func:`app.session.run_trace` in a ``QThread`` and reports through
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

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.generation_session import GenerationRequest, run_generation
from app.session import SessionError, TraceRequest, run_trace


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

    def __init__(self, request: Any, work: Callable[..., Any]):
        super().__init__()
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
    """One trace request (:func:`app.session.run_trace`); ``finished`` carries a
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
