"""The in-process viewer of ``tracing.show(model, x)``: the app in the caller's process,
on the caller's own model object, returning when the window closes (as
``matplotlib.pyplot.show()`` does). Edits, Mean-ablate and re-trace then run on that very
object, with the same inputs.

``tracing`` never imports Qt or ``app``: it finds this function at call time, through the
``scratchformer.viewers`` entry point (an installed package) or :func:`tracing.show_app.
register_viewer` (importing this module registers it).
"""

from __future__ import annotations

import sys
from typing import Any


def can_run_here() -> str | None:
    """Why a Qt window cannot run in this process now, or None when it can."""
    import os

    try:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None  # type: ignore[attr-defined]
    except Exception:
        shell = None
    if shell is not None and "ipykernel" in sys.modules:
        hook = getattr(shell, "active_eventloop", None)
        if hook not in ("qt", "qt5", "qt6"):
            return "a notebook kernel without a Qt event loop (run %gui qt first)"
    headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if sys.platform.startswith("linux") and headless and not platform:
        return "no display (DISPLAY is not set)"
    from app.core.qt_platform import platform_problem

    return platform_problem()  # a system library Qt's xcb plugin needs is missing


def show_live(model: Any, args: tuple, kwargs: dict, trace_kwargs: dict) -> Any:
    """Trace ``model`` on ``args``/``kwargs`` in a main window of this process; block until
    it closes; return the window's last trace (an edited run's too)."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.commands.app import _quit_after
    from app.core.session import ModelSource, TraceRequest
    from app.core.user_model import LoadedModel
    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    qt_app = QApplication.instance() or QApplication(sys.argv[:1] or ["scratchformer"])
    apply_theme(qt_app)
    meta = dict(trace_kwargs.get("meta") or {})
    meta.setdefault("shown_by", "tracing.show (live)")
    live = LoadedModel(model, tuple(args), dict(kwargs), meta)
    source = ModelSource("live", live=live)
    request = TraceRequest(
        prompt=str(meta.get("text") or ""),
        source=source,
        capture=trace_kwargs.get("capture", "values"),
    )
    window = MainWindow()
    window.show()
    _quit_after(qt_app, window)
    QTimer.singleShot(0, lambda: window.start_trace(request))
    from PySide6.QtCore import QEvent, QEventLoop, QObject

    loop = QEventLoop()  # runs whether or not the application's own loop does (%gui qt)

    class _OnClose(QObject):
        def eventFilter(self, watched, event) -> bool:
            if event.type() == QEvent.Type.Close:
                QTimer.singleShot(0, loop.quit)  # once the close itself is done
            return False

    on_close = _OnClose(window)
    window.installEventFilter(on_close)
    loop.exec()
    return window.trace


def _register() -> None:
    from tracing.show_app import register_viewer

    register_viewer(show_live, can_run_here)


_register()
