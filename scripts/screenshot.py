"""Take the README screenshot: the demo trace, stepped into an attention step.

Run under Xvfb so the window is real (fonts, style, compositing)::

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/screenshot.py

Writes ``docs/screenshot.png`` (or the path given as the first argument).
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshot.png"
    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    apply_theme(app)
    if not QFontMetrics(app.font()).inFont("A"):
        print("warning: the application font has no glyph for 'A'", file=sys.stderr)
    settings = QSettings(str(out.with_suffix(".ini")), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    window.resize(1500, 950)
    window.show()
    import scratchformer
    from app.core import session

    request = session.TraceRequest(scratchformer.DEMO_PROMPT, session.ModelSource("demo"))
    try:
        outcome = session.run_trace(request)
    except session.SessionError as e:  # no trained demo yet: the same model, random weights
        print(f"warning: {e}; using the demo preset with random weights", file=sys.stderr)
        request.source = session.ModelSource("preset", preset="demo")
        outcome = session.run_trace(request)
    window.set_trace(outcome.trace)
    trace = window.trace
    # an attention step: the softmax inside the last block's attention, opened in the diagram
    attention = [
        s.index
        for s in trace.steps
        if s.kind == "op" and s.op == "softmax" and "attn" in s.module.lower()
    ] or [s.index for s in trace.steps if "attention" in s.op.lower()]
    target = attention[-1] if attention else len(trace.steps) // 2
    window.go_to(target)
    window.expand_current()
    window.go_to(target)

    def shoot() -> None:
        window.diagram.set_current(target)
        # head 2 of the last layer draws the reversal's anti-diagonal (the demo's story)
        window.inspector.tensor_view.set_leading_index((0, 2))
        item = window.diagram.items_by_key.get(window.diagram.highlighted_key)
        if item is not None:
            window.diagram.centerOn(item)
        app.processEvents()
        window.grab().save(str(out))
        settings_file = Path(settings.fileName())
        settings_file.unlink(missing_ok=True)
        print(f"wrote {out} ({window.status_text()})")
        app.quit()

    QTimer.singleShot(800, shoot)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
