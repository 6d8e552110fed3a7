"""The README's folding screenshot: a 48-layer stack and a loop, folded, stepped into.

xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/docs_shots/folding.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "folding.png"
    app = QApplication.instance() or QApplication(sys.argv[:1])
    from bench_diagram_scale import Stack

    import tracing
    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    apply_theme(app)
    torch.manual_seed(0)
    trace = tracing.trace(Stack(48), torch.randn(1, 4, 8), capture="stats")
    with tempfile.TemporaryDirectory() as tmp:
        settings = QSettings(str(Path(tmp) / "s.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings)
        window.resize(1500, 950)
        window.show()
        window.set_trace(trace)
        # step into block 30's attention: its neighbours unfold, the rest stays folded
        target = next(
            s.index for s in trace.steps if s.module == "blocks.30.attn" and s.op == "softmax"
        )
        window.go_to(target)
        window.diagram.reset_zoom()
        window.diagram.set_current(target)
        for _ in range(5):
            app.processEvents()
        window.grab().save(str(out))
        window.close()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
