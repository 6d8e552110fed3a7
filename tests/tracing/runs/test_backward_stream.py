"""``trace_step(..., out=PATH)``: a training step streamed to its file as it records.

Forward values and gradients go to the file as they are produced (the same writer as
``tracing.trace(..., out=PATH)``); the returned trace reads them lazily; a step that
raises leaves a valid partial file. That memory stays flat is measured, not tested:
``benchmarks/bench_training_step.py --memory``.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracing
from tracing.file.lazy_values import LazyValues
from tracing.runs.backward import trace_step

pytestmark = pytest.mark.usefixtures("one_thread")


def _ours():
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    config = ModelConfig.preset("nano", dropout=0.1)
    return DecoderOnlyTransformer(config).train()


def _same(a, b) -> None:
    """The same steps, records and values; the same gradients of the parameters."""
    assert [(s.kind, s.module, s.op, s.forward, s.outputs) for s in a.steps] == [
        (s.kind, s.module, s.op, s.forward, s.outputs) for s in b.steps
    ]
    assert [(r.shape, r.stats, r.role, r.grad_of) for r in a.tensors] == [
        (r.shape, r.stats, r.role, r.grad_of) for r in b.tensors
    ]
    kept = 0
    for ra in a.tensors:
        va, vb = a.value(ra.id), b.value(ra.id)
        assert (va is None) == (vb is None), ra
        if va is not None:
            assert torch.equal(va, vb), ra
            kept += ra.role == "grad"
    assert kept > 10  # gradients among them
    assert a.meta["param_grads"] == b.meta["param_grads"]


@pytest.mark.parametrize("value_dtype", [None, torch.float16])
def test_a_streamed_training_step_equals_one_kept_in_memory(tmp_path, value_dtype):
    torch.manual_seed(0)
    model = _ours()
    twin = copy.deepcopy(model)
    x, y = torch.randint(0, 50, (2, 9)), torch.randint(0, 50, (2, 9))
    loss_fn = lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten())  # noqa: E731
    runs = []
    for m, out in ((model, None), (twin, tmp_path / "step.sft")):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        torch.manual_seed(1)
        trace = trace_step(
            m, x, loss_fn, opt, targets=y, capture="values", value_dtype=value_dtype, out=out
        )
        runs.append(trace)
    memory, streamed = runs
    assert isinstance(streamed.values, LazyValues)  # read from the file, not held
    _same(memory, streamed)
    assert streamed.meta["update_ratios"] == memory.meta["update_ratios"]
    assert streamed.meta["loss"] == memory.meta["loss"]
    loaded = tracing.load(tmp_path / "step.sft")
    _same(memory, loaded)
    assert loaded.meta["update_ratios"] == memory.meta["update_ratios"]
    for p, q in zip(model.parameters(), twin.parameters()):  # the same step was taken
        assert torch.equal(p, q)
    assert sorted(os.listdir(tmp_path)) == ["step.sft"]  # no temporary left behind


def test_gradients_reach_the_file_while_the_backward_runs(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Linear(64, 1))
    sizes = []

    def measure(grad):
        partial = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
        sizes.append(partial[0].stat().st_size)

    for p in model.parameters():
        p.register_hook(measure)
    trace_step(model, torch.randn(32, 64), lambda o: o.sum(), capture="values", out=tmp_path / "s")
    assert len(sizes) == 6 and sizes == sorted(sizes) and sizes[-1] > sizes[0]


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("boom in the backward")


class BadBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.last = nn.Linear(4, 4)

    def forward(self, x):
        return self.last(_FailsInBackward.apply(self.first(x)))


def test_a_step_that_raises_in_the_backward_leaves_a_valid_partial_file(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "bad.sft"
    with pytest.raises(tracing.TraceError, match="boom in the backward") as info:
        trace_step(BadBackward(), torch.randn(3, 4), lambda o: o.sum(), capture="values", out=path)
    loaded = tracing.load(path)
    assert not loaded.complete and "boom in the backward" in loaded.error
    assert loaded.backward_start is not None  # the backward steps before the failure
    grad = loaded.param_grad("last.weight")
    assert grad is not None
    assert torch.equal(loaded.value(grad.id), info.value.trace.value(grad.id))
    assert sorted(os.listdir(tmp_path)) == ["bad.sft"]


def test_a_step_whose_forward_raises_leaves_the_forward_so_far(tmp_path):
    path = tmp_path / "bad.sft"
    model = nn.Linear(4, 4)
    with pytest.raises(tracing.TraceError, match="mat1 and mat2"):
        trace_step(model, torch.randn(3, 5), lambda o: o.sum(), capture="values", out=path)
    loaded = tracing.load(path)
    assert not loaded.complete and loaded.backward_start is None
    assert loaded.failure is not None and loaded.steps[loaded.failure.step].op == "linear"
