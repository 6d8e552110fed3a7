"""A traced training step records the gradients plain autograd computes, bit for bit.

The reference is an untraced run of a copy of the same model from the same random state:
``retain_grad()`` on the tensors compared (module outputs via forward hooks, or named
intermediates a test model keeps), ``.grad`` of the parameters, and the optimizer state
after ``step()``. Models: ours, a Hugging Face GPT-2 built from a config, and
``nn.TransformerDecoder`` (nobody here wrote it), plus small models for tied weights,
in-place ops, ``no_grad`` regions, a module called twice and ``torch.utils.checkpoint``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from helpers.nonfinite_models import NaiveLogSoftmax, SqrtAtZero
from helpers.own_models import TUTORIAL_FIXED
from helpers.tiny_models import tensors_in, tiny_gpt2
from torch import nn
from torch.utils.checkpoint import checkpoint

import tracing
from tracing.runs.backward import trace_step

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- models


def ours():
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    config = ModelConfig.preset("nano", dropout=0.1)
    model = DecoderOnlyTransformer(config).train()
    x = torch.randint(0, config.vocab_size, (2, 11))
    y = torch.randint(0, config.vocab_size, (2, 11))
    return model, x, lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten()), y


def hf_gpt2():
    model = tiny_gpt2(seed=None, train=True, n_embd=48, vocab_size=101)
    ids = torch.randint(0, 101, (2, 9))
    return model, {"input_ids": ids, "labels": ids}, None, None


def torch_decoder():
    layer = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    model = nn.TransformerDecoder(layer, num_layers=2, norm=nn.LayerNorm(32)).train()
    tgt, memory = torch.randn(2, 9, 32), torch.randn(2, 5, 32)
    return model, (tgt, memory), lambda out: out.square().mean(), None


class Tricky(nn.Module):
    """Tied weights, an in-place op, a no_grad region, a module called twice, a
    checkpointed block; keeps its intermediates in ``kept`` when ``keep`` is set."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(17, 8)
        self.inner = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 17, bias=False)
        self.head.weight = self.emb.weight  # tied: one parameter used twice
        self.keep = False
        self.kept: dict[str, torch.Tensor] = {}

    def _keep(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self.keep:
            t.retain_grad()
            self.kept[name] = t
        return t

    def forward(self, x):
        h = self._keep("emb", self.emb(x))
        a = self._keep("inner1", self.inner(h))  # called twice
        b = self._keep("inner2", self.inner(a.tanh()))
        with torch.no_grad():
            scale = b.abs().mean() + 1  # no grad flows through this
        c = self._keep("scaled", b / scale)
        d = c * 1.0
        d.mul_(2.0)  # in place
        d = self._keep("doubled", d)
        e = self._keep("ckpt", checkpoint(self.block, d, use_reentrant=False))
        return self.head(e + h)


def tricky():
    return Tricky(), torch.randint(0, 17, (3, 5)), lambda out: out.logsumexp(-1).mean(), None


def tutorial():
    """The tutorial's classes verbatim (``tests/helpers/models/tutorial.py``), its missing import
    added, with dropout on: the first model nobody here wrote."""
    spec = importlib.util.spec_from_file_location("tutorial_fixed_backward", TUTORIAL_FIXED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TutorialLM().train()
    x, y = torch.randint(0, 256, (2, 10)), torch.randint(0, 256, (2, 10))
    return model, x, lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten()), y


MODELS = {
    "ours": ours,
    "hf_gpt2": hf_gpt2,
    "torch_decoder": torch_decoder,
    "tricky": tricky,
    "tutorial": tutorial,
}


# --------------------------------------------------------------------------- reference


def _call(model, inputs):
    if isinstance(inputs, tuple):
        return model(*inputs)
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(inputs)


def _loss(out, loss_fn, targets):
    if loss_fn is None:
        return out.loss
    return loss_fn(out) if targets is None else loss_fn(out, targets)


def plain_step(model, inputs, loss_fn, targets, optimizer=None):
    """The untraced step, retaining the grad of every module call's first output."""
    outputs: list[tuple[str, torch.Tensor]] = []
    in_forward = [True]  # not the recomputation of a checkpointed block in the backward
    handles = []
    for path, module in model.named_modules():

        def hook(mod, args, out, path=path):
            ts = tensors_in(out)
            if in_forward[0] and ts and ts[0].requires_grad:
                ts[0].retain_grad()
                outputs.append((path, ts[0]))

        handles.append(module.register_forward_hook(hook))
    try:
        loss = _loss(_call(model, inputs), loss_fn, targets)
        in_forward[0] = False
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    if optimizer is not None:
        optimizer.step()
    return loss, outputs


def run_both(make, capture="values", with_optimizer=True, seed=0):
    torch.manual_seed(seed)
    model, inputs, loss_fn, targets = make()
    twin = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2) if with_optimizer else None
    opt_twin = torch.optim.AdamW(twin.parameters(), lr=1e-2) if with_optimizer else None
    torch.manual_seed(1)
    trace = trace_step(model, inputs, loss_fn, opt, targets=targets, capture=capture)
    torch.manual_seed(1)
    loss, outputs = plain_step(twin, inputs, loss_fn, targets, opt_twin)
    return trace, model, opt, twin, opt_twin, loss, outputs


# --------------------------------------------------------------------------- fidelity


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_equal_plain_autograd_bit_for_bit(name):
    trace, model, opt, twin, opt_twin, loss, outputs = run_both(MODELS[name])
    assert trace.meta["loss"] == float(loss.detach())
    calls = [s for s in trace.steps if s.kind == "module" and s.outputs]
    compared = 0
    for path, ref in outputs:
        step = next(s for s in calls if s.module == path)
        calls.remove(step)
        grad = trace.grad(step.outputs[0])
        if ref.grad is None:
            assert grad is None or trace.value(grad.id) is None, path
            continue
        assert grad is not None, f"no gradient recorded for {path}"
        assert torch.equal(trace.value(grad.id), ref.grad), path
        compared += 1
    assert compared >= 5
    # parameters: this step's gradient, .grad, the updated weights and the optimizer state
    for (pname, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        if q.grad is None:
            continue
        rec = trace.param_grad(pname)
        assert rec is not None, pname
        assert torch.equal(trace.value(rec.id), q.grad), pname
        assert torch.equal(p.grad, q.grad), pname
        assert torch.equal(p, q), pname
    state, state_twin = opt.state_dict()["state"], opt_twin.state_dict()["state"]
    assert state.keys() == state_twin.keys()
    for k in state:
        for field in state[k]:
            assert torch.equal(state[k][field], state_twin[k][field]), (k, field)


def test_tricky_intermediates_equal_retain_grad():
    """Op-level tensors (not module outputs): an in-place result, a no_grad region, a
    module called twice, a checkpointed block, and the tied weight's summed gradient."""
    torch.manual_seed(0)
    model, x, loss_fn, _ = tricky()
    twin = copy.deepcopy(model)
    twin.keep = True
    trace = trace_step(model, x, loss_fn, capture="values")
    loss_fn(twin(x)).backward()
    # the module-call outputs of the traced run, by the twin's names
    inner = trace.module_steps("inner")
    assert len(inner) == 2  # called twice: two calls, two gradients
    named = {"emb": trace.module_steps("emb")[0].outputs[0]}
    named["inner1"], named["inner2"] = inner[0].outputs[0], inner[1].outputs[0]
    named["ckpt"] = trace.module_steps("block")[0].outputs[0]
    div = next(s for s in trace.steps if s.kind == "op" and s.op == "div")
    named["scaled"] = div.outputs[0]
    mul_ = next(s for s in trace.steps if s.kind == "op" and s.op == "mul_")
    named["doubled"] = mul_.outputs[0]
    for name, rid in named.items():
        grad = trace.grad(rid)
        assert grad is not None, name
        assert torch.equal(trace.value(grad.id), twin.kept[name].grad), name
    # the no_grad region made no gradient
    abs_step = next(s for s in trace.steps if s.kind == "op" and s.op == "abs")
    assert trace.grad(abs_step.outputs[0]) is None
    # tied: one AccumulateGrad step, the sum of both uses, under either name
    acc = [s for s in trace.steps if s.op == "AccumulateGrad" and s.module == "emb"]
    assert len(acc) == 1
    tied = trace.param_grad("emb.weight")
    assert torch.equal(trace.value(tied.id), twin.emb.weight.grad)


def test_backward_steps_follow_forward_in_execution_order_and_link_back():
    trace, model, *_ = run_both(ours, capture="stats", with_optimizer=False)
    start = trace.backward_start
    assert start == trace.meta["forward_steps"]
    assert all(s.kind != "backward" for s in trace.steps[:start])
    backward = trace.steps[start:]
    assert all(s.kind == "backward" for s in backward)
    # the loss first: its cross_entropy op (a forward step of the `loss` step) made it
    assert backward[0].op == "NllLossBackward0" and backward[0].module == "loss"
    assert trace.steps[backward[0].forward].op == "cross_entropy"
    # then the model's output node: the LM head
    linked = [s for s in backward if s.forward is not None and s.module != "loss"]
    assert trace.steps[linked[0].forward].module == "lm_head"
    for s in linked:
        fwd = trace.steps[s.forward]
        assert fwd.kind != "backward" and s.source == fwd.source
    # a gradient's record points at the forward tensor, and has its shape and dims
    for s in backward:
        for rid in s.outputs:
            rec = trace.tensors[rid]
            assert rec.role == "grad" and rec.producer == s.index
            if rec.grad_of is not None:
                fwd = trace.tensors[rec.grad_of]
                assert fwd.shape == rec.shape and fwd.dims == rec.dims
    # every parameter has exactly one AccumulateGrad step
    acc = [s for s in backward if s.op == "AccumulateGrad"]
    n_params = len(list(model.parameters()))  # tied weights once
    assert len(acc) == len(trace.meta["param_grads"]) == n_params


def test_update_ratios_are_the_relative_weight_change():
    trace, model, *_ = run_both(tricky)
    ratios = trace.meta["update_ratios"]
    torch.manual_seed(0)  # the same model as it was before the step
    start, *_ = tricky()
    w0, w1 = start.inner.weight, model.inner.weight
    b0, b1 = start.inner.bias, model.inner.bias
    expected = (
        torch.cat([(w1 - w0).flatten(), (b1 - b0).flatten()]).norm()
        / torch.cat([w0.flatten(), b0.flatten()]).norm()
    )
    assert ratios["inner"] == pytest.approx(float(expected.detach()), rel=1e-5)
    assert trace.meta["optimizer"] == "AdamW"


def test_nothing_stays_attached():
    torch.manual_seed(0)
    model, x, loss_fn, _ = tricky()
    trace_step(model, x, loss_fn, capture="stats")
    for m in model.modules():
        assert "forward" not in m.__dict__
        assert not m._forward_hooks and not m._forward_pre_hooks
    for p in model.parameters():
        assert not p._backward_hooks
    # a second, plain step works and gives the same gradient as a fresh model's
    model.zero_grad()
    loss_fn(model(x)).backward()
    assert model.inner.weight.grad is not None


def test_trace_file_round_trip_keeps_backward():
    trace, *_ = run_both(tricky, capture="values", with_optimizer=True)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "step.trace"
        trace.save(path)
        loaded = tracing.load(path)
        assert [s.kind for s in loaded.steps] == [s.kind for s in trace.steps]
        assert [s.forward for s in loaded.steps] == [s.forward for s in trace.steps]
        g = trace.param_grad("inner.weight")
        assert torch.equal(loaded.value(loaded.param_grad("inner.weight").id), trace.value(g.id))
        assert loaded.meta["update_ratios"] == pytest.approx(trace.meta["update_ratios"])


def test_bad_loss_is_one_clear_error():
    torch.manual_seed(0)
    model, x, _, _ = tricky()
    with pytest.raises(ValueError, match="one number"):
        trace_step(model, x, lambda out: out)
    with pytest.raises(TypeError, match="loss tensor"):
        trace_step(model, x, lambda out: 1.0)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="does not require grad"):
        trace_step(model, x, lambda out: out.sum())


def test_shapes_capture_keeps_no_stats_but_all_steps():
    shapes, *_ = run_both(tricky, capture="shapes", with_optimizer=False)
    stats, *_ = run_both(tricky, capture="stats", with_optimizer=False)
    assert [(s.op, s.forward) for s in shapes.steps] == [(s.op, s.forward) for s in stats.steps]
    grads = [r for r in shapes.tensors if r.role == "grad"]
    assert grads and all(r.stats is None and r.value_key is None for r in grads)


# --------------------------------------------------------------------------- breakpoints


def test_first_nonfinite_gradient_names_the_forward_op_and_line():
    from tracing.breakpoints import NonFinite, first_nonfinite_gradient

    torch.manual_seed(0)
    model, x = SqrtAtZero(), torch.randn(3, 4)
    trace = trace_step(model, x, lambda out: out.sum(), capture="stats")
    assert "stopped_at" not in trace.meta
    hit = first_nonfinite_gradient(trace)
    assert hit is not None
    step = trace.steps[hit.step]
    assert step.kind == "backward" and step.op == "SqrtBackward0"
    assert trace.steps[step.forward].op == "sqrt"
    assert "r = h.sqrt()" in hit.source and hit.label.endswith("sqrt")
    assert "Inf" in hit.reason and "relu" in hit.reason  # it sends Inf back to the relu
    # the forward had nothing non-finite: the first step with one is the relu's backward
    first = tracing.find_next(trace, -1, [NonFinite()])
    assert first == hit.step  # one definition: run-to-next lands on the node that made it

    # live: the recording stops there and the optimizer step is not taken
    torch.manual_seed(0)
    model = SqrtAtZero()
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    live = trace_step(model, x, lambda out: out.sum(), opt, break_on=[NonFinite()])
    assert live.meta["stopped_at"]["index"] == first  # the node that made it, like N
    assert live.steps[-1].op == "ReluBackward0"  # recorded up to the one that received it
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert model.proj.weight.grad is not None  # the backward itself completed


def test_grad_norm_breakpoints_catch_exploding_and_vanishing_layers():
    from tracing.breakpoints import GradNormAbove, GradNormBelow, find_all

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1))
    with torch.no_grad():
        model[2].weight.mul_(1e4)  # everything before it gets huge gradients
    x = torch.randn(5, 8)
    trace = trace_step(model, x, lambda out: out.sum(), capture="values")
    big = find_all(trace, [GradNormAbove(1e3)])
    assert big and all(trace.steps[h.step].kind == "backward" for h in big)
    for h in big:  # the reported norm is the true norm of that gradient
        rid = trace.steps[h.step].outputs[0]
        norm = float(trace.value(rid).double().norm())
        assert norm > 1e3
        assert f"{norm:.4g}" in h.reason
    assert not find_all(trace, [GradNormBelow(1e-3)])
    # live: the forward is never stopped by a gradient-only condition
    live = trace_step(model, x, lambda out: out.sum(), break_on=[GradNormAbove(1e3)])
    stopped = live.steps[live.meta["stopped_at"]["index"]]
    assert stopped.kind == "backward" and stopped.index == big[0].step
    with torch.no_grad():
        model[2].weight.mul_(1e-4)
        model[1].weight.mul_(1e-8)  # the gradient below it vanishes
    vanishing = trace_step(model, x, lambda out: out.sum(), capture="stats")
    small = find_all(vanishing, [GradNormBelow(1e-3)])
    assert small and vanishing.steps[small[0].step].module == "0"
    assert not find_all(vanishing, [GradNormAbove(1e3)])


# --------------------------------------------------------------------------- watch


def test_watch_saves_the_step_that_went_nonfinite_from_the_state_before_it(tmp_path):
    from tracing.breakpoints import first_nonfinite_gradient

    torch.manual_seed(0)
    model = NaiveLogSoftmax()
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.1)
    batches = [torch.randn(3, 4) for _ in range(3)] + [torch.randn(3, 4) * 1e4]
    path = tmp_path / "bad.trace"
    loss_fn = lambda out: -out[:, 0].mean()  # noqa: E731
    with tracing.watch(model, opt, path=path, loss_fn=loss_fn) as watcher:
        for x in batches:  # a plain loop; the last batch underflows the softmax
            opt.zero_grad()
            loss_fn(model(x)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    assert watcher.traces == [path] and watcher.step == 4
    for x in batches:  # the same loop unwatched: the same weights at the end
        opt_twin.zero_grad()
        loss_fn(twin(x)).backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        opt_twin.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, equal_nan=True)
    trace = tracing.load(path)
    assert trace.meta["watch"]["step"] == 4
    hit = first_nonfinite_gradient(trace)
    assert hit is not None and hit.label.endswith("log")
    assert "p.log()" in hit.source
    assert not model._forward_pre_hooks and not opt._optimizer_step_pre_hooks


def test_watch_at_a_step_number_replays_it_bit_for_bit(tmp_path):
    torch.manual_seed(0)
    model, x, loss_fn, y = ours()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grads = {}
    watcher = tracing.watch(
        model, opt, when=2, path=tmp_path / "s2.trace", capture="values",
        loss_fn=lambda out: loss_fn(out, y),
    )  # fmt: skip
    for step in range(3):
        opt.zero_grad()
        loss_fn(model(x), y).backward()  # dropout is on: the replay must reuse its randoms
        if step == 1:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    watcher.close()
    trace = tracing.load(tmp_path / "s2.trace")
    for name, g in grads.items():
        rec = trace.param_grad(name)
        if rec is not None:
            assert torch.equal(trace.value(rec.id), g), name


def test_compare_two_training_steps_lines_up_backward_steps():
    torch.manual_seed(0)
    model, x, loss_fn, _ = tricky()
    a = trace_step(model, x, loss_fn, capture="values")
    with torch.no_grad():
        model.block[2].weight.mul_(3.0)  # late in the forward, early in the backward
    b = trace_step(model, x, loss_fn, capture="values")
    d = tracing.diff(a, b)
    backward = [e for e in d.entries if e.key[0] == "backward"]
    assert len(backward) == len(a.steps) - a.backward_start  # every backward step paired
    assert any(e.status == "changed" for e in backward)


class Checkpointed(nn.Module):
    """A BatchNorm (its running statistics move in the forward), dropout (draws from the
    random state) and a checkpointed block, reentrant or not."""

    def __init__(self, use_reentrant):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)
        self.block = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        self.use_reentrant = use_reentrant

    def forward(self, x):
        h = self.drop(self.norm(x))
        kwargs = {} if self.use_reentrant is None else {"use_reentrant": self.use_reentrant}
        return checkpoint(self.block, h, **kwargs) * 2


@pytest.mark.parametrize("use_reentrant", [True, None], ids=["reentrant", "legacy-default"])
def test_reentrant_checkpoint_is_refused_before_the_step(use_reentrant, tmp_path):
    torch.manual_seed(0)
    model = Checkpointed(use_reentrant).train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    state = copy.deepcopy(model.state_dict())
    x = torch.randn(6, 4)
    rng = torch.get_rng_state()
    out = tmp_path / "refused.trace"
    warns = pytest.warns(UserWarning) if use_reentrant is None else contextlib.nullcontext()
    with warns, pytest.raises(tracing.ReentrantCheckpointError, match="use_reentrant=False"):
        trace_step(model, x, lambda o: o.square().mean(), opt, out=out)
    # nothing changed: weights, buffers (running stats), .grad, optimizer, random state
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in state.items())
    assert all(p.grad is None for p in model.parameters())
    assert not opt.state
    assert torch.equal(torch.get_rng_state(), rng)
    # nothing attached, nothing written
    for m in model.modules():
        assert "forward" not in m.__dict__ and not m._forward_hooks
    assert not list(tmp_path.iterdir())
    # the fix the message names works, and equals plain autograd bit for bit
    model.use_reentrant = False
    twin = copy.deepcopy(model)
    torch.manual_seed(1)
    trace = trace_step(model, x, lambda o: o.square().mean(), capture="values")
    torch.manual_seed(1)
    twin(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(trace.value(trace.param_grad(name).id), q.grad), name
        assert torch.equal(p.grad, q.grad), name
