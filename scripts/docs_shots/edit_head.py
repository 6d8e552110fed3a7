"""README screenshot (edits): zero the head that draws the demo's reversal diagonal.

xvfb-run -a -s "-screen 0 1700x1000x24" .venv/bin/python scripts/docs_shots/edit_head.py \
    docs/edit_head.png

The main window traces the demo model on ``wordplay|yalp`` (it should continue with ``d``);
the head menu of layer 1, head 2 in the attention grid zeroes that head, and the compare
view opens on the first divergent step with the prediction before and after.
"""

# ruff: noqa: E402
import sys

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

app = QApplication(sys.argv[:1])
from app.theme import apply_theme

apply_theme(app)
from app.core import edit_session, session
from app.windows.main_window import MainWindow

out = sys.argv[1]
window = MainWindow(settings=QSettings("/tmp/edit_head_shot.ini", QSettings.Format.IniFormat))
window.resize(1500, 950)
window.show()
request = session.TraceRequest("wordplay|yalp", session.ModelSource("demo"))
window._pending_request = request
window._on_trace_finished(session.run_trace(request))
map_step = window.inspector.attention.step_for_layer(1)
menu = window.edits.head_menu(map_step, 2)  # what a right-click on the thumbnail shows
if len(sys.argv) > 2:  # also the menu, over the window
    menu.popup(window.mapToGlobal(window.rect().center()))
    for _ in range(20):
        app.processEvents()
    menu.grab().save(sys.argv[2])
    menu.close()
make = lambda action: edit_session.edit_for_head(window.trace, map_step, 2, action)  # noqa: E731
window.edits.apply("zero", make, background=False)
compare = window.edits.last_compare
compare.resize(1700, 960)
for _ in range(10):
    app.processEvents()
trace = compare.trace_a
compare.diagram_a.expand(trace.module_steps("blocks.1")[0].index)
compare.diagram_a.expand(trace.module_steps("blocks.1.self_attn")[0].index)
compare.go_to_first_divergence()
for _ in range(30):
    app.processEvents()
compare.grab().save(out)
print(f"wrote {out}")
