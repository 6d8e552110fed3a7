"""README screenshot (training_step): the NaN-loss example, found with one key (N).

QT_QPA_PLATFORM=offscreen python scripts/docs_shots/training_step.py docs/training_step.png
"""

# ruff: noqa: E402
import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
app = QApplication(sys.argv[:1])
from nan_loss import main as train_until_nan

from app.theme import apply_theme
from app.windows.main_window import MainWindow

apply_theme(app)
folder = tempfile.mkdtemp()
trace = train_until_nan(f"{folder}/nan_step.trace")
w = MainWindow(QSettings(f"{folder}/s.ini", QSettings.Format.IniFormat))
w.resize(1600, 1000)
w.show()
w.open_path(f"{folder}/nan_step.trace")
w.grad_colour_action.trigger()
w.inspector.tabs.setCurrentIndex(w.inspector.GRADIENT_TAB)
w.nan_action.trigger()  # the one key: N
for _ in range(30):
    app.processEvents()
w.grab().save(sys.argv[1])
print(w.status_text())
