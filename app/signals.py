"""SIGTERM and Ctrl-C end the desktop app, as they end other Qt apps.

Python runs a signal handler only when the interpreter gets control back, and while Qt's
event loop idles it never does: a handler alone would wait for the next mouse move. So,
as Qt's own docs advise for Unix signals, the signal is turned into an event: Python's C
handler writes the signal's number to a *wakeup fd* (``signal.set_wakeup_fd``), one end
of a socket pair; a ``QSocketNotifier`` on the other end wakes the event loop, and its
slot closes every window (each ``closeEvent`` runs: playback stops, a running trace is
cancelled and waited for) and ends the loop with the status a shell expects (128 + the
signal: 143 for SIGTERM, 130 for Ctrl-C).

    ending = end_on_signals(qt_app)   # before qt_app.exec()
    code = qt_app.exec()
    ending.restore()                  # the handlers as they were
    ending.signal                     # the signal that ended it, or None

Once the windows are closed, what is left is the interpreter's own teardown (Qt's and
torch's objects, seconds on a busy machine): the command skips it after a signal
(``app.commands.app``), as a Qt app written in C++ would never pay it.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable

from PySide6.QtCore import QSocketNotifier
from PySide6.QtWidgets import QApplication

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Ending:
    """What :func:`end_on_signals` set up: ``restore()`` puts the previous handlers back;
    ``signal`` is the signal that ended the event loop (None while none has)."""

    def __init__(self, restore: Callable[[], None] = lambda: None):
        self.restore = restore
        self.signal: int | None = None


def end_on_signals(qt_app: QApplication) -> Ending:
    """Make SIGTERM and SIGINT close ``qt_app``'s windows and end its event loop (call
    ``restore()`` on what it returns after ``exec``). Only the main thread may set
    signal handlers: elsewhere, nothing changes."""
    ending = Ending()
    if threading.current_thread() is not threading.main_thread():
        return ending
    receive, send = socket.socketpair()
    receive.setblocking(False)
    send.setblocking(False)
    previous_fd = signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
    # a Python handler must be set for the C handler to write to the wakeup fd; the work
    # itself is done by the notifier's slot, in the event loop, not at a random bytecode
    previous = {signum: signal.signal(signum, _noted) for signum in SIGNALS}
    notifier = QSocketNotifier(receive.fileno(), QSocketNotifier.Type.Read, qt_app)

    def on_wakeup() -> None:
        try:
            got = receive.recv(64)
        except OSError:  # nothing there after all
            return
        numbers = [n for n in got if n in SIGNALS]
        if numbers and ending.signal is None:
            ending.signal = numbers[0]
            _close_everything(qt_app, 128 + numbers[0])

    notifier.activated.connect(on_wakeup)

    def restore() -> None:
        notifier.setEnabled(False)
        signal.set_wakeup_fd(previous_fd)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        receive.close()
        send.close()

    ending.restore = restore
    return ending


def _noted(signum, frame) -> None:
    """The Python-level handler: nothing to do here (the wakeup fd carries the signal)."""


def _close_everything(qt_app: QApplication, code: int) -> None:
    """Close open dialogs, then every window, then end the event loop with ``code``."""
    while (modal := qt_app.activeModalWidget()) is not None:
        modal.close()
        qt_app.processEvents()
        if qt_app.activeModalWidget() is modal:  # it refused: the exit below ends it
            break
    qt_app.closeAllWindows()
    qt_app.exit(code)
