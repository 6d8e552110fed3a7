"""The find screenshot: Ctrl+F on the demo trace, ``B,H,T,T`` typed, Enter twice.

xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/docs_shots/find.py

Driven from the keyboard as a person would: the field it types into is the one Ctrl+F puts
the cursor in (the Find dock's own field).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "find.png"
    app = QApplication.instance() or QApplication(sys.argv[:1])
    import scratchformer
    from app.core import session
    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    apply_theme(app)
    request = session.TraceRequest(scratchformer.DEMO_PROMPT, session.ModelSource("demo"))
    trace = session.run_trace(request).trace
    with tempfile.TemporaryDirectory() as tmp:
        settings = QSettings(str(Path(tmp) / "s.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings)
        window.resize(1500, 950)
        window.show()
        window.activateWindow()
        window.set_trace(trace)
        QTest.qWait(300)
        QTest.keyClick(window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
        field = QApplication.focusWidget()
        QTest.keyClicks(field, "B,H,T,T")
        QTest.keyClick(field, Qt.Key.Key_Return)
        QTest.keyClick(field, Qt.Key.Key_Return)
        QTest.qWait(300)
        window.grab().save(str(out))
        print(f"wrote {out} ({window.status_text()}; typed into {field.objectName()})")
        window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
