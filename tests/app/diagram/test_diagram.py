"""The block diagram: visible boxes, data-flow edges, expand/collapse, highlight, export."""

from __future__ import annotations

import pytest
from helpers.app_fixtures import tiny_trace
from PySide6.QtCore import QPoint, Qt

from app.diagram.items import BoxItem, DiagramFonts, FrameItem, to_qrect
from app.diagram.plan.layout import INPUT, OUTPUT, DiagramLayout
from app.diagram.view import DiagramView


@pytest.fixture
def trace():
    return tiny_trace(n_layers=3)


def _first(trace, module, kind="module", op=None):
    return next(
        s.index
        for s in trace.steps
        if s.module == module and s.kind == kind and (op is None or s.op == op)
    )


@pytest.fixture
def view(qtbot, trace):
    view = DiagramView()
    qtbot.addWidget(view)
    view.resize(800, 700)
    view.set_trace(trace)
    return view


def test_blocks_start_collapsed_and_the_chain_is_connected(view, trace):
    layout = view.layout_
    blocks = [_first(trace, f"blocks.{i}") for i in range(3)]
    for b in blocks:
        assert b in layout.nodes and not layout.nodes[b].frame
        assert layout.nodes[b].expandable
        assert layout.nodes[b].shape == "(B, T, C)"
    # nothing inside a collapsed block is drawn
    assert _first(trace, "blocks.0.attn") not in layout.nodes
    edges = set(layout.edges)
    assert (blocks[0], blocks[1]) in edges and (blocks[1], blocks[2]) in edges
    assert (INPUT, _first(trace, "tok_emb")) in edges
    assert (_first(trace, "lm_head"), OUTPUT) in edges
    # layered top to bottom in data-flow order
    ys = [layout.nodes[k].rect.top for k in (INPUT, *blocks, OUTPUT)]
    assert ys == sorted(ys)


def test_expanded_block_shows_children_residuals_and_a_frame(view, trace):
    block = _first(trace, "blocks.1")
    view.expand(block)
    layout = view.layout_
    assert layout.nodes[block].frame
    kids = {k for k, n in layout.nodes.items() if n.parent == block}
    expected = {s.index for s in trace.steps if s.parent == block}
    assert kids == expected
    # the residual: the block's input (previous block's output) feeds both adds
    adds = [s.index for s in trace.steps if s.parent == block and s.op == "add"]
    previous = _first(trace, "blocks.0")
    assert (previous, _first(trace, "blocks.1.ln_1")) in layout.edges
    assert (previous, adds[0]) in layout.edges
    assert (adds[0], adds[1]) in layout.edges
    # children are inside the frame and do not overlap one another
    frame = layout.nodes[block].rect
    rects = [layout.nodes[k].rect for k in kids]
    for r in rects:
        assert frame.contains(r)
    for i, a in enumerate(rects):
        for b in rects[i + 1 :]:
            assert not a.overlaps(b)
    assert isinstance(view.items_by_key[block], FrameItem)


def test_double_click_expands_then_collapses(qtbot, view, trace):
    block = _first(trace, "blocks.2")
    item = view.items_by_key[block]
    assert isinstance(item, BoxItem)
    view.centerOn(item)

    def double_click_on(key: int) -> None:
        rect = view.items_by_key[key].sceneBoundingRect()
        point = view.mapFromScene(rect.left() + 30, rect.top() + 12)
        qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=point)

    double_click_on(block)
    qtbot.waitUntil(lambda: block in view.expanded and view.layout_.nodes[block].frame)
    assert isinstance(view.items_by_key[block], FrameItem)
    double_click_on(block)  # on the frame's title bar
    qtbot.waitUntil(lambda: block not in view.expanded)
    assert isinstance(view.items_by_key[block], BoxItem)


def test_click_asks_for_the_box_step(qtbot, view, trace):
    target = _first(trace, "ln_f")
    view.centerOn(view.items_by_key[target])
    rect = view.items_by_key[target].sceneBoundingRect()
    with qtbot.waitSignal(view.stepActivated) as blocker:
        qtbot.mouseClick(
            view.viewport(),
            Qt.MouseButton.LeftButton,
            pos=view.mapFromScene(rect.center()) + QPoint(0, 0),
        )
    assert blocker.args == [target]


def test_highlight_follows_the_step_to_the_visible_box(view, trace):
    softmax = _first(trace, "blocks.1.attn.sdpa", kind="op", op="softmax")
    block = _first(trace, "blocks.1")
    view.set_current(softmax)
    assert view.highlighted_key == block  # collapsed: its block lights up
    assert view.items_by_key[block].highlighted
    view.expand(_first(trace, "blocks.1.attn.sdpa"))
    assert view.highlighted_key == softmax  # now the op itself
    assert view.items_by_key[softmax].highlighted
    assert not view.items_by_key[block].highlighted
    view.set_current(softmax)  # the next step scrolls the box into view
    visible = view.mapToScene(view.viewport().rect()).boundingRect()
    assert visible.intersects(view.items_by_key[softmax].sceneBoundingRect())


def test_zoom_fit_and_export(tmp_path, view):
    before = view.zoom_level()
    view.zoom(1.5)
    assert view.zoom_level() == pytest.approx(before * 1.5)
    view.fit()
    rect = to_qrect(view.layout_.bounding_rect())
    visible = view.mapToScene(view.viewport().rect()).boundingRect()
    assert visible.contains(rect.center())
    png = view.export_image(tmp_path / "d.png")
    svg = view.export_image(tmp_path / "d.svg")
    from PySide6.QtGui import QImage

    image = QImage(str(png))
    assert image.width() > 100 and image.height() > 100
    assert "<svg" in svg.read_text()


def test_layout_for_a_gpt2_sized_stack_stays_compact(trace, qapp):
    from PySide6.QtGui import QFont

    big = tiny_trace(n_layers=12)
    layout = DiagramLayout(big, {0}, DiagramFonts(QFont()).measure)
    # 12 collapsed blocks + embeddings, final norm, head, input/output: a short column
    assert len(layout.nodes) < 25
    assert layout.bounding_rect().width < 700
