"""The lens view on real traces of the demo model: the grid, the heatmaps, no-model message."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.tiny_models import demo_ids, trace_demo

import scratchformer
import tracing
from app.panels.lens import LensTableModel, LensView


@pytest.fixture(scope="module")
def model(demo_model):
    return demo_model


@pytest.fixture
def view(qtbot) -> LensView:
    v = LensView()
    qtbot.addWidget(v)
    v.resize(1000, 640)
    v.show()
    qtbot.waitExposed(v)
    return v


def test_final_layer_of_the_grid_is_the_models_own_prediction(view, model, demo_values):
    view.set_trace(demo_values, model)
    assert view.has_data and view.message_text == ""
    grid = view.table_model
    T = len(scratchformer.DEMO_PROMPT)
    assert grid.rowCount() == T
    assert grid.columnCount() == 1 + model.config.n_layers  # embeddings + every block
    with torch.no_grad():
        probs = torch.softmax(model(demo_ids())[0], -1)  # (T, V): the model's own output
    expected = probs.argmax(-1)
    for t in range(T):
        assert view.top_token(t, -1) == int(expected[t])
        cell = grid.index(t, grid.columnCount() - 1)
        assert grid.data(cell, LensTableModel.ProbRole) == pytest.approx(
            float(probs[t, expected[t]]), rel=1e-5
        )
    # the trained reversal model writes the answer: after '|' every letter is predicted
    bar = scratchformer.DEMO_PROMPT.index("|")
    for t in range(bar, T - 1):
        assert view.top_token(t, -1) == demo_ids()[0, t + 1]
        assert "✓" in grid.data(grid.index(t, grid.columnCount() - 1))


def test_heatmaps_show_final_token_probability_and_head_contributions(view, model, demo_values):
    view.set_trace(demo_values, model)
    lens = view.lens
    shown = view.final_heatmap.matrix  # (T, L)
    np.testing.assert_allclose(shown, lens.final_token_probs.T, rtol=1e-6)
    np.testing.assert_allclose(shown[:, -1], lens.top_probs[-1, :, 0], rtol=1e-6)
    heads = view.heads_heatmap.matrix
    assert heads.shape == (model.config.n_layers, model.config.n_heads)
    assert (heads > 0).all()


def test_a_silenced_head_contributes_nothing(view, demo_values):
    model = scratchformer.demo_model()
    D = model.config.d_model // model.config.n_heads
    with torch.no_grad():  # head 2 of block 1 writes through W_o columns 2D..3D: zero them
        model.blocks[1].self_attn.W_o.weight[:, 2 * D : 3 * D] = 0
    view.set_trace(trace_demo(model), model)
    heads = view.heads_heatmap.matrix
    assert heads[1, 2] == 0
    assert (np.delete(heads[1], 2) > 0).all() and (heads[0] > 0).all()


def test_without_a_model_the_view_says_why(view, demo_values, tmp_path):
    path = tmp_path / "demo.trace"
    demo_values.save(path)
    view.set_trace(tracing.load(path), None)
    assert not view.has_data
    assert "needs the model" in view.message_text
    assert view.table_model.rowCount() == 0


def test_stats_trace_asks_for_values(view, model, demo_stats):
    view.set_trace(demo_stats, model)
    assert "needs tensor values" in view.message_text


def test_hidden_view_computes_when_shown(qtbot, model, demo_values):
    v = LensView()
    qtbot.addWidget(v)
    v.set_trace(demo_values, model)
    assert not v.has_data  # nothing computed while hidden
    v.show()
    qtbot.waitExposed(v)
    assert v.has_data


def test_grid_model_passes_qt_model_tester(qtmodeltester, view, model, demo_values):
    view.set_trace(demo_values, model)
    qtmodeltester.check(view.table_model)


def test_model_factory_runs_only_when_the_lens_is_shown(qtbot, model, demo_values):
    calls = []

    def factory():
        calls.append(1)
        return model

    v = LensView()
    qtbot.addWidget(v)
    v.set_trace(demo_values, model_factory=factory)
    assert calls == []  # hidden: nothing built
    v.show()
    qtbot.waitExposed(v)
    assert calls == [1] and v.has_data
    v.set_trace(demo_values, model_factory=lambda: (_ for _ in ()).throw(OSError("gone")))
    assert "Cannot load the model" in v.message_text and "gone" in v.message_text


def test_main_window_lens_dock_has_the_model_only_for_its_own_traces(qtbot, tmp_path, demo_values):
    from PySide6.QtCore import QSettings

    from app.windows.main_window import MainWindow

    window = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    window.load_demo(background=False)  # the window traced the demo: the model is at hand
    dock = window.lens_dock
    dock.show()
    qtbot.waitExposed(dock)
    assert dock.view.has_data
    assert dock.view.lens.shape == (3, len(scratchformer.DEMO_PROMPT))
    path = tmp_path / "demo.trace"
    demo_values.save(path)
    assert window.open_path(path)
    assert "needs the model" in dock.view.message_text
