"""Screenshots of an axis named as the slice its line writes: Kimi-Linear's delta rule
(transformers' own ``chunk_kimi_delta_attention``, a chunk of 8, random inputs:
``tests/tracing/capture/test_dims_slices.py``) on ``sub = attn[..., :i, :i]`` at i = 5,
``(B, H, ?, Q[:i], Q[:i])``.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/docs_shots/slice_dims.py [OUT_DIR]

Writes ``slice_dims.png`` (the window) and ``slice_dims_hover.png`` (the hover text of the
output's dims cell) to ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "tracing" / "capture")]


def main() -> int:
    from dims_hover import save_dims_hover, spin
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from test_dims_slices import _trace

    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    apply_theme(app)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"
    _, _, trace = _trace()
    w = MainWindow(settings=QSettings(str(out / ".shot.ini"), QSettings.Format.IniFormat))
    w.resize(1600, 1000)
    w.set_trace(trace)
    step = next(
        s.index
        for s in trace.steps
        if s.op == "getitem"
        and s.source is not None
        and "..., :i, :i]" in s.source.text
        and trace.tensors[s.outputs[0]].shape[-1] == 5
    )
    w.go_to(step)
    w.diagram.reveal(step)
    w.show()

    spin(app)
    w.grab().save(str(out / "slice_dims.png"))
    save_dims_hover(app, w, out / "slice_dims_hover.png")
    (out / ".shot.ini").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
