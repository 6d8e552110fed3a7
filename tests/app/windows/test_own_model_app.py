"""The app on a user's own model: a partial trace opens on the failing step with the raising
line in red and the exception in the inspector; the source pane shows the trace's embedded
copy and says when the disk differs; Ctrl+R re-imports, re-traces and lands on the same
step; the previous trace is one click from a comparison; the file can be watched; File ▸
New trace and ``scratchformer app --model`` accept a model file; a file that does not
import is a dialog with its traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.own_models import TUTORIAL, TUTORIAL_FIXED
from PySide6.QtCore import QSettings

import tracing
from app.commands.app import model_request
from app.core import session
from app.panels.retrace import find_step, request_for, step_key
from app.windows import dialogs
from app.windows.main_window import MainWindow

pytestmark = [pytest.mark.gui, pytest.mark.usefixtures("one_thread")]
FIX = ("import math\n", "import math\nimport torch.nn.functional as F\n")


@pytest.fixture
def errors(monkeypatch):
    shown: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        dialogs, "show_error", lambda parent, t, x, details="": shown.append((t, x, details))
    )
    return shown


@pytest.fixture
def window(qtbot, tmp_path, errors):
    w = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.show()
    return w


@pytest.fixture
def mine(tmp_path) -> Path:
    """The user's copy of the tutorial (still missing the import)."""
    path = tmp_path / "tutorial.py"
    shutil.copy(TUTORIAL, path)
    return path


def request(path: Path, shape: str = "1,6") -> session.TraceRequest:
    source = session.ModelSource("file", model=f"{path}:TutorialLM", input_shape=shape)
    return session.TraceRequest("", source, capture="values")


def trace_in(window, qtbot, req) -> None:
    with qtbot.waitSignal(window.traceJobEnded, timeout=60_000):
        assert window.start_trace(req) is not None


def test_partial_trace_opens_on_the_failure_with_the_raising_line_red(window, qtbot, mine, errors):
    trace_in(window, qtbot, request(mine))
    trace = window.trace
    assert trace.failure is not None and window.current == trace.failure.step
    assert trace.steps[window.current].module == "blocks.0.self_attn"
    view = window.source_view
    assert view.failed_line and view.current_line == 26
    assert view.highlighted_text().strip() == "attention_weights = F.softmax(scores, dim=-1)"
    label = window.inspector.failure_label
    assert label.isVisibleTo(window) and "NameError: name 'F' is not defined" in label.text()
    assert "q (B=1, T=6, C=32)" in label.text() and "mask (T=6, T=6)" in label.text()
    assert errors and errors[0][0] == "The forward pass raised"
    window.go_to(0)
    assert not view.failed_line and not label.isVisibleTo(window)


def test_a_saved_partial_trace_reopens_on_its_failure_from_its_embedded_source(
    window, qtbot, mine, tmp_path
):
    loaded = session.load_user_model(request(mine))
    with pytest.raises(tracing.TraceError) as info:
        tracing.trace(loaded[0], *loaded[1], capture="stats", meta=loaded[3])
    info.value.trace.save(tmp_path / "t.sft")
    mine.unlink()  # opened where the file is not: the embedded copy still shows
    assert window.open_path(tmp_path / "t.sft")
    assert window.current == window.trace.failure.step
    assert window.source_view.current_line == 26 and window.source_view.failed_line
    assert "not on this disk" in window.source_view.note.text()


def test_source_view_says_when_the_disk_differs(window, qtbot, mine):
    mine.write_text(mine.read_text().replace(*FIX))
    trace_in(window, qtbot, request(mine))
    window.go_to(next(s.index for s in window.trace.steps if s.op == "softmax"))
    assert window.source_view.note.isHidden()
    mine.write_text(mine.read_text() + "\n# edited after the trace\n")
    window.source_view.set_sources(window.trace.sources)  # forget the cached comparison
    window.go_to(0)
    window.go_to(next(s.index for s in window.trace.steps if s.op == "softmax"))
    assert "differs" in window.source_view.note.text()
    assert window.source_view.highlighted_text().strip().startswith("attention_weights")


def test_ctrl_r_reimports_retraces_and_lands_on_the_same_step(window, qtbot, mine):
    trace_in(window, qtbot, request(mine))
    failing = window.trace
    mine.write_text(mine.read_text().replace(*FIX))  # the user's fix
    with qtbot.waitSignal(window.traceJobEnded, timeout=60_000):
        assert window.retrace.reload()
    fixed = window.trace
    assert fixed is not failing and fixed.complete
    assert window.current == failing.failure.step  # the same MultiHeadAttention call
    assert fixed.meta["input_spec"]["shape"] == [1, 6] and fixed.meta["capture"] == "values"
    assert window.retrace.previous is failing
    compare = window.retrace.compare_previous()
    assert compare is not None and compare.trace_a is failing and compare.trace_b is fixed
    compare.close()


def test_step_keys_find_the_same_step_again():
    source = session.ModelSource("file", model=f"{TUTORIAL_FIXED}:TutorialLM", input_shape="1,4")
    outcome = session.run_trace(session.TraceRequest("", source, capture="shapes"))
    trace = outcome.trace
    for index in (0, 17, len(trace.steps) - 1):
        assert find_step(trace, step_key(trace, index)) == index
    assert find_step(trace, ("op", "nowhere", "matmul", 0)) is None
    again = request_for(trace)
    assert again.source.model == f"{TUTORIAL_FIXED}:TutorialLM" and again.capture == "shapes"


def test_watching_the_file_retraces_on_save(window, qtbot, mine):
    mine.write_text(mine.read_text().replace(*FIX))
    trace_in(window, qtbot, request(mine))
    first = window.trace
    window.retrace.watch_action.setChecked(True)
    assert str(mine) in window.retrace.watcher.files()
    with qtbot.waitSignal(window.traceJobEnded, timeout=60_000):
        mine.write_text(mine.read_text() + "\n# saved again\n")
    assert window.trace is not first and window.trace.complete


def test_a_file_that_does_not_import_is_a_dialog_with_its_traceback(
    window, qtbot, tmp_path, errors
):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\nraise ValueError('no model today')\n")
    source = session.ModelSource("file", model=f"{bad}:Model")
    trace_in(window, qtbot, session.TraceRequest("", source))
    title, text, details = errors[-1]
    assert title == "Cannot trace" and "bad.py:3" in text and "no model today" in text
    assert details.startswith("Traceback") and "raise ValueError" in details
    assert window.trace is None


def test_new_trace_dialog_and_app_command_accept_a_model_file(qtbot):
    from app.cli import build_parser

    dialog = dialogs.NewTraceDialog(None, "hi")
    qtbot.addWidget(dialog)
    dialog.model_edit.setText(f"{TUTORIAL_FIXED}:TutorialLM")
    dialog.shape_edit.setText("2,5")
    dialog.file_radio.setChecked(True)
    req = dialog.request()
    assert req.source.kind == "file" and req.source.input_shape == "2,5"
    args = build_parser().parse_args(
        ["app", "--model", f"{TUTORIAL_FIXED}:TutorialLM", "--input-shape", "1,3"]
    )
    req = model_request(args)
    assert req.source.model.endswith("tutorial_fixed.py:TutorialLM")
    outcome = session.run_trace(req)
    assert outcome.status == "complete" and outcome.trace.steps[0].source is None
