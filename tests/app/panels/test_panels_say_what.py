"""Panels that say what they show (issue 25): attention grids labelled by module (self- and
cross-attention of nn.TransformerDecoder apart), heatmap colour scales (linear, log, per
row, percentile) remembered per view; and the small things: the status bar after a failed
trace, the Edits dock over the next trace."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PySide6.QtCore import QSettings
from torch import nn

import tracing
from app.panels.attention import AttentionPanel, layer_labels
from app.widgets.heatmap import HeatmapView, apply_colour_scale

pytestmark = pytest.mark.gui


def test_labels_name_the_module():
    assert layer_labels(["blocks.0.self_attn.attention", "blocks.1.self_attn.attention"]) == [
        "L0",
        "L1",
    ]
    paths = ["layers.0.self_attn", "layers.0.multihead_attn", "layers.1.self_attn"]
    assert layer_labels(paths) == ["L0 self_attn", "L0 multihead_attn", "L1 self_attn"]
    assert layer_labels(["attn", "attn#1"]) == ["attn", "attn#1"]
    # x-transformers: the layer is the number that changes, not the block's place in it
    xt = ["attn_layers.layers.0.1.attend", "attn_layers.layers.2.1.attend"]
    assert layer_labels(xt) == ["L0", "L2"]
    longcat = [f"model.layers.{i}.self_attn.{j}" for i in (0, 1) for j in (0, 1)]  # 2 per layer
    assert layer_labels(longcat) == [
        "L0 self_attn.0", "L0 self_attn.1", "L1 self_attn.0", "L1 self_attn.1",
    ]  # fmt: skip


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)

    def forward(self, x, memory):
        return self.dec(x, memory)


def test_transformer_decoder_grid_says_self_and_cross(qtbot):
    torch.manual_seed(0)
    trace = tracing.trace(Decoder().eval(), torch.randn(1, 5, 8), torch.randn(1, 3, 8))
    panel = AttentionPanel()
    qtbot.addWidget(panel)
    panel.set_trace(trace)
    if not panel.paths:
        pytest.skip("the tracer kept no attention maps of nn.MultiheadAttention here")
    texts = [panel.layer_combo.itemText(i) for i in range(panel.layer_combo.count())]
    for text, path in zip(texts, panel.paths, strict=True):
        number = path.split(".")[2]
        name = path.split(".")[3].split("#")[0]
        assert text.startswith(f"L{number} {name}") and text.endswith(path)
    assert any("multihead_attn" in t for t in texts) and any("self_attn" in t for t in texts)


def test_colour_scales():
    a = np.array([[0.5, 0.25, 0.25], [0.01, 0.01, 0.98]])
    out, levels, note = apply_colour_scale(a, "row", (0, 1), signed=False)
    assert np.allclose(out.max(axis=1), 1.0) and levels == (0.0, 1.0) and "row" in note
    out, levels, _ = apply_colour_scale(a, "log", (0, 1), signed=False)
    assert np.allclose(out, np.log10(a)) and levels == pytest.approx(
        (np.log10(0.01), np.log10(0.98))
    )
    _, levels, _ = apply_colour_scale(np.arange(101.0)[None], "percentile", (0, 100), False)
    assert levels == pytest.approx((1.0, 99.0))
    signed = np.array([[-2.0, 0.0, 1.0]])
    out, levels, _ = apply_colour_scale(signed, "log", (-2, 2), signed=True)
    assert out[0, 0] < 0 < out[0, 2] and out[0, 1] == 0 and levels[0] == -levels[1]
    same, levels, note = apply_colour_scale(a, "linear", (0, 1), signed=False)
    assert same is a and note == ""


def test_scale_is_remembered_per_view(qtbot):
    HeatmapView.remembered_scales.clear()
    view = HeatmapView(scale_key="attention")
    qtbot.addWidget(view)
    matrix = np.array([[0.9, 0.1], [0.001, 0.999]])
    view.set_matrix(matrix, scale="probability")
    view.scale_combo.setCurrentIndex(view.scale_combo.findData("log"))
    assert view.colour_scale == "log"
    assert np.allclose(view.image_item.image, np.log10(matrix))
    assert view.hover_text(1, 0).endswith("0.001")  # hover reads the real value
    other = HeatmapView(scale_key="tensor")
    again = HeatmapView(scale_key="attention")
    qtbot.addWidget(other)
    qtbot.addWidget(again)
    assert other.colour_scale == "linear" and again.colour_scale == "log"
    HeatmapView.remembered_scales.clear()


@pytest.fixture
def window(qtbot, tmp_path, errors):
    from app.windows.main_window import MainWindow

    w = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    return w


def test_status_bar_forgets_tracing_after_a_failure(window, errors):
    from app.core import session

    window.statusBar().showMessage("Tracing with the demo model…")
    window._on_trace_finished(session.TraceOutcome(None, "failed", "boom"))
    assert "Tracing with" not in window.statusBar().currentMessage()
    assert errors == [("Tracing failed", "boom")]


def test_edits_dock_goes_with_its_trace(window):
    from helpers.app_fixtures import tiny_trace

    from tracing.capture.edits import Edit, Zero
    from tracing.sites import step_site

    first = tiny_trace()
    window.set_trace(first)
    window.edits.add(Edit(step_site(first, 3), Zero()))
    assert window.edits.dock.isVisibleTo(window) and window.edits.edits
    window.set_trace(tiny_trace(n_layers=1))
    assert not window.edits.dock.isVisibleTo(window) and not window.edits.edits
