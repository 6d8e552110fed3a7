"""Folding repetition and paging long groups: the diagram of a 50,000-step trace stays small.

Three shapes that used to be walls of identical boxes (issue 14): a cell called in a loop,
a deep stack of identical blocks, and one module running thousands of ops. Each is traced
for real at a small size and laid out; the layout must fold what repeats, page what does
not, show the repetition holding the current step, and still connect input to output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import tracing
from app.diagram.plan.folding import FOLD_MIN, TraceIndex, find_runs
from app.diagram.plan.geometry import fixed_width_measure
from app.diagram.plan.layout import FOLD_BASE, INPUT, MAX_ITEMS, OUTPUT, DiagramLayout

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from bench_diagram_scale import Loop, Ops, Stack

# --------------------------------------------------------------------------- runs


def test_find_runs_prefers_the_longest_cover_and_the_shorter_period():
    assert find_runs([7] * 20, min_count=3) == [(0, 20, 1)]
    assert find_runs([1, 2] * 10, min_count=3) == [(0, 20, 2)]
    # a prefix that does not repeat stays out; the run starts where repetition starts
    assert find_runs([9, 8] + [1, 2, 3] * 4 + [5], min_count=3) == [(2, 14, 3)]
    assert find_runs([1, 2, 3, 4], min_count=2) == []
    assert find_runs([1, 1, 2, 2], min_count=3) == []


# --------------------------------------------------------------------------- shapes


def _trace(model, capture="shapes"):
    torch.manual_seed(0)
    return tracing.trace(model, torch.randn(1, 4, 8), capture=capture)


def _layout(trace, **kw):
    expanded = {s.index for s in trace.steps if s.parent is None}
    return DiagramLayout(trace, expanded, fixed_width_measure(), **kw)


def _connected(layout) -> bool:
    """Input reaches output through the drawn edges (frames enclose their children)."""
    succ: dict[int, set[int]] = {}
    for u, v in layout.edges:
        succ.setdefault(u, set()).add(v)
    seen, todo = {INPUT}, [INPUT]
    while todo:
        for v in succ.get(todo.pop(), ()):
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return OUTPUT in seen


def test_a_loop_folds_into_one_box_with_its_call_count():
    n = FOLD_MIN + 24
    trace = _trace(Loop(n), capture="stats")
    layout = _layout(trace)
    folds = [layout.nodes[k] for k in layout.folds]
    assert len(folds) == 1
    fold = folds[0]
    assert fold.title == f"cell × {n}" and fold.count == n
    assert "calls 1–" in fold.subtitle
    assert len(fold.spark) == min(n, 48)  # output RMS per call, from the statistics
    # every call's steps are owned by the fold; input -> fold -> output
    calls = [s.index for s in trace.steps if s.module == "cell" and s.kind == "module"]
    assert {layout.owner_of(i) for i in calls} == {fold.key}
    assert (INPUT, fold.key) in layout.edges and (fold.key, OUTPUT) in layout.edges
    assert len(layout.nodes) <= 5


def test_stepping_into_a_fold_shows_the_call_that_holds_the_step():
    trace = _trace(Loop(FOLD_MIN + 24))
    calls = [s.index for s in trace.steps if s.module == "cell" and s.kind == "module"]
    inner = next(i for i in range(calls[21], calls[22]) if trace.steps[i].op == "tanh")
    layout = _layout(trace, focus=inner)
    owner = layout.owner_of(inner)
    assert owner == calls[21]  # the call itself, as its own box
    assert not layout.needs_focus(inner)
    shown = [k for k in calls if k in layout.nodes]
    assert calls[21] in shown and len(shown) <= 4  # a short window of calls
    folds = sorted(layout.folds.values(), key=lambda r: r.start)
    assert len(folds) == 2 and folds[0].count + folds[1].count + len(shown) == len(calls)
    assert _connected(layout)
    # without the focus, the same step is hidden in the fold
    assert _layout(trace).needs_focus(inner)


def test_identical_sibling_blocks_fold_by_structure():
    n = FOLD_MIN + 4
    trace = _trace(Stack(n))
    layout = _layout(trace)
    (fold,) = [layout.nodes[k] for k in layout.folds]
    assert fold.title == f"blocks.0–{n - 1}"
    assert fold.subtitle == f"Block × {n}"
    assert _connected(layout)
    # blocks that differ in structure do not fold together
    index = TraceIndex(trace)
    blocks = [s.index for s in trace.steps if s.parent == 0]
    assert len({index.signature[b] for b in blocks}) == 1
    assert index.signature[blocks[0]] != index.signature[blocks[0] + 1]


def test_a_loop_of_ops_folds_by_its_period():
    trace = _trace(Ops(200))
    layout = _layout(trace)
    (fold,) = [layout.nodes[k] for k in layout.folds]
    assert fold.title == "[mul → add] × 200"
    assert _connected(layout)


def test_a_long_group_that_does_not_repeat_is_paged():
    class Mixed(torch.nn.Module):
        def forward(self, x):
            for i in range(300):  # a pattern of period 7: longer than folding looks for
                x = [torch.sin, torch.cos, torch.tanh, torch.exp, torch.sigmoid,
                     torch.relu, torch.neg][i % 7](x) * 0.5  # fmt: skip
            return x

    trace = _trace(Mixed())
    ops = [s.index for s in trace.steps if s.parent == 0]
    layout = _layout(trace)
    top = [k for k, n in layout.nodes.items() if n.parent == 0]
    assert len(top) <= MAX_ITEMS
    assert all(k <= FOLD_BASE for k in top)  # all pages
    assert all(layout.owner_of(i) in layout.nodes for i in ops)
    # the page holding the current step opens around it
    layout = _layout(trace, focus=ops[150])
    assert ops[150] in layout.nodes
    assert _connected(layout)
    # opening a page shows what it holds, paged again when still long
    page = next(r for k, r in layout.folds.items() if r.count > 2)
    opened = _layout(trace, focus=ops[150], open_folds={page})
    inside = [k for k, n in opened.nodes.items() if n.parent is not None and n.parent <= FOLD_BASE]
    assert inside and len(inside) <= MAX_ITEMS


def test_opening_a_fold_lays_out_its_calls():
    trace = _trace(Loop(FOLD_MIN * 20))
    layout = _layout(trace)
    (run,) = layout.folds.values()
    opened = _layout(trace, open_folds={run})
    frame = next(k for k, r in opened.folds.items() if r == run)
    assert opened.nodes[frame].frame
    kids = [k for k, n in opened.nodes.items() if n.parent == frame]
    assert 2 <= len(kids) <= MAX_ITEMS  # pages of calls, not 320 boxes
    assert _connected(opened)


def test_folding_can_be_turned_off():
    trace = _trace(Loop(FOLD_MIN + 2))
    layout = _layout(trace, fold=False)
    assert not layout.folds
    assert sum(
        1
        for s in trace.steps
        if s.module == "cell" and s.kind == "module" and s.index in layout.nodes
    ) == (FOLD_MIN + 2)


def test_view_steps_into_and_out_of_a_fold(qtbot):
    from app.diagram.view import DiagramView

    trace = _trace(Loop(FOLD_MIN + 24))
    view = DiagramView()
    qtbot.addWidget(view)
    view.resize(800, 600)
    view.set_trace(trace)
    calls = [s.index for s in trace.steps if s.module == "cell" and s.kind == "module"]
    assert len(view.layout_.folds) == 1
    view.set_current(calls[30] + 2)
    assert view.highlighted_key == calls[30]
    assert view.items_by_key[calls[30]].highlighted
    view.set_current(calls[2])
    assert view.highlighted_key == calls[2]
    # double-click equivalent on a fold opens it; again folds it
    key = next(iter(view.layout_.folds))
    run = view.layout_.folds[key]
    view.toggle(key)
    assert run in view.open_folds
    assert view.layout_.nodes[next(k for k, r in view.layout_.folds.items() if r == run)].frame
    view.set_fold_repetition(False)
    assert not view.layout_.folds
