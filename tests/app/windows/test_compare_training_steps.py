"""The compare window on two training-step traces of the demo: both phases, gradients.

Trace A is a training step of the trained demo on its prompt (next-token cross-entropy);
trace B the same step with one weight of block 1's feed-forward nudged. The reference
for what differs is the traces' own kept values, compared here with ``torch.equal``.
"""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import demo_ids

import scratchformer
import tracing
from app.core.session import next_token_loss
from app.diagram.divergence import DivergenceMark
from app.windows.compare_window import CompareWindow

CHANGED = "blocks.1.feed_forward.linear2"


def _training_step(model) -> tracing.Trace:
    ids = demo_ids(scratchformer.DEMO_PROMPT)
    meta = {"tokens": ids[0, :-1].tolist(), "text": scratchformer.DEMO_PROMPT}
    return tracing.trace_step(
        model, ids[:, :-1], next_token_loss, targets=ids[:, 1:], capture="values", meta=meta
    )


@pytest.fixture(scope="module")
def steps():
    model = scratchformer.demo_model().train()
    a = _training_step(model)
    model.zero_grad()
    with torch.no_grad():
        model.get_submodule(CHANGED).weight[3, 11] += 0.5
    b = _training_step(model)
    return a, b


def _differs(trace_a, trace_b, index: int) -> bool:
    """Whether step ``index`` kept different values in A and B (same structure)."""
    for ra, rb in zip(trace_a.steps[index].outputs, trace_b.steps[index].outputs):
        va, vb = trace_a.value(ra), trace_b.value(rb)
        if va is not None and vb is not None and not torch.equal(va, vb):
            return True
    return False


@pytest.fixture
def window(qtbot, steps):
    w = CompareWindow(*steps, "lr.trace", "nudged.trace")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    return w


def test_steps_through_the_forward_then_the_backward(window, steps):
    a, b = steps
    assert a.backward_start == b.backward_start  # the same structure
    phases = window.step_bar.phases
    assert phases.isVisible()
    first_backward = next(i for i, e in enumerate(window.entries) if e.kind == "backward")
    assert phases.backward_start == first_backward
    assert all(e.kind == "backward" for e in window.entries[first_backward:])
    assert window.entries[first_backward].a_index == a.backward_start
    # stepping over the boundary: both diagrams follow, the phase strip moves with them
    window.go_to(first_backward - 1)
    assert phases.phase(phases.index) == "forward"
    window.next()
    e = window.current_entry
    assert e.kind == "backward" and phases.phase(phases.index) == "backward"
    assert window.diagram_a.current_step == a.backward_start
    assert window.diagram_b.current_step == b.backward_start
    assert "∇" in window.step_bar.status.text()  # the status says it is a gradient


def test_shows_the_gradient_difference_of_a_backward_step(window, steps):
    a, b = steps
    backward = [i for i, e in enumerate(window.entries) if e.kind == "backward"]
    pos = next(
        i
        for i in backward
        if window.entries[i].a_index is not None
        and a.value(a.steps[window.entries[i].a_index].outputs[0]) is not None
        and _differs(a, b, window.entries[i].a_index)
    )
    window.go_to(pos)
    e = window.current_entry
    grad_a = a.value(a.steps[e.a_index].outputs[0])
    grad_b = b.value(b.steps[e.b_index].outputs[0])
    assert a.tensors[a.steps[e.a_index].outputs[0]].role == "grad"
    # A − B is the difference of the two gradients, and the table says so
    assert torch.equal(window._difference, grad_a - grad_b)
    assert window.difference_heatmap.matrix is not None
    assert "max |A − B|" in window.difference_caption.text()
    assert window.metrics.item(0, 0).text().startswith("∇")
    rel = float(window.metrics.item(0, 4).text())
    expected = float((grad_a - grad_b).double().norm() / grad_a.double().norm())
    assert rel == pytest.approx(expected, rel=1e-2)


def test_jumps_to_the_first_divergent_backward_step(window, steps):
    a, b = steps
    # the reference: the first backward step whose kept gradient differs
    expected = next(i for i in range(a.backward_start, len(a.steps)) if _differs(a, b, i))
    window.go_to(0)
    assert window.first_backward_button.isEnabled()
    window.first_backward_button.click()
    e = window.current_entry
    assert e.kind == "backward" and e.a_index == expected
    assert "first divergent gradient" in window.summary.text().lower()
    # the overall first divergence is still the forward op that used the weight first
    first = window.first
    assert first.kind == "op" and a.steps[first.a_index].module == CHANGED


def _rel_l2(a, b) -> float:
    return float((a.double() - b.double()).norm() / a.double().norm())


def test_in_the_backward_phase_the_rings_say_how_the_gradients_differ(window, steps):
    a, b = steps
    head = a.module_steps("lm_head")[0]
    forward_score = window.box_score("a", head.index)[0]
    # reference: the largest relative L2 of a kept gradient of a step inside the call
    inside = [
        s for s in a.steps[a.backward_start :] if s.forward is not None
        and head.index < s.forward <= head.end
    ]  # fmt: skip
    scores = []
    for s in inside:
        for ra, rb in zip(s.outputs, b.steps[s.index].outputs):
            va, vb = a.value(ra), b.value(rb)
            if va is not None and vb is not None and va.norm() > 0:
                scores.append(_rel_l2(va, vb))
    assert scores
    window.go_to(window.backward_position)
    assert window.showing_gradients
    assert window.legend.title == window.legend.GRADIENT_TITLE
    grad_score = window.box_score("a", head.index)[0]
    assert grad_score == pytest.approx(max(scores), rel=1e-3)
    assert window.overlay_a.marks[head.index].score == grad_score
    for key, item in window.diagram_a.items_by_key.items():  # one mark a box, no stale one
        marks = [c for c in item.childItems() if isinstance(c, DivergenceMark)]
        assert len(marks) == (key in window.overlay_a.marks), key
    # a box no gradient reached (the flatten of the integer targets) has no ring now
    loss = a.module_steps("loss")[0]
    targets = next(
        s.index for s in a.steps if s.parent == loss.index and s.kind == "op"
        and a.tensors[s.outputs[0]].dtype == "int64"
    )  # fmt: skip
    assert targets in window.diagram_a.items_by_key and targets not in window.overlay_a.marks
    window.go_to(window.backward_position - 1)  # back in the forward: the outputs again
    assert not window.showing_gradients
    assert window.box_score("a", head.index)[0] == forward_score
    assert window.overlay_a.marks[targets].score == 0  # its output is the same in both
