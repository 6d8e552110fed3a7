"""Screenshots of a GQA model's dims: a tiny Llama (6 heads, 2 key/value heads, random
weights, ``tests/helpers/dims_models.py``) on its ``repeat_kv`` expand, ``(B, KV, H/KV, T, D)``.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/docs_shots/gqa_dims.py [OUT_DIR]

Writes ``gqa_dims.png`` (the window with the Dims legend open), ``gqa_dims_legend.png`` (the
legend) and ``gqa_dims_hover.png`` (the hover text of the dims cell) to ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> int:
    from dims_hover import save_dims_hover, spin
    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from helpers.dims_models import build

    import tracing
    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    apply_theme(app)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"
    model, ids = build("llama")
    trace = tracing.trace(model, ids)
    w = MainWindow(settings=QSettings(str(out / ".shot.ini"), QSettings.Format.IniFormat))
    w.resize(1600, 1000)
    w.set_trace(trace)
    step = next(s.index for s in trace.steps if s.op == "expand" and "self_attn" in s.module)
    w.go_to(step)
    w.diagram.reveal(step)
    w.show()
    w.dims_dock.show()
    legend = w.dims_dock.legend
    w.resizeDocks([w.dims_dock], [legend.height_for_rows() + 30], Qt.Orientation.Vertical)

    spin(app)
    w.grab().save(str(out / "gqa_dims.png"))
    w.dims_dock.grab().save(str(out / "gqa_dims_legend.png"))
    save_dims_hover(app, w, out / "gqa_dims_hover.png")
    (out / ".shot.ini").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
