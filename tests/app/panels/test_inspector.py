"""The Inspector on a real trace: table, heatmap, slices, attention panel, jumps, export."""

from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt

import scratchformer
from app.panels.inspector import Inspector
from app.widgets.shape_table import ShapeTableModel
from tracing.record import Trace


@pytest.fixture
def inspector(qtbot, demo_values) -> Inspector:
    widget = Inspector()
    qtbot.addWidget(widget)
    widget.resize(600, 800)
    widget.show()
    qtbot.waitExposed(widget)
    widget.set_trace(demo_values)
    return widget


def _softmax_steps(trace: Trace) -> list[int]:
    return [s.index for s in trace.steps if s.op == "softmax"]


def _tick_labels(axis) -> list[str]:
    ticks = sorted(t for level in (axis._tickLevels or []) for t in level)
    return [label for _pos, label in ticks]


def test_step_shows_its_tensors_and_first_output(inspector, demo_values):
    index = _softmax_steps(demo_values)[0]
    inspector.set_step(index)
    step = demo_values.steps[index]
    model = inspector.table_model
    assert model.rowCount() == len(step.inputs) + len(step.outputs)
    out_row = model.default_row()
    assert inspector.table.currentIndex().row() == out_row
    tensor_id = model.data(model.index(out_row, 0), ShapeTableModel.TensorIdRole)
    assert tensor_id == step.outputs[0]

    # the heatmap is that output's [B=0, H=0] slice, tokens on both axes
    expected = demo_values.value(step.outputs[0])[0, 0]
    torch.testing.assert_close(torch.from_numpy(inspector.heatmap.matrix), expected)
    tokens = list(scratchformer.DEMO_PROMPT)
    assert _tick_labels(inspector.heatmap.row_axis) == tokens
    assert _tick_labels(inspector.heatmap.col_axis) == tokens
    assert inspector.heatmap.colormap_name == "inferno"  # probabilities
    # 1-based, as the status line says it
    assert f"Step {index + 1} / {len(demo_values)} · softmax" == inspector._title.text()


def test_selecting_a_row_shows_that_tensor(inspector, demo_values, qtbot):
    index = _softmax_steps(demo_values)[0]
    inspector.set_step(index)
    inspector.select_row(0)  # the softmax input: scores with the causal mask's -inf
    scores = demo_values.value(demo_values.steps[index].inputs[0])[0, 0]
    shown = torch.from_numpy(inspector.heatmap.matrix)
    torch.testing.assert_close(shown, scores)
    heatmap = inspector.heatmap
    assert heatmap.colormap_name == heatmap.signed_colormap  # signed data: diverging
    assert heatmap.colorbar.levels()[0] == -heatmap.colorbar.levels()[1]


def test_leading_index_is_kept_by_axis_name(inspector, demo_values):
    first, second = _softmax_steps(demo_values)[:2]
    inspector.set_step(first)
    inspector.tensor_view.set_leading_index((0, 2))  # head 2
    expected = demo_values.value(demo_values.steps[first].outputs[0])[0, 2]
    torch.testing.assert_close(torch.from_numpy(inspector.heatmap.matrix), expected)
    inspector.set_step(second)
    assert inspector.tensor_view.leading_index() == (0, 2)
    expected = demo_values.value(demo_values.steps[second].outputs[0])[0, 2]
    torch.testing.assert_close(torch.from_numpy(inspector.heatmap.matrix), expected)
    assert "H=2" in inspector.tensor_view.current_slice.describe()


def test_attention_panel_shows_chosen_layer_and_head(inspector, demo_values, qtbot):
    maps = demo_values.attention_maps()
    paths = list(maps)
    inspector.tabs.setCurrentIndex(Inspector.ATTENTION_TAB)
    panel = inspector.attention
    assert panel.paths == paths and len(paths) == 2
    panel.layer_combo.setCurrentIndex(1)
    panel.head_spin.setValue(3)
    assert (panel.layer, panel.head) == (1, 3)
    torch.testing.assert_close(torch.from_numpy(panel.heatmap.matrix), maps[paths[1]][0, 3])
    assert _tick_labels(panel.heatmap.row_axis) == list(scratchformer.DEMO_PROMPT)
    assert panel.grid.shape == (2, 4)


def test_stepping_into_an_attention_module_selects_its_layer_and_keeps_head(inspector, demo_values):
    panel = inspector.attention
    panel.set_layer(0, head=2)
    paths = panel.paths
    # a step inside layer 1's attention (its softmax), then one in layer 1's block
    inspector.set_step(_softmax_steps(demo_values)[1])
    assert (panel.layer, panel.head) == (1, 2)
    block_step = next(
        s.index for s in demo_values.steps if s.module == "blocks.0" and s.op == "add"
    )
    inspector.set_step(block_step)
    assert panel.layer == 0 and paths[0].startswith("blocks.0.")
    # the root module call belongs to no layer: the panel stays where it was
    inspector.set_step(0)
    assert panel.layer == 0


def test_thumbnail_click_opens_map_and_requests_its_step(inspector, demo_values, qtbot):
    inspector.tabs.setCurrentIndex(Inspector.ATTENTION_TAB)
    panel = inspector.attention
    grid = panel.grid
    qtbot.wait(20)
    with qtbot.waitSignal(inspector.stepRequested, timeout=1000) as blocker:
        qtbot.mouseClick(grid, Qt.MouseButton.LeftButton, pos=grid.cell_rect(1, 3).center())
    step_index = blocker.args[0]
    assert (panel.layer, panel.head) == (1, 3)
    # the requested step computed layer 1's weights: its output is that attention map
    step = demo_values.steps[step_index]
    assert step.module.startswith(panel.paths[1].split("#")[0])
    outputs = [demo_values.tensor(i) for i in step.outputs]
    assert any(r.role == "attention" for r in outputs)
    maps = demo_values.attention_maps()
    torch.testing.assert_close(torch.from_numpy(panel.heatmap.matrix), maps[panel.paths[1]][0, 3])
    # and following the request keeps what the user picked
    inspector.set_step(step_index)
    assert (panel.layer, panel.head) == (1, 3)


def test_missing_values_are_explained(qtbot, demo_stats):
    widget = Inspector()
    qtbot.addWidget(widget)
    trace = demo_stats
    widget.set_trace(trace)
    widget.set_step(_softmax_steps(trace)[0] - 1)  # masked_fill: not an attention map
    assert widget.heatmap.matrix is None
    assert "not captured" in widget.heatmap.message and "stats" in widget.heatmap.message
    assert widget.table_model.rowCount() > 0  # the table still shows shapes and stats


def test_every_step_can_be_shown(inspector, demo_values):
    for index in range(len(demo_values)):
        inspector.set_step(index)
        assert inspector.step_index == index
    with pytest.raises(IndexError, match="out of range"):
        inspector.set_step(len(demo_values))


def test_export_heatmap_png_and_svg(inspector, demo_values, tmp_path):
    inspector.set_step(_softmax_steps(demo_values)[0])
    png = inspector.export_heatmap(tmp_path / "tensor.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    inspector.tabs.setCurrentIndex(Inspector.ATTENTION_TAB)
    svg = inspector.export_heatmap(tmp_path / "attention.svg")
    assert "<svg" in svg.read_text() and svg.stat().st_size > 1000


def test_stats_strip_shows_all_its_lines_at_the_default_width(inspector, demo_values):
    """The strip's text (tensor · statistics · slice) fits the fixed box it sits in."""
    inspector.resize(420, 800)  # the inspector dock's width in a 1500-pixel window
    index = _softmax_steps(demo_values)[0]
    inspector.set_step(index)
    strip, box = inspector._strip, inspector._strip_box
    text = strip.text()
    assert "min " in text and "showing " in text and text.count("<br>") == 2
    assert strip.heightForWidth(box.width()) <= box.height()


def test_stats_strip_follows_a_slice_chosen_in_code(inspector, demo_values):
    inspector.set_step(_softmax_steps(demo_values)[0])
    inspector.tensor_view.set_leading_index((0, 2))
    assert "H=2]" in inspector._strip.text()
    assert inspector.tensor_view.current_slice.describe() in inspector._strip.text()
