"""docs/nan_origin.png: the nanoGPT example's NaN step, one press of N.

    scratchformer train --model examples/nanogpt_nan/model.py:GPT \\
        --data examples/nanogpt_nan/data.py:get_batch --lr 1e14 --steps 20 \\
        --trace-on-nonfinite -o /tmp/bad.sft
    xvfb-run -a -s "-screen 0 1600x1000x24" \\
        .venv/bin/python scripts/docs_shots/nan_origin.py /tmp/bad.sft
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    trace_path = sys.argv[1]
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "nan_origin.png"
    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    apply_theme(app)
    window = MainWindow(settings=QSettings("/tmp/nan_shot.ini", QSettings.Format.IniFormat))
    window.resize(1600, 1000)
    window.show()
    assert window.open_path(trace_path)
    window.go_to(0)
    window.nan_action.trigger()  # N, once

    def shoot() -> None:
        window.grab().save(str(out))
        print(f"wrote {out} ({window.status_text()})")
        app.quit()

    QTimer.singleShot(800, shoot)
    return app.exec()


if __name__ == "__main__":
    raise SystemExit(main())
