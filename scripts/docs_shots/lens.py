"""README screenshot (lens). Under Xvfb:

xvfb-run -a .venv/bin/python scripts/docs_shots/lens.py docs/lens.png
"""

# ruff: noqa: E402
import sys

import torch
from PySide6.QtWidgets import QApplication

import scratchformer
import tracing

app = QApplication(sys.argv[:1])
from app.theme import apply_theme

apply_theme(app)
from app.panels.lens import LensView

m = scratchformer.demo_model()
tok = scratchformer.ByteTokenizer()
ids = torch.tensor([tok.encode(scratchformer.DEMO_PROMPT)])
tr = tracing.trace(
    m, ids, capture="values", meta={"tokens": ids[0].tolist(), "text": scratchformer.DEMO_PROMPT}
)
v = LensView()
v.resize(1300, 660)
v.set_trace(tr, m)
v.show()
for _ in range(20):
    app.processEvents()
v.grab().save(sys.argv[1])
