"""NaN, +Inf and −Inf are drawn, not hidden (issue 24, item 3): each gets a colour of its
own and a legend entry in every heatmap, the colour scale comes from the finite values,
and a matrix with no finite value says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.widgets.heatmap import MASKED_ARGB, HeatmapView
from app.widgets.nonfinite_cells import NAN_ARGB, NEGINF_ARGB, POSINF_ARGB, nonfinite_cells


@pytest.fixture
def view(qtbot):
    v = HeatmapView()
    qtbot.addWidget(v)
    v.resize(400, 360)
    v.show()
    return v


def _pixels(view: HeatmapView) -> np.ndarray:
    view.image_item.render()
    return view.image_item._pixels


def test_nan_and_infinities_have_their_own_colours_and_legend(view):
    torch.manual_seed(0)
    m = torch.randn(6, 6)
    m[1, 2] = m[3, 3] = float("nan")
    m[0, 5] = float("inf")
    m[4, 0] = float("-inf")
    view.set_matrix(m)
    finite = m[torch.isfinite(m)]
    top = float(finite.abs().max())
    lo, hi = view.colorbar.levels()
    assert lo == -hi and top <= hi < 2 * top  # from the finite values only
    pixels = _pixels(view)
    assert pixels[1, 2] == NAN_ARGB and pixels[3, 3] == NAN_ARGB
    assert pixels[0, 5] == POSINF_ARGB and pixels[4, 0] == NEGINF_ARGB
    ordinary = np.isfinite(m.numpy())
    assert not np.isin(pixels[ordinary], [NAN_ARGB, POSINF_ARGB, NEGINF_ARGB]).any()
    legend = view.masked_legend
    assert "NaN (2 cells)" in legend and "+Inf (1 cell)" in legend and "−Inf (1 cell)" in legend
    view.set_matrix(torch.randn(4, 4))  # a finite matrix: no legend, no colours
    assert view.masked_legend == ""
    assert view.image_item.nonfinite is None


def test_an_all_nan_tensor_reads_as_such(view):
    view.set_matrix(torch.full((8, 8), float("nan")))
    assert "all 64 cells NaN" in view.masked_legend
    assert (_pixels(view) == NAN_ARGB).all()
    mixed = torch.full((2, 2), float("nan"))
    mixed[0, 0] = float("inf")
    view.set_matrix(mixed)
    assert "no finite value" in view.masked_legend


def test_inf_mask_fills_are_named_as_inf_and_finite_fills_stay_masked(view):
    torch.manual_seed(0)
    keep = torch.tril(torch.ones(6, 6)) == 1
    view.set_matrix(torch.randn(6, 6).masked_fill(~keep, float("-inf")))
    pixels = _pixels(view)
    assert (pixels[~keep.numpy()] == NEGINF_ARGB).all()
    assert "−Inf (15 cells)" in view.masked_legend and "masked" not in view.masked_legend
    scores = torch.randn(6, 6).masked_fill(~keep, -1e9)
    scores[5, 0] = float("nan")
    view.set_matrix(scores)
    pixels = _pixels(view)
    assert (pixels[~keep.numpy()] == MASKED_ARGB).all() and pixels[5, 0] == NAN_ARGB
    assert (
        "masked: -1e+09 (15 cells)" in view.masked_legend and "NaN (1 cell)" in view.masked_legend
    )
    lo, hi = view.colorbar.levels()
    assert -10 < lo < 0 < hi < 10


def test_strided_matrices_keep_their_nonfinite_cells():
    m = np.zeros((4, 4), dtype=np.float32)
    m[0, 0] = np.nan
    cells = nonfinite_cells(m)
    assert cells is not None and cells.counts() == (1, 0, 0)
    pixels = np.zeros((2, 2), dtype=np.uint32)
    cells.paint(pixels, 2, 2)
    assert pixels[0, 0] == NAN_ARGB and (pixels.ravel()[1:] == 0).all()
    assert nonfinite_cells(np.arange(4.0)) is None and nonfinite_cells(np.arange(4)) is None
