"""The generation view on a real traced generate() of the demo model: timeline, passes."""

from __future__ import annotations

import threading

import pytest
import torch
from PySide6.QtCore import QPointF, Qt

import scratchformer
from app.core.generation_session import GenerationRequest, run_generation
from app.core.session import ModelSource, SessionError
from app.panels.generation import GenerationView, TraceGenerationDialog
from app.workers import GenerationJob

PROMPT = "word|"  # the demo model reverses it: "drow."


@pytest.fixture(scope="module")
def outcome():
    return run_generation(GenerationRequest(PROMPT, max_new_tokens=5, source=ModelSource("demo")))


@pytest.fixture
def view(qtbot) -> GenerationView:
    v = GenerationView()
    qtbot.addWidget(v)
    v.resize(900, 560)
    v.show()
    qtbot.waitExposed(v)
    return v


def test_generation_matches_greedy_generate(outcome):
    gen = outcome.generation
    tok = scratchformer.ByteTokenizer()
    ids = torch.tensor([tok.encode(PROMPT)])
    expected = outcome.model.generate(ids, 5, temperature=0)[0, ids.size(1) :].tolist()
    assert gen.tokens == expected
    assert tok.decode(gen.tokens) == "drow."  # the trained model reverses the word
    assert len(gen.passes) == 5


def test_selecting_a_token_loads_its_pass_and_the_attention_grows(qtbot, view, outcome):
    gen = outcome.generation
    loaded = []
    view.traceSelected.connect(loaded.append)
    view.set_generation(gen)
    assert loaded == [gen.passes[0]] and view.current == 0
    T0 = len(PROMPT)
    assert view.heatmap.matrix.shape == (T0, T0)
    for n in range(1, 5):  # click each generated chip in turn
        rect = view.timeline.chip_rect(n)
        with qtbot.waitSignal(view.passSelected) as signal:
            qtbot.mouseClick(view.timeline, Qt.MouseButton.LeftButton, pos=rect.center().toPoint())
        assert signal.args == [n]
        assert loaded[-1] is gen.passes[n]
        assert view.heatmap.matrix.shape == (T0 + n, T0 + n)  # one row and column per pass
        w = gen.attention_maps(n)[view.layer_combo.currentText()][0, view.head_spin.value()]
        assert torch.allclose(torch.as_tensor(view.heatmap.matrix), w.float())
    assert "pass 5 / 5" in view.info.text() and not view.next_button.isEnabled()
    view.prev_button.click()
    assert view.current == 3 and loaded[-1] is gen.passes[3]
    view.timeline.setFocus()
    qtbot.keyClick(view.timeline, Qt.Key.Key_Right)
    assert view.current == 4


def test_prompt_chips_do_not_select_a_pass(view, outcome):
    view.set_generation(outcome.generation, select=2)
    first_prompt_chip = view.timeline._rects[0]
    assert view.timeline.pass_at(*_xy(first_prompt_chip.center())) is None
    assert view.current == 2


def test_empty_view_and_bad_requests(view):
    view.set_generation(None)
    assert "No generation" in view.info.text()
    with pytest.raises(SessionError, match="new tokens"):
        run_generation(GenerationRequest(PROMPT, max_new_tokens=0))
    with pytest.raises(SessionError, match="empty"):
        run_generation(GenerationRequest("", max_new_tokens=2))


def test_cancel_stops_before_the_next_pass():
    cancel = threading.Event()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done == 1:
            cancel.set()

    result = run_generation(GenerationRequest(PROMPT, 4), progress=progress, cancel=cancel)
    assert result.status == "cancelled" and result.generation is None
    assert seen == [0, 1]


def test_job_runs_off_the_gui_thread(qtbot):
    job = GenerationJob(GenerationRequest("ab|", max_new_tokens=3, capture="stats"))
    with qtbot.waitSignal(job.finished, timeout=60_000) as signal:
        job.start()
    job.wait()
    gen = signal.args[0].generation
    assert len(gen.passes) == 3 and gen.passes[0].meta["capture"] == "stats"


def test_dialog_builds_the_request(qtbot):
    dialog = TraceGenerationDialog(None, prompt="abc|")
    qtbot.addWidget(dialog)
    dialog.tokens_spin.setValue(4)
    request = dialog.request(ModelSource("demo"))
    assert (request.prompt, request.max_new_tokens, request.capture) == ("abc|", 4, "values")


def _xy(point: QPointF) -> tuple[float, float]:
    return point.x(), point.y()


def test_main_window_steps_within_and_across_passes(qtbot, tmp_path, outcome):
    from PySide6.QtCore import QSettings

    from app.windows.main_window import MainWindow

    window = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    gen = outcome.generation
    controller = window.generation
    assert controller.action.text() == "Trace &generation…"
    controller.show_generation(gen, outcome.model)
    assert window.trace is gen.passes[0] and controller.dock.isVisible()
    softmax = next(s.index for s in gen.passes[0].steps if s.op == "softmax")
    window.go_to(softmax)  # step within the pass ...
    controller.view.select_pass(3)  # ... then across: same step, one pass later
    assert window.trace is gen.passes[3] and window.current == softmax
    T = len(PROMPT) + 3
    assert window.inspector.heatmap.matrix.shape[-1] == T  # the attention map grew
    assert window.trace_models[id(gen.passes[3])] is outcome.model  # the lens has the model


def test_pass_table_lists_every_pass_and_selects_it(view, outcome):
    gen = outcome.generation
    view.set_generation(gen)
    table = view.pass_table
    assert table.rowCount() == len(gen.passes)
    for row, entry in enumerate(gen.timeline()):
        assert table.item(row, 2).text() == chr(gen.tokens[row])  # letters of "drow."
        assert table.item(row, 1).text() == f"{entry.context_length} tokens"
    table.setCurrentCell(3, 0)
    assert view.current == 3 and view.timeline.selected == 3
