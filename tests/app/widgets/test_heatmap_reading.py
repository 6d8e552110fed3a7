"""What a heatmap lets a person read, at any dock size: every token that fits is labelled
(upright when the labels do not fit across), a square map's view never leaves the map, the
hover readout follows the step, and a tensor or attention map holding NaN/Inf only in
another slice opens on that slice.

Labels are counted as drawn (the axis's own draw specs, after pyqtgraph drops what runs
past its ends), not as handed to the axis."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch
from PySide6.QtCore import QEvent, QPointF
from PySide6.QtGui import QImage, QPainter

import tracing
from app.panels.attention import AttentionPanel
from app.widgets.heatmap import PLOT_MARGINS, HeatmapView
from app.widgets.tensor_view import TensorView
from tracing.record import TensorRecord

pytestmark = pytest.mark.gui

TOKENS = ["<s>", "␣hello", "␣world", ",", "␣the", "␣cat", "␣sat"]
SIZES = [(300, 250), (420, 380), (600, 300), (900, 300)]


def drawn(axis) -> list:
    """(rectangle, text) of each label the axis draws."""
    image = QImage(10, 10, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    painter.setFont(axis.style["tickFont"] or painter.font())
    specs = axis.generateDrawSpecs(painter)
    painter.end()
    return [(rect, text) for rect, _flags, text in specs[2]] if specs else []


def _attention(n: int) -> np.ndarray:
    m = np.tril(np.random.default_rng(0).random((n, n)))
    return m / m.sum(1, keepdims=True)


@pytest.fixture
def view(qtbot) -> HeatmapView:
    widget = HeatmapView()
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def _show(view, qtbot, size, n=7, labels=TOKENS):
    view.resize(*size)
    view.set_matrix(
        _attention(n),
        row_labels=(labels * 3)[:n],
        col_labels=(labels * 3)[:n],
        row_name="query",
        col_name="key",
        scale="probability",
        square=True,
    )
    vb = view.plot_item.getViewBox()  # the layout settles: margins, the axis height
    qtbot.waitUntil(lambda: abs(vb.width() - vb.height()) < 2 and vb.width() > 50)
    qtbot.wait(10)


@pytest.mark.parametrize("size", SIZES)
def test_every_token_is_labelled_on_both_axes_where_a_line_fits(view, qtbot, size):
    _show(view, qtbot, size)
    key = drawn(view.col_axis)
    assert [text for _, text in key] == TOKENS  # 2-4 of 7 before
    assert [text for _, text in drawn(view.row_axis)] == TOKENS
    rects = [rect for rect, _ in key]  # side by side, none over another
    assert all(a.right() <= b.left() + 0.5 for a, b in pairwise(rects))


def test_labels_turn_upright_only_when_they_do_not_fit_across(view, qtbot):
    _show(view, qtbot, (900, 700), labels=["a", "b", "c", "d", "e", "f", "g"])
    assert not view.col_axis.upright  # short labels in wide columns: across
    _show(view, qtbot, (300, 250))
    assert view.col_axis.upright
    upright = {text: rect for rect, text in drawn(view.col_axis)}
    assert len({rect.width() for rect in upright.values()}) == 1  # a line's width each
    assert upright["␣hello"].height() > 2 * upright["␣hello"].width()


def test_too_many_tokens_for_a_line_each_label_every_other(view, qtbot):
    many = [f"t{i}" for i in range(64)]
    _show(view, qtbot, (300, 250), n=64, labels=many)
    texts = [text for _, text in drawn(view.col_axis)]
    assert 4 <= len(texts) < 64 and texts[0] == "t0"
    step = int(texts[1][1:])
    assert texts == [f"t{i}" for i in range(0, 64, step)]


@pytest.mark.parametrize("size", [(900, 300), (250, 500), (600, 300), (420, 380)])
def test_a_square_map_view_stays_on_the_map_with_square_cells(view, qtbot, size):
    _show(view, qtbot, size, n=13)
    vb = view.plot_item.getViewBox()
    (x0, x1), (y0, y1) = vb.viewRange()
    assert (x0, x1) == pytest.approx((0, 13), abs=0.01)  # not -10..25
    assert (y0, y1) == pytest.approx((0, 13), abs=0.01)
    qtbot.waitUntil(lambda: abs(vb.width() - vb.height()) < 2)  # 13 x 13 square cells
    assert vb.width() > 100
    view.set_matrix(_attention(13))  # a map that need not be square fills the plot again
    qtbot.waitUntil(lambda: view._canvas.ci.layout.getContentsMargins() == PLOT_MARGINS)
    assert vb.viewRange() == [[0, 13], [0, 13]]


def _cell_centre(view, row, col) -> QPointF:
    return view.image_item.mapToScene(QPointF(col + 0.5, row + 0.5))


def test_the_hover_readout_follows_the_step(view, qtbot):
    view.resize(420, 380)
    view.set_matrix(np.arange(12.0).reshape(3, 4))
    qtbot.wait(20)
    view._on_mouse_moved(_cell_centre(view, 2, 1))  # the mouse rests on (2, 1) = 9
    assert view._hover.text().endswith("= 9")
    view.set_matrix(np.arange(12.0).reshape(3, 4) * 100)  # the next step, same shape
    assert view._hover.text().endswith("= 900")  # not the stale 9
    view.set_matrix(np.full((1, 1), 7.0))  # one cell fills the view: it is under the mouse
    assert view._hover.text() == "row 0 · col 0 = 7"
    view.set_matrix(np.arange(12.0).reshape(3, 4))
    qtbot.wait(20)
    view._on_mouse_moved(_cell_centre(view, 0, 3))
    view.eventFilter(view._canvas, QEvent(QEvent.Type.Leave))  # the mouse leaves
    view.set_matrix(np.ones((3, 4)))
    assert view._hover.text().strip() == ""


def test_a_tensor_opens_on_the_slice_that_holds_its_nonfinite_values(qtbot):
    tensor_view = TensorView()
    qtbot.addWidget(tensor_view)
    value = torch.zeros(2, 3, 4, 4)
    value[1, 2, 0, 1] = float("inf")
    record = TensorRecord(0, (2, 3, 4, 4), "float32", dims=("B", "H", "T", "T"))
    tensor_view.show_tensor(record, value)
    assert tensor_view.leading_index() == (1, 2)  # B=0, H=0 before
    assert np.isinf(tensor_view.heatmap.matrix).any()
    tensor_view.show_tensor(record, torch.zeros(2, 3, 4, 4))  # finite: stays where it went
    assert tensor_view.leading_index() == (1, 2)
    both = torch.zeros(2, 3, 4, 4)
    both[0, 0, 0, 0] = both[1, 2, 0, 0] = float("nan")
    tensor_view.set_leading_index((0, 0))
    tensor_view.show_tensor(record, both)
    assert tensor_view.leading_index() == (0, 0)  # the chosen slice holds one: kept


class TwoPrompts(torch.nn.Module):
    """One attention layer over a batch of two; batch element 1's input is non-finite."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, ids):
        x = self.embed(ids)
        x = torch.where(torch.arange(2)[:, None, None] == 1, x / 0.0, x)  # B=1: ±Inf, NaN
        out, _ = self.attn(x, x, x, need_weights=True, average_attn_weights=False)
        return out


def test_the_attention_panel_opens_on_the_batch_element_that_went_nonfinite(qtbot):
    torch.manual_seed(0)
    trace = tracing.trace(TwoPrompts().eval(), torch.randint(1, 16, (2, 5)))
    panel = AttentionPanel()
    qtbot.addWidget(panel)
    panel.set_trace(trace)
    if not panel.paths:
        pytest.skip("the tracer kept no attention maps of nn.MultiheadAttention here")
    assert panel.batch == 0
    panel.set_layer(0)  # stepping onto the layer, as the inspector does
    assert panel.batch == 1 and panel.batch_spin.value() == 1
    assert not torch.isfinite(panel.current_map()).all()
