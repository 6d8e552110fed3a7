"""The loss of a training step is a forward step of its own: ``loss``, after the model.

A ``loss_fn`` given to ``trace_step`` is called inside the trace as a module-like step
(ops inside it, targets among its inputs, the loss as its output), and the backward
starts at its ops. Checked against the plain loss and plain autograd on a cross-entropy
over our model's logits, a Hugging Face model's dict output with labels, and a tuple
output.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import tiny_gpt2
from torch import nn

import tracing
from tracing.runs.backward import trace_step

pytestmark = pytest.mark.usefixtures("one_thread")


def _loss_step(trace):
    steps = trace.module_steps("loss")
    assert len(steps) == 1
    return steps[0]


def _check_loss_region(trace, loss_value, ops):
    """The `loss` step: after the model's call, top level, its ops inside, the loss out;
    the backward's first steps differentiate those ops."""
    root = trace.steps[0]
    step = _loss_step(trace)
    assert step.index == root.end + 1 and step.parent is None and step.depth == 0
    assert trace.modules["loss"].parent is None
    inside = [s for s in trace.steps if s.parent == step.index and s.kind == "op"]
    assert [s.op for s in inside] == ops
    assert step.end == inside[-1].index == trace.backward_start - 1
    (out,) = step.outputs
    assert trace.meta["loss"] == loss_value
    stats = trace.tensor(out).stats
    assert stats is not None and stats.mean == pytest.approx(loss_value)
    first = trace.steps[trace.backward_start]
    assert first.module == "loss" and trace.steps[first.forward].parent == step.index
    assert first.source == trace.steps[first.forward].source  # the loss_fn's own line
    # its gradient is d loss / d loss = 1, recorded as the gradient of the loss tensor
    grad = trace.grad(out)
    assert grad.shape == () and grad.stats.mean == 1.0
    return step


def test_cross_entropy_loss_is_a_step_with_its_ops():
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset("nano")).train()
    twin = copy.deepcopy(model)
    x = torch.randint(0, 50, (2, 9))
    y = torch.randint(0, 50, (2, 9))

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    torch.manual_seed(1)
    trace = trace_step(model, x, loss_fn, targets=y, capture="values")
    torch.manual_seed(1)
    logits = twin(x)
    logits.retain_grad()
    loss = loss_fn(logits, y)
    loss.backward()
    step = _check_loss_region(trace, float(loss.detach()), ["flatten", "flatten", "cross_entropy"])
    assert trace.modules["loss"].type == "loss_fn"
    # its inputs: the model's output (the logits record) and the targets
    assert step.input_names == ("output", "targets")
    logits_id, targets_id = step.inputs
    assert logits_id == trace.steps[0].outputs[0]
    assert trace.tensor(targets_id).role == "input"
    # the logits' gradient arrives through the loss ops, equal to plain autograd
    assert torch.equal(trace.value(trace.grad(logits_id).id), logits.grad)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_a_loss_module_and_a_dict_output_with_labels():
    """A Hugging Face model's dict output with labels, an nn.CrossEntropyLoss on the
    logits (the model's own `.loss` ignored)."""
    torch.manual_seed(0)
    model = tiny_gpt2(seed=None, train=True, n_embd=32, vocab_size=61)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 61, (2, 7))
    batch = {"input_ids": ids, "labels": ids}
    criterion = nn.CrossEntropyLoss()

    def loss_fn(out, labels):
        return criterion(out["logits"][:, :-1].flatten(0, 1), labels[:, 1:].flatten())

    torch.manual_seed(1)
    trace = trace_step(model, batch, loss_fn, targets=ids, capture="stats")
    torch.manual_seed(1)
    loss = loss_fn(twin(**batch), ids)
    loss.backward()
    step = _check_loss_region(
        trace, float(loss.detach()), ["getitem", "flatten", "getitem", "flatten", "cross_entropy"],
    )  # fmt: skip
    # the whole output (loss, logits...) and the labels are the loss step's inputs
    assert "output['logits']" in step.input_names and step.input_names[-1] == "targets"
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad), name


class TwoHeads(nn.Module):
    """Returns a tuple (logits, auxiliary) that the loss combines."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)
        self.aux = nn.Linear(6, 1)

    def forward(self, x):
        h = self.body(x).relu()
        return self.head(h), self.aux(h)


def test_tuple_output_and_a_model_with_its_own_loss_module(tmp_path):
    torch.manual_seed(0)
    model = TwoHeads()
    model.loss = nn.Identity()  # a submodule called `loss`: the loss step takes another name
    x, y = torch.randn(4, 6), torch.tensor([0, 2, 1, 0])

    def combined(out, labels):
        logits, aux = out
        return F.cross_entropy(logits, labels) + 0.1 * aux.square().mean()

    trace = trace_step(model, x, combined, targets=y, capture="values")
    steps = trace.module_steps("loss_fn")
    assert len(steps) == 1 and not trace.module_steps("loss")
    step = steps[0]
    assert step.input_names == ("output[0]", "output[1]", "targets")
    assert trace.modules["loss_fn"].type == "combined"
    ops = [s.op for s in trace.steps if s.parent == step.index and s.kind == "op"]
    assert ops == ["cross_entropy", "square", "mean", "mul", "add"]
    # every backward step of a loss op points into the loss step
    loss_backward = [s for s in trace.steps if s.kind == "backward" and s.module == "loss_fn"]
    assert {trace.steps[s.forward].parent for s in loss_backward} == {step.index}
    # the file keeps the loss step and its module
    trace.save(tmp_path / "t.trace")
    loaded = tracing.load(tmp_path / "t.trace")
    assert loaded.modules["loss_fn"] == trace.modules["loss_fn"]
    assert [s.module for s in loaded.steps] == [s.module for s in trace.steps]


def test_a_failing_loss_points_at_its_op():
    torch.manual_seed(0)
    model = TwoHeads()
    with pytest.raises(tracing.TraceError, match=r"loss · cross_entropy") as info:
        trace_step(model, torch.randn(4, 6), lambda out: F.cross_entropy(out[0], out[1]))
    trace = info.value.trace
    assert trace.failure is not None and trace.steps[trace.failure.step].module == "loss"
    assert not any(s.kind == "backward" for s in trace.steps)
    assert all(p.grad is None for p in model.parameters())


def test_without_loss_fn_the_model_s_own_loss_needs_no_step():
    torch.manual_seed(0)
    model = tiny_gpt2(seed=None, train=True)
    ids = torch.randint(0, 97, (1, 6))
    trace = trace_step(model, {"input_ids": ids, "labels": ids})
    assert not trace.module_steps("loss") and "loss" not in trace.modules
    first = trace.steps[trace.backward_start]  # the model's own loss op, inside its call
    assert first.forward is not None and first.forward <= trace.steps[0].end
