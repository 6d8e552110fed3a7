"""One CaptureOptions behind every entry point that captures.

The options are one dataclass; every entry point takes each of its fields as a keyword
with the same default (so an option added once cannot be missing from one of them), and
what ``trace_step`` took no ``edits`` before now does: checked against weight surgery.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F
from tiny_models import demo_ids

import tracing
from tracing.capture.edits import Edit, Zero
from tracing.capture.options import DEFAULT_VALUE_CAP, CaptureOptions
from tracing.runs.backward import record_step
from tracing.runs.generation import trace_generate

ENTRY_POINTS = [tracing.Tracer.__init__, tracing.trace, tracing.trace_step, record_step]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__qualname__)
def test_every_entry_point_takes_every_option_with_its_default(entry) -> None:
    params = inspect.signature(entry).parameters
    for field in dataclasses.fields(CaptureOptions):
        assert field.name in params, f"{entry.__qualname__} lacks {field.name}="
        assert params[field.name].default == field.default, (entry.__qualname__, field.name)
    assert params["options"].default is None


def test_generation_forwards_every_option_to_the_tracer() -> None:
    params = inspect.signature(trace_generate).parameters
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())  # ``**trace_kwargs``
    assert "capture" in params and "out" in params


def test_options_are_checked_once_and_combine_with_keywords() -> None:
    with pytest.raises(ValueError, match="capture must be one of"):
        CaptureOptions(capture="everything")
    with pytest.raises(TypeError, match="value_dtype"):
        CaptureOptions(value_dtype="float16")
    with pytest.raises(TypeError, match="unknown capture option"):
        CaptureOptions.of(valu_cap=3)
    base = CaptureOptions(capture="values", value_cap=10)
    merged = CaptureOptions.of(base, capture="stats", value_cap=DEFAULT_VALUE_CAP)
    # a keyword left at its default leaves ``base`` as it is; one that differs wins
    assert (merged.capture, merged.value_cap) == ("values", 10)
    assert CaptureOptions.of(base, capture="shapes").capture == "shapes"


def test_options_object_drives_a_trace(demo_model) -> None:
    demo, ids = demo_model, demo_ids()
    opts = CaptureOptions(capture="values", value_dtype=torch.float16, ops=False)
    t = tracing.trace(demo, ids, options=opts)
    assert t.meta["capture"] == "values"
    assert all(s.kind == "module" for s in t.steps)
    kept = [t.values[r.value_key] for r in t.tensors if r.value_key]
    assert kept and all(v.dtype in (torch.float16, torch.int64) for v in kept)


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def test_trace_step_applies_edits_like_weight_surgery(demo_model) -> None:
    demo, ids = demo_model, demo_ids()
    edited = copy.deepcopy(demo).train()
    surgery = copy.deepcopy(demo).train()
    with torch.no_grad():  # zeroing the FFN's output = zeroing its last linear layer
        surgery.blocks[0].feed_forward.linear2.weight.zero_()
        surgery.blocks[0].feed_forward.linear2.bias.zero_()
    for m in (edited, surgery):
        m.eval()  # no dropout: the two forwards must agree exactly
    t = tracing.trace_step(
        edited, ids, lambda out: _loss(out, ids), capture="stats",
        edits=[Edit("blocks.0.feed_forward", Zero())],
    )  # fmt: skip
    reference = _loss(surgery(ids), ids)
    reference.backward()
    assert t.meta["edits"], "the edit was applied and noted"
    loss_step = next(s for s in t.steps if s.module == "loss" and s.kind == "module")
    recorded = t.tensor(loss_step.outputs[0]).stats.mean
    assert recorded == pytest.approx(reference.item(), abs=1e-6)
    # the backward went through the edited forward: nothing reaches the first FFN's input
    # weights through the zeroed output (None: not even connected), as after the surgery
    g_edit = edited.blocks[0].feed_forward.linear1.weight.grad
    g_ref = surgery.blocks[0].feed_forward.linear1.weight.grad
    assert torch.count_nonzero(g_ref) == 0
    assert g_edit is None or torch.count_nonzero(g_edit) == 0
    later_edit = edited.blocks[1].feed_forward.linear1.weight.grad
    torch.testing.assert_close(later_edit, surgery.blocks[1].feed_forward.linear1.weight.grad)
