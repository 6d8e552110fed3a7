"""README screenshots (Debug your own model): the tutorial's classes traced as a user would,
first failing (it forgets ``import torch.nn.functional as F``), then fixed. Under Xvfb:

xvfb-run -a .venv/bin/python scripts/docs_shots/own_model.py docs/own_model_failure.png \
    docs/own_model_attention.png docs/own_model_weights.png
"""

# ruff: noqa: E402
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[2]
app = QApplication(sys.argv[:1])
from app.core import session
from app.theme import apply_theme
from app.windows import dialogs

apply_theme(app)
dialogs.show_error = lambda *a, **k: None  # the shot shows the window, not the message box
from app.windows.main_window import MainWindow

folder = Path(tempfile.mkdtemp())
mine = folder / "tutorial.py"  # the user's copy of the tutorial's classes
shutil.copy(ROOT / "tests" / "models" / "tutorial.py", mine)
settings = QSettings(str(folder / "shots.ini"), QSettings.Format.IniFormat)
window = MainWindow(settings=settings)
window.resize(1600, 960)
window.show()


def settle(n: int = 30) -> None:
    for _ in range(n):
        app.processEvents()


def trace_it(prompt: str) -> None:
    torch.manual_seed(0)  # the same random weights on every run of this script
    source = session.ModelSource("file", model=f"{mine}:TutorialLM")
    outcome = session.run_trace(session.TraceRequest(prompt, source, capture="values"))
    window._show_outcome(outcome)
    settle()


# 1. the tutorial as written: the partial trace opens on the failing step
trace_it("the cat sat")
window.diagram.expand(window.trace.module_steps("blocks.0")[0].index)
settle()
window.grab().save(sys.argv[1])

# 2. the one-line fix, then the masked scores and the attention map
text = mine.read_text().replace("import math\n", "import math\nimport torch.nn.functional as F\n")
mine.write_text(text)
trace_it("the cat sat")
scores = next(s.index for s in window.trace.steps if s.op == "masked_fill")
window.go_to(scores)
window.inspector.tabs.setCurrentIndex(0)
settle()
window.grab().save(sys.argv[2])

# 3. (optional third path) the attention weights of the fixed model, Attention tab
if len(sys.argv) > 3:
    softmax = next(s.index for s in window.trace.steps if s.op == "softmax")
    window.go_to(softmax)
    window.inspector.tabs.setCurrentIndex(window.inspector.ATTENTION_TAB)
    settle()
    window.grab().save(sys.argv[3])
