"""README screenshot (bp_main). Under Xvfb:

xvfb-run -a .venv/bin/python scripts/docs_shots/bp_main.py docs/bp_main.png
"""

# ruff: noqa: E402
import sys

import torch
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

import scratchformer
import tracing

app = QApplication(sys.argv[:1])
from app.theme import apply_theme
from app.windows.main_window import MainWindow

apply_theme(app)
m = scratchformer.demo_model()
tok = scratchformer.ByteTokenizer()
with torch.no_grad():
    m.get_submodule("blocks.1.feed_forward.linear1").weight[3, :] = 1e38
ids = torch.tensor([tok.encode(scratchformer.DEMO_PROMPT)])
tr = tracing.trace(
    m, ids, capture="values", meta={"tokens": ids[0].tolist(), "text": scratchformer.DEMO_PROMPT}
)
w = MainWindow(
    QSettings(str(__import__("tempfile").mkdtemp()) + "/s.ini", QSettings.Format.IniFormat)
)
w.resize(1600, 1000)
w.show()
w.set_trace(tr)
p = w.breakpoints_dock.panel
w.go_to(tr.module_steps("blocks.1.self_attn")[0].index)
p.add_current_module()
p.add_nonfinite()
p.add_abs_above(1000)
p.add_entropy_below(0.05)
p.add_op("softmax")
p.set_enabled(0, False)
p.set_enabled(4, False)
w.go_to(85)
w.breakpoints_dock.run_action.trigger()
w.expand_current()
for _ in range(30):
    app.processEvents()
w.grab().save(sys.argv[1])
