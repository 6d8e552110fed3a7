"""HeatmapView: row-major orientation, token labels, colours, hover, downsampling, export."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PySide6.QtCore import QPointF

from app.theme import PROBABILITY_CMAP, SEQUENTIAL_CMAP, SIGNED_CMAP, SIGNED_CMAP_DARK
from app.widgets.heatmap import (
    HeatmapView,
    colormap,
    nice_ceiling,
    token_every,
    token_ticks,
)
from app.widgets.nonfinite_cells import NAN_COLOUR
from app.widgets.tensor_view import as_matrix, token_label

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def view(qtbot) -> HeatmapView:
    widget = HeatmapView()
    qtbot.addWidget(widget)
    widget.resize(480, 400)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def _tick_labels(axis) -> list[str]:
    """Every label handed to the axis with setTicks, in index order."""
    ticks = sorted(t for level in (axis._tickLevels or []) for t in level)
    return [label for _pos, label in ticks]


def test_image_is_row_major_with_row_zero_on_top(view, qtbot):
    # non-symmetric: value = 10 * row + col, 3 rows x 4 columns
    m = np.arange(3)[:, None] * 10.0 + np.arange(4)[None, :]
    view.set_matrix(m)
    qtbot.wait(20)  # let the layout settle so scene geometry is final
    image = view.image_item
    assert image.axisOrder == "row-major"
    np.testing.assert_array_equal(image.image, m)  # image[r, c] is m[r, c], not transposed
    assert view.plot_item.getViewBox().yInverted()

    # pixel centre of (row, col) maps to screen: rows go down, columns go right
    def screen(row: int, col: int) -> QPointF:
        return image.mapToScene(QPointF(col + 0.5, row + 0.5))

    assert screen(0, 0).y() < screen(1, 0).y() < screen(2, 0).y()
    assert screen(0, 0).x() < screen(0, 1).x() < screen(0, 3).x()
    assert view.cell_at_scene_pos(screen(2, 1)) == (2, 1)
    assert view.value_at(2, 1) == 21.0

    # what is painted: sample the rendered widget at each cell's centre
    canvas = view._canvas
    picture = canvas.grab().toImage()
    cmap = colormap(view.colormap_name)
    lo, hi = view.colorbar.levels()
    for row, col in ((0, 0), (0, 3), (2, 0), (2, 3)):
        p = canvas.mapFromScene(screen(row, col))
        got = picture.pixelColor(p)
        want = cmap.map((m[row, col] - lo) / (hi - lo), mode="qcolor")
        assert abs(got.red() - want.red()) < 8, (row, col)
        assert abs(got.green() - want.green()) < 8, (row, col)
        assert abs(got.blue() - want.blue()) < 8, (row, col)


def test_token_labels_on_both_axes(view):
    tokens = [token_label(b) for b in b"ab c\n"]
    assert tokens == ["a", "b", "␣", "c", "\\n"]
    view.set_matrix(np.eye(5), row_labels=tokens, col_labels=tokens)
    assert _tick_labels(view.row_axis) == tokens
    assert _tick_labels(view.col_axis) == tokens
    # ticks sit at the centre of each index
    positions = sorted(p for level in view.row_axis._tickLevels for p, _ in level)
    assert positions == [i + 0.5 for i in range(5)]
    view.set_matrix(np.eye(5))  # no labels: numeric ticks again
    assert view.row_axis._tickLevels is None


def test_token_ticks_and_spacing():
    labels = [f"t{i}" for i in range(40)]
    assert token_ticks(labels, 0, 40, 16) == [[(0.5, "t0"), (16.5, "t16"), (32.5, "t32")]]
    assert token_ticks(labels, 10.2, 13.7) == [[(i + 0.5, f"t{i}") for i in range(10, 15)]]
    # 256 tokens on 300 pixels, labels 14 px apart: every 16th (16 * 300 / 256 >= 14)
    assert token_every(256, 300, 14) == 16
    assert token_every(8, 300, 14) == 1


def test_many_tokens_get_only_the_labels_that_fit(view, qtbot):
    tokens = [token_label(b) for b in (b"abcdefgh" * 32)]  # 256 tokens
    view.set_matrix(np.zeros((256, 256)), row_labels=tokens, col_labels=tokens)
    qtbot.wait(20)
    shown = [t for level in view.row_axis._tickLevels for t in level]
    assert 4 <= len(shown) <= 40  # a few hundred pixels cannot hold 256 labels
    for position, label in shown:  # each label sits on its own token
        assert label == tokens[int(position)] and position % 1 == 0.5
    # zoomed in on rows 100..110 every token is labelled
    view.plot_item.getViewBox().setRange(yRange=(100, 110), padding=0)
    qtbot.wait(20)
    rows = sorted(int(p) for level in view.row_axis._tickLevels for p, _ in level)
    assert set(range(100, 110)) <= set(rows)


def test_colour_maps_follow_the_data(view):
    view.set_matrix(np.array([[-1.0, 2.7], [0.5, 2.0]]))
    # the diverging map's centre follows the theme (an earlier test may have set a dark one)
    assert view.colormap_name == view.signed_colormap
    assert view.signed_colormap in (SIGNED_CMAP, SIGNED_CMAP_DARK)
    assert view.colorbar.levels() == (-3.0, 3.0)  # symmetric (white is 0), round ends
    view.set_matrix(np.array([[0.0, 3.0], [0.5, 2.0]]))
    assert view.colormap_name == SEQUENTIAL_CMAP
    assert view.colorbar.levels() == (0.0, 3.0)
    view.set_matrix(np.array([[0.2, 0.7], [0.6, 0.4]]), scale="probability")
    assert view.colormap_name == PROBABILITY_CMAP
    assert view.colorbar.levels() == pytest.approx((0.0, 0.8))


def test_nice_ceiling():
    assert [nice_ceiling(x) for x in (0.7, 1.0, 1.01, 2.6, 7.0, 0.0123, 950)] == pytest.approx(
        [0.8, 1.0, 1.2, 3.0, 8.0, 0.015, 1000]
    )
    assert nice_ceiling(0.0) == 1.0 and nice_ceiling(float("nan")) == 1.0


def test_nonfinite_values_do_not_break_levels(view):
    m = torch.tensor([[1.0, float("nan")], [float("-inf"), -2.0]])
    view.set_matrix(m)
    assert view.colorbar.levels() == (-2.0, 2.0)
    assert np.isnan(view.image_item.image).sum() == 2  # off the scale (painted over)
    assert view.value_at(1, 0) == float("-inf")  # hover reports the real value


def test_huge_matrix_is_strided_for_display_but_hover_reads_full(view, qtbot):
    m = torch.arange(3000 * 5, dtype=torch.float32).reshape(3000, 5)
    view.set_matrix(m)
    qtbot.wait(20)
    rows_shown = view.image_item.image.shape[0]
    assert rows_shown <= 768 and view.stride == (4, 1)
    np.testing.assert_array_equal(view.image_item.image, m.numpy()[::4])
    # the image still spans all 3000 rows in index units
    bounds = view.image_item.mapRectToParent(view.image_item.boundingRect())
    assert bounds.height() == pytest.approx(3000, abs=4)
    assert view.value_at(2999, 4) == 2999 * 5 + 4
    cell = view.cell_at_scene_pos(view.image_item.mapToScene(QPointF(4.5, 1499.5 / 4)))
    assert cell is not None and cell[1] == 4 and abs(cell[0] - 1499) <= 1


def test_image_is_coloured_at_about_screen_resolution(view, qtbot):
    # 700 columns on a plot about 200 pixels wide, a NaN in row 1
    view.resize(300, 300)
    m = np.tile(np.linspace(-1.0, 1.0, 700, dtype=np.float32), (3, 1))
    m[1, 0] = np.nan
    view.set_matrix(m)
    qtbot.wait(20)
    assert view.plot_item.getViewBox().width() < 350
    view._canvas.grab()  # a paint renders the image
    item = view.image_item
    qimage = item.qimage
    plot_pixels = view.plot_item.getViewBox().width()
    assert qimage.width() < 700 and qimage.width() >= plot_pixels / 2
    step = round(700 / qimage.width())
    assert qimage.width() == -(-700 // step)  # every step-th column
    cmap = colormap(view.colormap_name)
    lo, hi = view.colorbar.levels()
    for x in (0, qimage.width() // 2, qimage.width() - 1):
        got = qimage.pixelColor(x, 0)
        want = cmap.map((m[0, x * step] - lo) / (hi - lo), mode="qcolor")
        assert abs(got.red() - want.red()) < 8 and abs(got.blue() - want.blue()) < 8, x
    assert qimage.pixelColor(0, 1).name() == NAN_COLOUR  # NaN: its own colour
    # zoomed in on 100 columns, every column is drawn again
    view.plot_item.getViewBox().setRange(xRange=(0, 100), padding=0)
    qtbot.wait(20)
    view._canvas.grab()
    assert item.qimage.width() == 700


def test_hover_text_names_axes_tokens_and_value(view, qtbot):
    view.set_matrix(
        np.array([[0.1, 0.9], [0.3, 0.7]]),
        row_labels=["h", "i"],
        col_labels=["h", "i"],
        row_name="query",
        col_name="key",
    )
    qtbot.wait(20)
    assert view.hover_text(1, 0) == "query 1 'i' · key 0 'h' = 0.3"
    emitted = []
    view.hovered.connect(lambda r, c, v: emitted.append((r, c, v)))
    view._on_mouse_moved(view.image_item.mapToScene(QPointF(1.5, 0.5)))
    assert emitted == [(0, 1, pytest.approx(0.9))]


def test_message_replaces_plot(view):
    view.show_message("Values were not captured.")
    assert view.message == "Values were not captured."
    assert view.matrix is None
    view.set_matrix(np.ones((2, 2)))
    assert view.message == ""


def test_rejects_non_2d(view):
    with pytest.raises(ValueError, match="2-D"):
        view.set_matrix(np.ones((2, 2, 2)))


def test_export_png_and_svg(view, tmp_path):
    view.set_matrix(np.random.default_rng(0).normal(size=(6, 9)))
    png = view.export(tmp_path / "map.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    svg = view.export(tmp_path / "map.svg")
    text = svg.read_text()
    assert "<svg" in text and svg.stat().st_size > 1000
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        view.export(tmp_path / "map.txt")


def test_as_matrix_cuts_leading_axes():
    x = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    torch.testing.assert_close(as_matrix(x, (1, 2)), x[1, 2])
    assert as_matrix(torch.arange(7), ()).shape == (1, 7)
    with pytest.raises(IndexError, match="out of range"):
        as_matrix(x, (2, 0))
    with pytest.raises(ValueError, match="scalar"):
        as_matrix(torch.tensor(1.0), ())


def test_heatmap_demo_example_runs(qapp, tmp_path):
    spec = importlib.util.spec_from_file_location(
        "heatmap_demo", REPO / "examples" / "heatmap_demo.py"
    )
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    # the example's own map: causal, rows sum to 1
    a = demo.example_attention("abcd")
    torch.testing.assert_close(a.sum(-1), torch.ones(4))
    assert (a.triu(diagonal=1) == 0).all()
    out = tmp_path / "demo.png"
    assert demo.main(["--text", "abcd", "--screenshot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000


def test_transposed_matrix_paints(view, qtbot):
    """A Fortran-ordered matrix (a transposed view) must paint, not fail in paint()."""
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4).T  # (4, 3), not C-contiguous
    assert not matrix.flags.c_contiguous
    view.set_matrix(matrix)
    view.resize(300, 300)
    view.show()
    qtbot.waitExposed(view)
    view.image_item.render()  # what paint() does first; it raised BufferError before
    assert view.image_item.qimage is not None
    assert view.grab().width() > 0
