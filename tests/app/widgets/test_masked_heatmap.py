"""Heatmaps that survive mask fills: the tutorial's ``masked_fill(mask == 0, -1e9)`` scores
show their real structure, the fills get their own colour and legend entry (also ±inf,
``finfo.min`` and a repeated ``-100``), and ordinary data (a 0/1 mask, an outlier, softmax
probabilities) is never called masked. Same in the compare view's A − B map."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.widgets.heatmap import MASKED_ARGB, HeatmapView
from app.widgets.masked_cells import masked_cells


def causal_scores(fill: float, t: int = 8) -> tuple[np.ndarray, np.ndarray]:
    torch.manual_seed(0)
    scores = torch.randn(t, t)
    keep = torch.tril(torch.ones(t, t)) == 1
    return scores.masked_fill(~keep, fill).numpy(), keep.numpy()


@pytest.mark.parametrize("fill", [-1e9, float("-inf"), torch.finfo(torch.float32).min, -100.0])
def test_mask_fills_are_found_exactly(fill):
    scores, keep = causal_scores(fill)
    cells = masked_cells(scores)
    assert cells is not None and np.array_equal(cells.where, ~keep)
    assert cells.values == (np.float32(fill).item(),)
    assert cells.legend().startswith("masked: ") and "(28 cells)" in cells.legend()


def test_ordinary_data_is_never_masked():
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    assert masked_cells(x.numpy()) is None
    assert masked_cells(torch.tril(torch.ones(8, 8)).numpy()) is None  # a 0/1 mask
    spike = x.clone()
    spike[2, 3] = 500.0  # one large activation is data
    assert masked_cells(spike.numpy()) is None
    probs = torch.softmax(torch.from_numpy(causal_scores(-1e9)[0]), -1)
    assert masked_cells(probs.numpy()) is None  # the zeros of a softmax are probabilities
    assert masked_cells(np.arange(6).reshape(2, 3)) is None  # integers


def test_large_matrix_uses_a_sample_and_still_marks_every_fill():
    scores, keep = causal_scores(-1e9, t=600)
    cells = masked_cells(scores)
    assert np.array_equal(cells.where, ~keep)


def test_heatmap_scales_on_the_data_and_paints_fills_their_own_colour(qtbot):
    view = HeatmapView()
    qtbot.addWidget(view)
    view.resize(400, 360)
    view.show()
    scores, keep = causal_scores(-1e9)
    view.set_matrix(scores, row_name="T", col_name="T")
    lo, hi = view.colorbar.levels()
    assert -10 < lo < 0 < hi < 10  # the real scores' range, not -1e9
    assert "masked: -1e+09 (28 cells)" in view.masked_legend
    assert view.is_masked(0, 7) and not view.is_masked(7, 0)
    assert view.hover_text(0, 7).endswith("(masked)")
    view.image_item.render()
    pixels = view.image_item._pixels
    assert (pixels[~keep] == np.uint32(MASKED_ARGB)).all()
    assert not (pixels[keep] == np.uint32(MASKED_ARGB)).any()
    view.set_matrix(np.random.default_rng(0).normal(size=(5, 5)))
    assert view.masked_legend == "" and not view.is_masked(0, 4)


def test_compare_difference_marks_cells_masked_in_either_trace(qtbot):
    view = HeatmapView()
    qtbot.addWidget(view)
    a, keep = causal_scores(-1e9)
    b = a * 1.01
    b[~keep] = -1e9
    view.set_matrix(a - b, scale="signed", masked=~keep)
    assert "28 cells" in view.masked_legend
    _, hi = view.colorbar.levels()
    assert hi < 1  # from the real differences (1 % of the scores)


def test_compare_view_of_the_tutorial_scores_marks_the_fills(qtbot):
    from helpers.own_models import TUTORIAL_FIXED, load

    import tracing
    from app.windows.compare_window import CompareWindow

    loaded = load(TUTORIAL_FIXED, "TutorialLM", shape=(1, 6))
    a = tracing.trace(loaded.model, *loaded.args, capture="values")
    with torch.no_grad():
        loaded.model.blocks[0].self_attn.W_q.weight.mul_(1.1)
    b = tracing.trace(loaded.model, *loaded.args, capture="values")
    window = CompareWindow(a, b, "a.sft", "b.sft")
    qtbot.addWidget(window)
    fill = next(s for s in a.steps if s.op == "masked_fill")
    window.go_to_step("a", fill.index)
    assert "15 cells" in window.difference_heatmap.masked_legend  # 6 * 5 / 2 per head
    _, hi = window.difference_heatmap.colorbar.levels()
    assert hi < 100  # the scores' differences, not a billion
