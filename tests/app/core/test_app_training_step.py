"""The app on training-step traces: the backward phase on the step bar, value beside
gradient, boxes coloured by gradient norm, Next NaN/Inf and breakpoints on gradients,
File ▸ New trace of a training step."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.nonfinite_models import SqrtAtZero
from PySide6.QtCore import QSettings

import tracing
from app.core import session
from app.core.session import ModelSource, TraceRequest
from app.theme import GRAD_HIGH, GRAD_LOW
from app.windows.main_window import MainWindow
from tracing.analysis.gradients import layer_grad_norms, step_grad_norm

pytestmark = [pytest.mark.gui, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def demo_step():
    request = TraceRequest("hello there", ModelSource("preset", preset="demo"), "values", True)
    outcome = session.run_trace(request)
    assert outcome.status == "complete"
    return outcome.trace


@pytest.fixture
def window(qtbot, tmp_path):
    w = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    return w


def test_new_trace_of_a_training_step_records_the_backward(demo_step):
    t = demo_step
    assert t.backward_start is not None and t.meta["phase"] == "training step"
    assert len(t.meta["tokens"]) == len("hello there") - 1  # inputs: all but the last
    assert math.isfinite(t.meta["loss"])
    assert t.param_grad("lm_head.weight") is not None or t.meta["param_grads"]


def test_step_bar_shows_the_backward_as_a_second_phase(window, demo_step):
    window.set_trace(demo_step)
    strip = window.step_bar.phases
    assert strip.isVisible() and strip.backward_start == demo_step.backward_start
    back = next(s for s in demo_step.steps if s.kind == "backward" and s.forward is not None)
    window.go_to(back.index)
    assert strip.phase(window.current) == "backward" and strip.index == back.index
    fwd = demo_step.steps[back.forward]
    assert "∇" in window.status_text() and window.status_text().endswith(f"← {fwd.op}")
    # the diagram highlights the box of the forward step it differentiates
    assert window.diagram.highlighted_key == window.diagram.key_for_step(back.forward)
    window.set_trace(tracing.trace(SqrtAtZero(), torch.randn(2, 4)))  # forward only
    assert not strip.isVisible()


def test_gradient_tab_shows_value_and_gradient_side_by_side(window, demo_step):
    window.set_trace(demo_step)
    inspector = window.inspector
    inspector.tabs.setCurrentIndex(inspector.GRADIENT_TAB)
    panel = inspector.gradient
    # a forward op with a gradient: its output and that output's gradient
    op = next(
        s for s in demo_step.steps
        if s.kind == "op" and s.outputs and demo_step.grad(s.outputs[0]) is not None
        and len(demo_step.tensors[s.outputs[0]].shape) == 3
    )  # fmt: skip
    window.go_to(op.index)
    grad = demo_step.grad(op.outputs[0])
    assert panel.value_view.record.id == op.outputs[0]
    assert panel.grad_view.record.id == grad.id
    value = demo_step.value(grad.id)
    shown = panel.grad_view.heatmap.matrix
    assert torch.equal(torch.as_tensor(shown), value[0].float()) or shown.shape == value[0].shape
    norm = panel.table.item(1, 2).text()
    assert float(norm) == pytest.approx(float(value.double().norm()), rel=1e-3)
    # on the backward step of that op, the same pair
    back = next(s for s in demo_step.steps if s.kind == "backward" and s.outputs == (grad.id,))
    window.go_to(back.index)
    assert panel.value_view.record.id == op.outputs[0] and panel.grad_view.record.id == grad.id
    # the per-layer strip: one bar per layer with parameters
    assert list(layer_grad_norms(demo_step))[:2] == ["token_embedding", "position_encoding"]


def test_boxes_coloured_by_gradient_norm_on_a_log_scale(window, demo_step):
    window.set_trace(demo_step)
    window.grad_colour_action.trigger()
    tints = window.diagram.tints
    assert tints
    norms = {k: step_grad_norm(demo_step, k) for k in tints}
    lowest, highest = min(norms, key=norms.get), max(norms, key=norms.get)
    assert tints[lowest].name() == GRAD_LOW and tints[highest].name() == GRAD_HIGH
    window.grad_colour_action.trigger()
    assert not window.diagram.tints


def test_next_nonfinite_and_breakpoints_reach_gradients(window):
    torch.manual_seed(0)
    trace = tracing.trace_step(SqrtAtZero(), torch.randn(3, 4), lambda out: out.sum())
    window.set_trace(trace)
    window.run_to_nonfinite()  # the forward is finite: the first stop is a backward step
    assert trace.steps[window.current].kind == "backward"
    from app.panels.breakpoints import grad_norm_breakpoint

    bp = grad_norm_breakpoint(1e30)
    assert bp.kind == "grad" and bp.text == "‖∇‖ > 1e+30"
    assert tracing.find_next(trace, -1, [bp.condition]) == window.current  # Inf > 1e30


def test_the_readme_nan_loss_example_is_found_with_one_key(window, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
    try:
        from nan_loss import main
    finally:
        sys.path.pop(0)
    trace = main(str(tmp_path / "nan.trace"))
    assert trace is not None and trace.meta["watch"]["step"] == 3
    window.open_path(tmp_path / "nan.trace")
    window.nan_action.trigger()  # N, from the first step
    step = window.trace.steps[window.current]
    assert step.op == "log" and "probs.log()" in step.source.text
    assert "log" in tracing.first_nonfinite_gradient(window.trace).label


def test_the_loss_is_a_box_of_its_own_after_the_model(window, demo_step):
    """File ▸ New trace's next-token loss is the step `loss`: a frame in the diagram with
    its ops, a root row in the module tree, and the backward starts at its ops."""
    t = demo_step
    (loss,) = t.module_steps("loss")
    assert t.modules["loss"].type == "next_token_loss"
    window.set_trace(t)
    ops = [s for s in t.steps if s.parent == loss.index and s.kind == "op"]
    assert [s.op for s in ops] == ["flatten", "flatten", "cross_entropy"]
    window.go_to(ops[-1].index)
    assert window.diagram.highlighted_key == ops[-1].index  # the op's own box, inside
    window.go_to(loss.index)
    assert window.diagram.highlighted_key == loss.index
    assert window.status_text().endswith("loss · next_token_loss")
    assert window.tree.selected_path() == "loss"  # a root row of its own, selected
    first = t.steps[t.backward_start]  # NllLossBackward0 of the cross_entropy
    window.go_to(first.index)
    assert first.forward == ops[-1].index
    assert window.diagram.highlighted_key == window.diagram.key_for_step(ops[-1].index)
