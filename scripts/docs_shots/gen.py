"""README screenshot (gen). Under Xvfb:

xvfb-run -a .venv/bin/python scripts/docs_shots/gen.py docs/gen.png
"""

# ruff: noqa: E402
import sys

from PySide6.QtWidgets import QApplication

app = QApplication(sys.argv[:1])
from app.theme import apply_theme

apply_theme(app)
from app.core.generation_session import GenerationRequest, run_generation
from app.panels.generation import GenerationView

out = run_generation(GenerationRequest("transformer|", max_new_tokens=12))
v = GenerationView()
v.resize(1300, 520)
v.set_generation(out.generation, select=6)
v.show()
for _ in range(20):
    app.processEvents()
v.grab().save(sys.argv[1])
