"""Where it went non-finite: one definition for live breaks, the app's N,
``first_nonfinite_gradient`` and the report, checked against what autograd and plain
tensor arithmetic say independently."""

from __future__ import annotations

import math

import torch
from helpers.nonfinite_models import NaiveLogSoftmax, SqrtAtZero
from torch import nn

import tracing
from app.core import session
from tracing.breakpoints import NonFinite, find_all, first_nonfinite_gradient


def _sum(out):
    return out.sum()


# --------------------------------------------------------------------------- backward


def test_sqrt_at_zero_live_break_n_and_first_nonfinite_gradient_agree():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    model = SqrtAtZero()
    # independently: autograd says the gradient d sum / d h is Inf exactly where h == 0
    h = model.proj(x).relu().detach().requires_grad_()
    model.scale(h.sqrt()).sum().backward()
    assert torch.isinf(h.grad).any() and (h.grad.isinf() == (h == 0)).all()

    saved = tracing.trace_step(model, x, _sum, capture="stats")
    hit = first_nonfinite_gradient(saved)
    n = session.next_nonfinite(saved, 0)
    live = tracing.trace_step(model, x, _sum, break_on=[NonFinite()])
    stop = live.meta["stopped_at"]
    assert saved.steps[hit.step].op == "SqrtBackward0"
    assert n == hit.step  # one press of N
    assert live.steps[stop["index"]].op == "SqrtBackward0" and stop["index"] == hit.step
    assert "r = h.sqrt()" in stop["source"] and "relu" in stop["reason"]
    # its gradient is finite: it is the node that *made* the Inf it sends to the relu
    sqrt_grad = saved.tensors[saved.steps[hit.step].outputs[0]].stats
    assert not sqrt_grad.has_nonfinite
    n_inf = int(torch.isinf(h.grad).sum())
    assert f"{n_inf} Inf" in hit.reason
    assert [h.step for h in find_all(saved, NonFinite())][:1] == [hit.step]


def test_every_backward_output_has_stats_and_at_values_its_value():
    torch.manual_seed(0)
    model, x = SqrtAtZero(), torch.randn(3, 4)
    stats = tracing.trace_step(model, x, _sum, capture="stats")
    grads = [stats.tensors[r] for s in stats.steps if s.kind == "backward" for r in s.outputs]
    assert grads and all(g.stats is not None for g in grads)
    values = tracing.trace_step(model, x, _sum, capture="values")
    grads = [values.tensors[r] for s in values.steps if s.kind == "backward" for r in s.outputs]
    assert all(values.value(g.id) is not None for g in grads)
    for g in grads:  # the stats are those of the kept value
        v = values.value(g.id)
        assert g.stats.nan == int(v.isnan().sum()) and g.stats.inf == int(v.isinf().sum())


# --------------------------------------------------------------------------- forward


class Experts(nn.Module):
    """A softmax written out by hand: ``exp`` of a large logit overflows to Inf, and the
    division after it turns Inf / Inf into NaN, in a module nested in two others."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4))
        self.outer = nn.ModuleDict({"gate": self.inner})

    def forward(self, x):
        logits = self.outer["gate"](x) * 1000.0
        e = logits.exp()  # overflows: exp(> 88.7) is Inf in float32
        return e / e.sum(-1, keepdim=True)


def test_forward_overflow_found_on_the_exp_op_in_one_press():
    torch.manual_seed(0)
    model, x = Experts(), torch.randn(3, 4) * 3
    with torch.no_grad():  # independently: the exp is where the first Inf is made
        logits = model.inner(x) * 1000.0
        assert torch.isfinite(logits).all() and torch.isinf(logits.exp()).any()
    for capture in ("stats", "values"):
        trace = tracing.trace_step(model, x, _sum, capture=capture)
        first = session.next_nonfinite(trace, -1)
        step = trace.steps[first]
        assert (step.kind, step.op) == ("op", "exp"), capture
        assert "e = logits.exp()" in step.source.text
        hit = first_nonfinite_gradient(trace)  # the forward was already bad: it says so
        assert hit.step == first and "forward was already non-finite" in hit.reason
    live = tracing.trace_step(model, x, _sum, break_on=NonFinite())
    assert live.steps[live.meta["stopped_at"]["index"]].op == "exp"
    assert live.backward_start is None  # a forward break: no backward
    # the NaN the division makes from those Infs is the next press, and says so
    nxt = trace.steps[session.next_nonfinite(trace, first)]
    assert nxt.op in ("div", "truediv", "__truediv__")
    assert "made from an Inf" in session.nonfinite_origin(trace, first).reason


def test_log_of_an_underflowed_softmax_is_the_log():
    torch.manual_seed(0)
    model, x = NaiveLogSoftmax(), torch.randn(3, 4) * 1e4
    with torch.no_grad():  # independently: the softmax is finite (zeros), its log is not
        p = model.proj(x).softmax(-1)
        assert torch.isfinite(p).all() and (p == 0).any() and torch.isinf(p.log()).any()
    trace = tracing.trace_step(model, x, lambda out: -out[:, 0].mean(), capture="values")
    assert not math.isfinite(trace.meta["loss"])
    first = session.next_nonfinite(trace, -1)
    assert trace.steps[first].op == "log" and "p.log()" in trace.steps[first].source.text
    hit = first_nonfinite_gradient(trace)
    assert hit.step == first and "backward" in hit.reason
    # the backward's own origin comes after, in the backward, and is a node that ran
    back = session.next_nonfinite(trace, trace.backward_start - 1)
    assert back is not None and trace.steps[back].kind == "backward"


def test_a_mask_inf_carried_on_is_not_where_it_went_nonfinite():
    class Masked(nn.Module):
        def forward(self, s):
            mask = torch.ones(4, 4).tril().bool()
            s = s.masked_fill(~mask, float("-inf"))
            s = s.view(16).view(4, 4)  # carries the mask's -inf on
            s[3] = float("-inf")  # a whole row masked: its softmax is 0/0
            return s.softmax(-1)

    trace = tracing.trace(Masked(), torch.randn(4, 4), capture="stats")
    hits = find_all(trace, NonFinite())
    assert [trace.steps[h.step].op for h in hits] == ["softmax"]  # only the NaN's maker


# --------------------------------------------------------------------------- report


def test_the_report_counts_each_phase_and_names_where_each_went_nonfinite():
    from tracing.analysis import report

    torch.manual_seed(0)
    model, x = NaiveLogSoftmax(), torch.randn(3, 4) * 1e4
    trace = tracing.trace_step(model, x, nn.NLLLoss(), targets=torch.zeros(3, dtype=torch.long))
    text = report.render(trace, "md")
    loss_step = next(s for s in trace.steps if s.kind == "module" and s.module == "loss")
    n_loss = 1 + sum(1 for s in trace.steps[: trace.backward_start] if s.parent == loss_step.index)
    n_back = sum(1 for s in trace.steps if s.kind == "backward")
    n_fwd = trace.backward_start - n_loss
    assert f"**forward steps**: {n_fwd}" in text and f"**loss steps**: {n_loss}" in text
    assert f"**backward steps**: {n_back}" in text and f", {n_back} backward)" in text
    log = next(s for s in trace.steps if s.op == "log")
    line = next(x for x in text.splitlines() if "forward: first non-finite" in x)
    assert f"step {log.index + 1} " in line and "p.log()" in line  # numbered as the app does
    line = next(x for x in text.splitlines() if "backward: first non-finite" in x)
    assert f"follows from the forward's, step {log.index + 1}" in line
