"""The compare window on real traces of the demo model: alignment, colours, A − B, stepping."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny_models import trace_demo

import scratchformer
from app.diagram.divergence import divergence_colour
from app.windows.compare_window import CompareWindow
from tracing.analysis.divergence import entry_score, score_text

CHANGED = "blocks.1.feed_forward.linear1"


@pytest.fixture(scope="module")
def changed_trace():
    """The demo model with one weight of block 1's first feed-forward layer nudged."""
    model = scratchformer.demo_model()
    with torch.no_grad():
        model.get_submodule(CHANGED).weight[5, 7] += 0.5
    return trace_demo(model)


def _window(qtbot, a, b, **kwargs) -> CompareWindow:
    w = CompareWindow(a, b, "demo.trace", "other.trace", **kwargs)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    return w


def test_a_trace_against_itself_shows_zero_divergence_everywhere(qtbot, demo_values):
    w = _window(qtbot, demo_values, demo_values)
    assert w.first is None and w.divergent == []
    assert "No divergence" in w.summary.text()
    assert not w.first_button.isEnabled()
    assert w.position == 0
    # every box on both sides is marked, and every mark says 0 in the identical colour
    for overlay in (w.overlay_a, w.overlay_b):
        visible = [k for k in w.diagram_a.items_by_key if k >= 0]
        assert set(overlay.marks) == set(visible)
        for mark in overlay.marks.values():
            assert mark.score == 0 and mark.text == "0"
            assert mark.colour == divergence_colour(0.0)
    # step to an op with values: the difference heatmap is all zero
    softmax = next(i for i, e in enumerate(w.entries) if e.op == "softmax")
    w.go_to(softmax)
    assert w.difference_heatmap.matrix is not None
    assert (w.difference_heatmap.matrix == 0).all()
    assert "identical" in w.difference_caption.text()


def test_one_changed_weight_highlights_the_first_step_that_uses_it(
    qtbot, demo_values, changed_trace
):
    w = _window(qtbot, demo_values, changed_trace)
    # reference: the op inside the changed Linear is the first to use its weight
    uses = next(s.index for s in demo_values.steps if s.kind == "op" and s.module == CHANGED)
    first = w.first
    assert first is not None and first.a_index == uses and first.b_index == uses
    assert CHANGED in w.summary.text()
    # the window opens there, both diagrams highlight it
    assert w.current_entry is first
    for view in (w.diagram_a, w.diagram_b):
        assert view.highlighted_key == view.key_for_step(uses)
    # nothing before it diverges; its score is the entry's relative L2
    for s in demo_values.steps:
        score, _ = w.box_score("a", s.index)
        if s.kind == "op" and s.index < uses:
            assert score == 0, s.label
    assert w.box_score("a", uses)[0] == pytest.approx(first.rel_l2) and first.rel_l2 > 0
    # module boxes: block 0 identical, block 1 (which holds the change) divergent
    block0 = demo_values.module_steps("blocks.0")[0].index
    block1 = demo_values.module_steps("blocks.1")[0].index
    assert w.overlay_a.marks[block0].score == 0
    assert w.overlay_a.marks[block1].score > 0
    assert w.overlay_a.marks[block1].colour != divergence_colour(0.0)
    # A − B heatmap of that step equals the two kept outputs subtracted
    out_a = demo_values.value(demo_values.steps[uses].outputs[0])[0]  # (T, F)
    out_b = changed_trace.value(changed_trace.steps[uses].outputs[0])[0]
    shown = torch.as_tensor(w.difference_heatmap.matrix)
    assert torch.allclose(shown, (out_a - out_b).float())
    # only the changed row's feature (column 5 of linear1's output) differs
    assert (shown[:, 5] != 0).any() and (torch.cat([shown[:, :5], shown[:, 6:]], 1) == 0).all()


def test_synchronised_stepping_and_clicks(qtbot, demo_values, changed_trace):
    w = _window(qtbot, demo_values, changed_trace)
    w.go_to(0)
    for k in range(1, 6):
        w.next()
        e = w.entries[k]
        assert w.position == k
        assert w.diagram_a.current_step == e.a_index and w.diagram_b.current_step == e.b_index
        assert w.step_bar.slider.value() == k
        assert e.label in w.step_bar.status.text()
    # a click on a box of B jumps to its entry
    block1 = changed_trace.module_steps("blocks.1")[0].index
    w.diagram_b.stepActivated.emit(block1)
    assert w.current_entry.b_index == block1
    # next divergence walks only divergent entries
    w.go_to(0)
    w.next_divergence()
    assert w.current_entry.differs()
    # expanding a box on one side expands its partner
    w.diagram_a.expand(block1)
    assert block1 in w.diagram_b.expanded
    assert w.overlay_b.marks  # marks come back after the rebuild


def test_different_prompts_align_and_report_shape_changes(qtbot, demo_values):
    other = trace_demo(prompt="abc|cba.")
    w = _window(qtbot, demo_values, other)
    assert w.first is not None and w.first.status == "shape"
    assert w.box_score("a", 0)[0] == math.inf  # root module: output shape changed
    assert w.overlay_a.marks[0].text == "shape"
    assert "shape changed" in w.difference_heatmap.message


def test_stats_traces_colour_by_statistics_and_explain_the_missing_heatmap(
    qtbot, demo_stats, changed_trace
):
    w = _window(qtbot, demo_stats, changed_trace)
    assert w.first is not None
    assert "No A − B heatmap" in w.difference_heatmap.message


def test_from_files_and_helpers(qtbot, tmp_path, demo_values):
    path = tmp_path / "a.trace"
    demo_values.save(path)
    w = CompareWindow.from_files(path, path)
    qtbot.addWidget(w)
    assert w.first is None and w.name_a == "a.trace"
    assert score_text(None) == "?" and score_text(0.0) == "0"
    assert score_text(math.inf, "only_a") == "A only"
    assert entry_score(None) is None
    from app.core.session import SessionError

    with pytest.raises(SessionError):
        CompareWindow.from_files(tmp_path / "missing.trace", path)


def test_main_window_compare_with_a_file(qtbot, tmp_path, monkeypatch, demo_values, changed_trace):
    from PySide6.QtCore import QSettings

    from app.windows import dialogs
    from app.windows.main_window import MainWindow

    shown = []
    monkeypatch.setattr(dialogs, "show_error", lambda parent, t, x, details="": shown.append(t))
    window = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    assert not window.compare.action.isEnabled()  # nothing to compare yet
    window.set_trace(demo_values)
    assert window.compare.action.isEnabled()
    path = tmp_path / "edited.trace"
    changed_trace.save(path)
    compare = window.compare.open_with(path)
    assert compare is not None and compare.trace_a is demo_values
    assert compare.first is not None and compare.first.module == CHANGED
    assert compare.name_b == "edited.trace"
    compare.close()
    (tmp_path / "junk.trace").write_bytes(b"not a trace")
    assert window.compare.open_with(tmp_path / "junk.trace") is None
    assert shown == ["Cannot compare"]


def test_command_line_compare(qtbot, qapp, tmp_path, monkeypatch, demo_values, changed_trace):
    from PySide6.QtWidgets import QApplication

    from app.cli import main

    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    demo_values.save(a)
    changed_trace.save(b)
    assert main(["app", "--compare", str(a), str(tmp_path / "missing.trace")]) == 2
    assert main(["app", str(a), "--compare", str(a), str(b)]) == 2
    monkeypatch.setattr(qapp, "exec", lambda: 0)  # do not enter the event loop
    assert main(["app", "--compare", str(a), str(b)]) == 0
    opened = [
        w
        for w in QApplication.topLevelWidgets()
        if isinstance(w, CompareWindow) and w.isVisible() and w.name_b == "b.trace"
    ]
    assert len(opened) == 1 and opened[0].first.module == CHANGED
    opened[0].close()
    opened[0].deleteLater()
