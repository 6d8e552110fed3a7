"""Edit actions in the app: a head or a box edited from its menu re-runs the live model
and opens the compare view on the first divergent step with the prediction change; the
Edits panel toggles and re-runs; a trace from a file says what is missing; sweeps."""

from __future__ import annotations

import html

import pytest
import torch
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QLabel

import scratchformer
from app.core import edit_session, session
from app.windows.main_window import MainWindow
from tracing.capture.edits import Edit, Zero
from tracing.runs.edit_run import run_edited
from tracing.sites import step_site

pytestmark = pytest.mark.gui

PROMPT = "wordplay|yalp"  # the demo model reverses: next is 'd'
REVERSAL = (1, 2)  # the head whose map is the reversal diagonal (layer, head)


@pytest.fixture
def window(qtbot, tmp_path, errors):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    request = session.TraceRequest(PROMPT, session.ModelSource("demo"))
    w._pending_request = request
    w._on_trace_finished(session.run_trace(request))
    w.show()
    return w


def _head_menu_edit(window, layer: int, head: int):
    attention = window.inspector.attention
    map_step = attention.step_for_layer(layer)
    menu = window.edits.head_menu(map_step, head)
    texts = [a.text() for a in menu.actions() if a.text()]
    assert texts[-5:] == [
        "Zero",
        "Mean-ablate (mean over positions)",
        "Scale…",
        "Patch from another prompt…",
        "Patch from a trace file…",
    ]
    return map_step, lambda action: edit_session.edit_for_head(window.trace, map_step, head, action)


def test_zero_the_reversal_head_breaks_the_prediction(window, errors):
    controller = window.edits
    _, make = _head_menu_edit(window, *REVERSAL)
    assert controller.apply("zero", make, background=False)
    assert not errors
    compare = controller.last_compare
    assert compare is not None
    (edit,) = controller.edits
    assert str(edit.site) == "blocks.1.self_attn.attention@0" and edit.head == 2
    # the compare view opens on the first divergent step: the edited attention output
    first = compare.first
    assert first is not None and first.label.startswith("blocks.1.self_attn.attention")
    assert compare.position == compare._position_of[id(first)]
    # the prediction change, against an independent run with hooks
    rows = edit_session.prediction_change(window.trace, compare.trace_b)
    model = scratchformer.demo_model()
    ids = torch.tensor([scratchformer.ByteTokenizer().encode(PROMPT)])
    with torch.no_grad():
        expected = run_edited(model, ids, edits=[edit])[0, -1].softmax(-1)
    by_token = {r.token: r for r in rows}
    d = ord("d")
    assert by_token[d].before > 0.99 and by_token[d].after == pytest.approx(float(expected[d]))
    card = compare.findChild(type(compare.summary), "predictionChange")
    assert "'d' 100.0% →" in card.text()
    assert compare.trace_b.meta["edits"][0]["steps"]  # the edited trace says where


def test_box_menu_edits_that_step(window, errors):
    trace = window.trace
    index = next(s.index for s in trace.steps if s.module == "blocks.0.feed_forward")
    menu = window.edits.step_menu(index)
    assert menu.actions()[0].text().startswith(f"Edit step {index + 1}")
    make = lambda a: edit_session.edit_for_step(window.trace, index, a)  # noqa: E731
    assert window.edits.apply("mean", make, background=False)
    (edit,) = window.edits.edits
    assert edit.site == step_site(trace, index)
    assert window.edits.last_compare.first is not None
    # untick it: re-running with nothing enabled says so
    window.edits.panel.list.item(0).setCheckState(
        window.edits.panel.list.item(0).checkState().__class__.Unchecked
    )
    assert window.edits.enabled == [False]
    assert not window.edits.run(background=False)
    assert "No edit is enabled" in errors[-1][1]


def test_patch_from_a_trace_file_restores_the_clean_prediction(
    window, errors, tmp_path, monkeypatch
):
    """Patch the last block from a saved trace of another prompt: the clean run's logits."""
    from PySide6.QtWidgets import QFileDialog

    import tracing

    model = scratchformer.demo_model()
    ids = torch.tensor([scratchformer.ByteTokenizer().encode("workplay|yalp")])
    other = tracing.trace(model, ids, capture="values")
    path = tmp_path / "other.trace"
    other.save(path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    index = window.trace.module_steps("blocks.1")[0].index
    make = lambda a: edit_session.edit_for_step(window.trace, index, a)  # noqa: E731
    assert window.edits.apply("patch_file", make, background=False), errors
    edited = window.edits.last_compare.trace_b
    root = edited.steps[0]
    assert torch.equal(edited.value(root.outputs[0]), other.value(other.steps[0].outputs[0]))


def test_trace_from_file_says_what_is_missing(window, errors, tmp_path):
    path = tmp_path / "t.trace"
    window.trace.save(path)
    assert window.open_path(path)
    assert window.trace_request is None
    _, make = _head_menu_edit(window, *REVERSAL)
    menu = window.edits.head_menu(window.inspector.attention.step_for_layer(1), 2)
    assert any("needs a live model" in a.text() for a in menu.actions())
    assert not window.edits.apply("zero", make, background=False)
    assert errors[-1][0] == "Edits need a live model"
    assert "opened from a file" in errors[-1][1]
    assert "opened from a file" in window.edits.panel.status.text()
    assert window.edits.open_sweep() is None


def test_background_run_and_sweep_dialog(window, qtbot, errors, tmp_path):
    controller = window.edits
    controller.add(Edit("blocks.1.self_attn.attention", Zero(), head=2))
    assert controller.run()
    qtbot.waitUntil(lambda: controller.job is None, timeout=60_000)
    assert controller.last_compare is not None and not errors
    dialog = controller.open_sweep()
    dialog.corrupted_edit.setText("workplay|yalp")
    assert dialog.run(background=False)
    result = dialog.result
    assert result.values.shape == (2, 4)
    assert result.best()[:2] == ("layer 1", "head 2")
    dialog.save_csv(tmp_path / "s.csv")
    dialog.save_png(tmp_path / "s.png")
    assert (tmp_path / "s.csv").read_text().startswith("heads,head 0")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    dialog.corrupted_edit.setText("work")
    assert not dialog.run(background=False)
    assert "same length" in errors[-1][1]


def test_right_click_on_a_box_asks_for_that_steps_menu(window):
    from PySide6.QtGui import QContextMenuEvent

    from app.diagram.items import BoxItem

    view = window.diagram
    view.stepContextMenu.disconnect()  # record the request instead of opening a menu
    seen: list[int] = []
    view.stepContextMenu.connect(lambda index, _where: seen.append(index))

    def right_click(item) -> None:
        pos = view.mapFromScene(item.sceneBoundingRect().center())
        reason = QContextMenuEvent.Reason.Mouse
        view.contextMenuEvent(QContextMenuEvent(reason, pos, view.mapToGlobal(pos)))

    boxes = [(k, it) for k, it in view.items_by_key.items() if isinstance(it, BoxItem)]
    key, item = next((k, it) for k, it in boxes if k >= 0)
    right_click(item)
    assert seen == [key]
    outside = [it for k, it in boxes if k < 0]  # the input and output boxes
    for item in outside:
        right_click(item)
    assert seen == [key]


@pytest.mark.slow
def test_the_prediction_card_of_a_hugging_face_model_names_its_tokenizers_tokens(
    qtbot, tmp_path, errors
):
    """After an edit on a folder model, the card's tokens are the tokenizer's strings (as
    a decoder reads each one), not byte labels of their ids."""
    pytest.importorskip("transformers")
    from helpers.hf_folders import llama_folder
    from tokenizers import Tokenizer

    from tracing.token_names import text_label

    folder = llama_folder(tmp_path / "tl")
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    qtbot.addWidget(window)
    request = session.TraceRequest("the cat sat", session.ModelSource("file", model=str(folder)))
    window._pending_request = request
    window._on_trace_finished(session.run_trace(request))
    _, make = _head_menu_edit(window, 0, 1)
    assert window.edits.apply("zero", make, background=False)
    assert not errors
    card = window.edits.last_compare.findChild(QLabel, "predictionChange").text()
    rows = edit_session.prediction_change(window.trace, window.edits.last_compare.trace_b)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    anchor = tok.token_to_id("t")
    for row in rows:
        text = tok.decode([anchor, row.token])[len(tok.decode([anchor])) :]
        if "\ufffd" not in text:
            assert html.escape(repr(text_label(text)), quote=False) in card
