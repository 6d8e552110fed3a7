"""Guard against a Qt binding that corrupts the interpreter.

PySide6 6.12.0 on Python < 3.12 drops one reference to ``None`` on every call of a void
C++ method (``QPainter.setPen``, ``drawLine``...). After a few thousand paints Python
aborts with "none_dealloc: deallocating None" — the whole app dies. pyproject excludes
that release; this test catches any binding with the same leak.
"""

from __future__ import annotations

import sys

from PySide6.QtGui import QColor, QImage, QPainter, QPen


def test_void_qt_calls_do_not_leak_references_to_none() -> None:
    image = QImage(8, 8, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    pen = QPen(QColor(10, 20, 30))
    calls = 2000  # well below the ~50k references None starts with
    try:
        before = sys.getrefcount(None)
        for _ in range(calls):
            painter.setPen(pen)
            painter.drawLine(0, 0, 4, 4)
        after = sys.getrefcount(None)
    finally:
        painter.end()
    # immortal None (3.12+) reports a constant; a leaking binding loses ~2 per iteration
    assert after - before > -calls // 2
