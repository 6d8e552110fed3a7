"""What the dims screenshots share: letting the window paint, and the hover text of the
inspector's output dims cell saved as an image (``gqa_dims.py``, ``slice_dims.py``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path


def spin(app, rounds: int = 10) -> None:
    """Let queued paints and layouts run (offscreen, nothing else drives the event loop)."""
    for _ in range(rounds):
        app.processEvents()
        time.sleep(0.05)


def save_dims_hover(app, window, path: Path) -> bool:
    """Show the tooltip of the current step's first output dims cell and save it to
    ``path``; ``False`` when no tooltip appeared."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QToolTip

    from app.widgets.shape_table import ShapeTableModel

    table, cells = window.inspector.table, window.inspector.table_model
    row = next(r for r in range(cells.rowCount()) if cells.direction(r) == "out")
    index = cells.index(row, ShapeTableModel.DIMS)
    where = table.viewport().mapToGlobal(table.visualRect(index).center())
    QToolTip.showText(where, cells.data(index, Qt.ItemDataRole.ToolTipRole), table.viewport())
    spin(app)
    tips = [x for x in app.topLevelWidgets() if x.metaObject().className() == "QTipLabel"]
    if tips:
        tips[0].grab().save(str(path))
    return bool(tips)


def save_step_shots(app, trace, step: int, out: Path, stem: str) -> bool:
    """The main window on ``trace`` at ``step`` (its box revealed), saved as ``stem.png``,
    and the hover of its output dims as ``stem_hover.png``."""
    from PySide6.QtCore import QSettings

    from app.windows.main_window import MainWindow

    settings = out / ".shot.ini"
    w = MainWindow(settings=QSettings(str(settings), QSettings.Format.IniFormat))
    w.resize(1600, 1000)
    w.set_trace(trace)
    w.go_to(step)
    w.diagram.reveal(step)
    w.show()
    spin(app)
    w.grab().save(str(out / f"{stem}.png"))
    shown = save_dims_hover(app, w, out / f"{stem}_hover.png")
    settings.unlink(missing_ok=True)
    return shown


def shoot(trace, step: int, stem: str) -> int:
    """The ``main`` of a dims screenshot script: ``save_step_shots`` of ``trace`` at
    ``step`` as ``stem``, in the themed app, into the folder the command line names (else
    ``docs/``)."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.theme import apply_theme

    apply_theme(app)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "docs"
    save_step_shots(app, trace, step, out, stem)
    return 0
