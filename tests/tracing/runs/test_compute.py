"""Where the compute goes (issue 25): mult-adds and parameters per module from torchinfo,
run on the meta device, with totals equal to ``torchinfo.summary`` on the real model and
input; shown in the module tree, the inspector and the shape report."""

from __future__ import annotations

import pytest
import torch
import torchinfo
from torch import nn

import scratchformer
from tracing.analysis import report
from tracing.runs.compute import module_compute


def _demo():
    model = scratchformer.demo_model()
    ids = torch.tensor([scratchformer.ByteTokenizer().encode("wordplay|yalp")])
    return model, ids


def test_totals_equal_torchinfo_and_run_on_meta():
    model, ids = _demo()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    summary = module_compute(model, ids)
    expected = torchinfo.summary(model, input_data=[ids], verbose=0)
    assert summary.device == "meta"
    assert summary.total_mult_adds == expected.total_mult_adds > 0
    assert summary.total_params == expected.total_params
    root = summary.modules[""]
    assert (root.mult_adds, root.params) == (expected.total_mult_adds, expected.total_params)
    # the weights were never touched, and the model is where it was
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and after[k].device.type == "cpu" for k in before)
    # a subtree's mult-adds are the sum over its leaves, as torchinfo's rows have them
    leaves = {id(r.module): r.macs for r in expected.summary_list if r.is_leaf_layer and r.macs}
    block = dict(model.named_modules())["blocks.0"]
    inside = sum(macs for m in block.modules() for i, macs in leaves.items() if i == id(m))
    assert summary.modules["blocks.0"].mult_adds == inside > 0
    assert module_compute(model, ids) is summary  # once per model and input shape


def test_a_model_that_cannot_run_on_meta_is_summarised_on_its_device():
    class ItemBranch(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) if float(x.sum().item()) > -1e9 else x

    model, x = ItemBranch(), torch.randn(2, 4)
    summary = module_compute(model, x)
    expected = torchinfo.summary(model, input_data=[x], verbose=0)
    assert summary.device == "cpu" and summary.total_mult_adds == expected.total_mult_adds


@pytest.fixture(scope="module")
def live_trace():
    from app.core import session

    request = session.TraceRequest("wordplay|yalp", session.ModelSource("demo"))
    return session.run_trace(request).trace


def test_the_report_and_a_saved_trace_keep_them(live_trace, tmp_path):
    model, ids = _demo()
    expected = torchinfo.summary(model, input_data=[ids], verbose=0)
    assert live_trace.meta["compute"]["total_mult_adds"] == expected.total_mult_adds
    path = tmp_path / "t.sft"
    live_trace.save(path)
    from tracing.file.loading import load

    rep = report.compute(load(path))
    assert rep.summary["mult_adds"] == expected.total_mult_adds
    md = report.render(rep, "md")
    assert f"{expected.total_mult_adds:,}" in md and "| mult-adds |" in md


@pytest.mark.gui
def test_module_tree_and_inspector_show_them(qtbot, tmp_path, live_trace):
    from PySide6.QtCore import QSettings

    from app.windows.main_window import MainWindow

    w = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.set_trace(live_trace)
    macs = live_trace.meta["compute"]["modules"]["blocks.0.self_attn"][0]
    model = w.tree.model
    item = model.itemFromIndex(model.index_for_path("blocks.0.self_attn").siblingAtColumn(4))
    assert item.text() and not w.tree.view.isColumnHidden(4)
    assert f"{macs:,} mult-adds" in item.toolTip()
    w.jump_to(live_trace.module_steps("blocks.0.self_attn")[0].index)
    assert "mult-adds" in w.inspector._where.text()
    # the Output column is as wide as its widest shape: nothing clipped
    fm = w.tree.view.fontMetrics()
    widest = max(fm.horizontalAdvance(model.output_text(p)) for p in model._paths)
    assert w.tree.view.columnWidth(2) >= widest
