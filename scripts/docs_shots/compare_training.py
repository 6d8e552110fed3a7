"""README screenshot (compare_training): two training steps of the demo, one weight nudged,
on the first divergent gradient. Under Xvfb:

xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/docs_shots/compare_training.py \
    docs/compare_training.png
"""

# ruff: noqa: E402
import sys

import torch
from PySide6.QtWidgets import QApplication

import scratchformer
import tracing

app = QApplication(sys.argv[:1])
from app.core.session import next_token_loss
from app.theme import apply_theme

apply_theme(app)
from app.windows.compare_window import CompareWindow

tok = scratchformer.ByteTokenizer()
ids = torch.tensor([tok.encode(scratchformer.DEMO_PROMPT)])
meta = {"tokens": ids[0, :-1].tolist(), "text": scratchformer.DEMO_PROMPT}


def training_step(model) -> tracing.Trace:
    """Next-token cross-entropy on the prompt, as File > New trace > Training step."""
    x, y = ids[:, :-1], ids[:, 1:]
    return tracing.trace_step(model, x, next_token_loss, targets=y, capture="values", meta=meta)


m = scratchformer.demo_model().train()
a = training_step(m)
m.zero_grad()
with torch.no_grad():
    m.get_submodule("blocks.1.feed_forward.linear2").weight[3, 11] += 0.5
b = training_step(m)
w = CompareWindow(a, b, "step.trace", "step-nudged.trace")
w.resize(1600, 1000)
w.show()
for _ in range(20):
    app.processEvents()
w.first_backward_button.click()  # G
for _ in range(30):
    app.processEvents()
w.grab().save(sys.argv[1])
print(w.step_bar.status.text())
