"""README screenshot (compare). Under Xvfb:

xvfb-run -a .venv/bin/python scripts/docs_shots/compare.py docs/compare.png
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
from app.windows.compare_window import CompareWindow

tok = scratchformer.ByteTokenizer()
ids = torch.tensor([tok.encode(scratchformer.DEMO_PROMPT)])
meta = {"tokens": ids[0].tolist(), "text": scratchformer.DEMO_PROMPT}
m = scratchformer.demo_model()
a = tracing.trace(m, ids, capture="values", meta=meta)
with torch.no_grad():
    m.get_submodule("blocks.1.feed_forward.linear1").weight[5, 7] += 0.5
b = tracing.trace(m, ids, capture="values", meta=meta)
w = CompareWindow(a, b, "demo.trace", "demo-edited.trace")
w.resize(1600, 940)
w.show()
for _ in range(10):
    app.processEvents()
blk = a.module_steps("blocks.1")[0].index
w.diagram_a.expand(blk)
ff = a.module_steps("blocks.1.feed_forward")[0].index
w.diagram_a.expand(ff)
w.go_to_first_divergence()
import os

if os.environ.get("LATER"):
    w.go_to_step(
        "a",
        next(
            s.index
            for s in a.steps
            if s.module == "blocks.1.feed_forward.linear2" and s.kind == "op"
        ),
    )
for _ in range(30):
    app.processEvents()
w.grab().save(sys.argv[1])
