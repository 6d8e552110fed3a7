"""The diagram's layout as plain geometry: laid out without Qt, checked by its shape.

The demo is laid out collapsed and fully expanded with a fixed-width text measurer (no
QApplication, no fonts), and the result must be a drawable diagram: boxes wide enough for
their text, no two boxes of a frame overlapping, every child inside its frame and below its
title, and every arrow leaving its source's bottom and entering its target's top, downwards.
"""

from __future__ import annotations

import pytest

from app.diagram.plan.geometry import Point, Rect, bounding, fixed_width_measure
from app.diagram.plan.layout import FRAME_TITLE, H_PAD, INPUT, OUTPUT, DiagramLayout
from app.diagram.plan.routing import RectIndex, detour_lane, edge_ends

MEASURE = fixed_width_measure(char_width=7.0, line_height=16.0)


@pytest.fixture(scope="module", params=["collapsed", "expanded"])
def layout(request, demo_stats) -> DiagramLayout:
    steps = demo_stats.steps
    if request.param == "collapsed":
        expanded = {s.index for s in steps if s.parent is None}
    else:
        expanded = {s.index for s in steps if s.kind == "module"}
    return DiagramLayout(demo_stats, expanded, MEASURE)


def test_the_expanded_demo_shows_every_op(demo_stats):
    every_module = {s.index for s in demo_stats.steps if s.kind == "module"}
    layout = DiagramLayout(demo_stats, every_module, MEASURE)
    forward_ops = [s.index for s in demo_stats.steps if s.kind == "op"]
    assert all(layout.owner_of(i) == i for i in forward_ops)
    assert len([n for n in layout.nodes.values() if n.frame]) == len(every_module)


def test_boxes_are_wide_enough_for_their_text(layout):
    for node in layout.nodes.values():
        if node.frame:
            title = MEASURE.title_width(layout.frame_title(node.key))
            assert node.rect.width >= title, node.title
            continue
        lines = [MEASURE.title_width(node.title), MEASURE.detail_width(node.shape)]
        if node.subtitle:
            lines.append(MEASURE.detail_width(node.subtitle))
        assert node.rect.width >= max(lines) + 2 * H_PAD, node.title
        assert node.rect.height >= (3 if node.subtitle else 2) * MEASURE.line_height


def test_no_two_boxes_of_a_frame_overlap(layout):
    groups: dict[int | None, list[Rect]] = {}
    for node in layout.nodes.values():
        groups.setdefault(node.parent, []).append(node.rect)
    assert len(layout.nodes) > 5
    for rects in groups.values():
        for i, a in enumerate(rects):
            for b in rects[i + 1 :]:
                assert not a.overlaps(b), (a, b)
    # boxes (not frames) overlap nothing anywhere, whatever their frame
    boxes = [n.rect for n in layout.nodes.values() if not n.frame]
    for i, a in enumerate(boxes):
        assert not any(a.overlaps(b) for b in boxes[i + 1 :])


def test_children_lie_inside_their_frame_below_its_title(layout):
    for node in layout.nodes.values():
        if node.parent is None:
            continue
        frame = layout.nodes[node.parent].rect
        assert frame.contains(node.rect), node.title
        assert node.rect.top >= frame.top + FRAME_TITLE, node.title
    assert bounding(n.rect for n in layout.nodes.values()) == layout.bounding_rect()


def test_edges_run_down_from_a_source_bottom_to_a_target_top(layout):
    assert layout.edges
    for u, v in layout.edges:
        src, dst = layout.nodes[u].rect, layout.nodes[v].rect
        start, end = edge_ends(src, dst)
        assert start == Point(src.left + src.width / 2, src.bottom)
        assert end == Point(dst.left + dst.width / 2, dst.top)
        assert src.left <= start.x <= src.right and dst.left <= end.x <= dst.right
        assert end.y > start.y, (layout.nodes[u].title, layout.nodes[v].title)
    sources = {u for u, _ in layout.edges}
    targets = {v for _, v in layout.edges}
    assert INPUT in sources and OUTPUT in targets
    assert layout.nodes[INPUT].rect.bottom <= min(
        n.rect.top for k, n in layout.nodes.items() if k != INPUT
    )


def test_a_detour_lane_clears_everything_beside_it():
    src, dst = Rect(0, 0, 100, 40), Rect(10, 200, 80, 40)
    band = [Rect(-30, 80, 200, 40), Rect(50, 130, 60, 30)]
    right = detour_lane(src, dst, band, +1)
    left = detour_lane(src, dst, band, -1)
    assert all(r.right < right for r in [*band, src, dst])
    assert all(r.left > left for r in [*band, src, dst])


def test_the_row_index_returns_exactly_the_rects_in_a_span():
    rects = {k: Rect(0, 70.0 * k, 50, 40) for k in range(40)}
    index = RectIndex(rects.items())
    for top, bottom in [(0, 10), (100, 400), (1000, 2000), (-50, 5000)]:
        expected = {k for k, r in rects.items() if r.top < bottom and r.bottom > top}
        assert {k for k, _ in index.between(top, bottom)} == expected
