"""The breakpoints panel over real traces of the demo model: run to next, enable, remove."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import trace_demo

import scratchformer
import tracing
from app.panels.breakpoints import BreakpointsDock, BreakpointsPanel
from tracing.breakpoints import MASK_OPS

INF_LAYER = "blocks.1.feed_forward.linear1"


@pytest.fixture(scope="module")
def inf_trace() -> tracing.Trace:
    """The demo model with one huge weight in block 1's first feed-forward layer: Inf there."""
    model = scratchformer.demo_model()
    with torch.no_grad():
        model.get_submodule(INF_LAYER).weight[3, :] = 1e38
    return trace_demo(model)


@pytest.fixture
def panel(qtbot) -> BreakpointsPanel:
    p = BreakpointsPanel()
    qtbot.addWidget(p)
    p.resize(360, 420)
    p.show()
    return p


def _first_nonfinite_op(trace: tracing.Trace) -> int:
    """Reference: the first op whose kept output holds a NaN, or an Inf not made by a mask."""
    for s in trace.steps:
        if s.kind != "op":
            continue
        for tid in s.outputs:
            v = trace.value(tid)
            if v is None or not v.is_floating_point():
                continue
            if torch.isnan(v).any() or (torch.isinf(v).any() and s.op not in MASK_OPS):
                return s.index
    raise AssertionError("the planted weight made no Inf")


def test_run_to_next_lands_on_the_op_that_made_the_inf(qtbot, panel, inf_trace):
    panel.set_trace(inf_trace)
    panel.add_nonfinite()
    expected = _first_nonfinite_op(inf_trace)
    assert inf_trace.steps[expected].module == INF_LAYER
    with qtbot.waitSignal(panel.stepRequested) as signal:
        assert panel.run_to_next() == expected
    assert signal.args == [expected]
    step = inf_trace.steps[expected]
    assert step.op == "linear"
    assert "Inf" in panel.last_hit.reason
    text = panel.result.text()
    assert INF_LAYER in text and str(step.source.line) in text  # names the op and its line
    assert panel.breakpoints[0].hits >= 1


def test_clean_trace_never_stops_on_the_causal_mask(panel, demo_values):
    masked = [s.index for s in demo_values.steps if s.op == "masked_fill"]
    assert masked and any(
        demo_values.tensors[demo_values.steps[i].outputs[0]].stats.inf for i in masked
    )
    panel.set_trace(demo_values)
    panel.add_nonfinite()
    assert panel.breakpoints[0].hits == 0
    assert panel.run_to_next() is None
    assert "No breakpoint holds" in panel.result.text()


def test_module_breakpoints_follow_the_current_step_and_run_in_order(qtbot, panel, demo_values):
    panel.set_trace(demo_values)
    ff0 = demo_values.module_steps("blocks.0.feed_forward")[0].index
    attn1 = demo_values.module_steps("blocks.1.self_attn")[0].index
    for index in (attn1, ff0):  # as if the user clicked these boxes
        panel.set_current_step(index)
        panel.add_current_module()
    assert [bp.text for bp in panel.breakpoints] == [
        "module blocks.1.self_attn",
        "module blocks.0.feed_forward",
    ]
    panel.set_current_step(0)
    assert panel.run_to_next() == ff0
    assert panel.run_to_next() == attn1
    assert panel.run_to_next() is None  # nothing after: says so, stays put
    assert panel.current == attn1
    assert panel.run_to_next() == ff0  # a second press searches from the start


def test_disable_and_remove(panel, demo_values):
    panel.set_trace(demo_values)
    softmaxes = [s.index for s in demo_values.steps if s.op == "softmax"]
    panel.add_op("softmax")
    panel.add_abs_above(1e30)  # never holds in a healthy model
    assert panel.breakpoints[0].hits == len(softmaxes) == 2
    assert panel.breakpoints[1].hits == 0
    assert panel.run_to_next() == softmaxes[0]
    panel.set_enabled(0, False)
    assert not panel.run_button.isEnabled() or panel.run_to_next() is None
    panel.set_enabled(0, True)
    assert panel.run_to_next() == softmaxes[1]
    panel.list.setCurrentIndex(panel.model.index(0))
    panel.remove_selected()
    assert [bp.kind for bp in panel.breakpoints] == ["abs"]
    panel.clear()
    assert panel.breakpoints == [] and not panel.run_button.isEnabled()
    with pytest.raises(ValueError, match="threshold"):
        panel.add_abs_above(-1)


def test_entropy_breakpoint_stops_at_a_sharp_attention_map(panel, demo_values):
    panel.set_trace(demo_values)
    panel.add_entropy_below(10.0)  # any row is sharper than 10 nats: the first map made
    first_map = next(  # the op that makes it (its module returns it only later)
        s.index
        for s in demo_values.steps
        if s.kind == "op" and any(demo_values.tensors[t].role == "attention" for t in s.outputs)
    )
    assert panel.run_to_next() == first_map
    panel.clear()
    panel.add_entropy_below(0.0)  # entropy is never negative
    panel.set_current_step(-1)
    assert panel.run_to_next() is None


def test_model_passes_qt_model_tester(qtmodeltester, panel, demo_values):
    panel.set_trace(demo_values)
    panel.add_nonfinite()
    panel.add_op("matmul")
    qtmodeltester.check(panel.model)


def test_dock_holds_the_panel(qtbot):
    dock = BreakpointsDock()
    qtbot.addWidget(dock)
    assert isinstance(dock.widget(), BreakpointsPanel)
    assert dock.panel.run_to_next() is None  # no trace: a message, no crash
    assert "No trace" in dock.panel.result.text()


def test_main_window_dock_drives_the_step(qtbot, tmp_path, inf_trace):
    from PySide6.QtCore import QSettings

    from app.windows.main_window import MainWindow

    window = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    window.set_trace(inf_trace)
    dock = window.breakpoints_dock
    assert dock.panel.trace is inf_trace and not dock.isVisible()
    dock.panel.add_nonfinite()
    dock.run_action.trigger()  # F5: shows the dock and runs
    expected = _first_nonfinite_op(inf_trace)
    assert dock.isVisible() and window.current == expected
    window.go_to(3)
    assert dock.panel.current == 3  # the panel follows the window
    dock.panel.set_current_step(expected)
    dock.panel.add_current_module()  # "+ Module" takes the current step's module
    assert dock.panel.breakpoints[-1].text == f"module {INF_LAYER}"
