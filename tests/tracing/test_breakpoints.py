"""Breakpoints: conditions over a saved trace ("run to next") and live (break_on=)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import tracing
from scratchformer import DecoderOnlyTransformer, ModelConfig
from tracing.breakpoints import (
    AbsAbove,
    AttentionEntropyBelow,
    ModuleIs,
    NonFinite,
    OpIs,
    attention_entropy,
    find_all,
    find_hit,
    find_next,
)

# --------------------------------------------------------------------------- models


class Block(nn.Module):
    def __init__(self, gain: float):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.gain = gain

    def forward(self, x):
        h = torch.relu(self.lin(x))
        h = h * self.gain  # block 2's gain overflows float32 to Inf
        return x + h


class Overflowing(nn.Module):
    """Three blocks; the third (blocks.2) produces Inf at one `mul`."""

    def __init__(self, gain1: float = 1.0):
        super().__init__()
        self.blocks = nn.ModuleList([Block(1.0), Block(gain1), Block(1e39)])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _the_overflowing_mul(trace) -> int:
    """Index of the mul in blocks.2, found independently of the breakpoint code."""
    (index,) = [s.index for s in trace.steps if s.module == "blocks.2" and s.op == "mul"]
    return index


@pytest.fixture(scope="module")
def overflowing():
    torch.manual_seed(0)
    return Overflowing().eval(), torch.randn(2, 6) + 1.0


@pytest.fixture(scope="module")
def demo():
    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset("demo", n_layers=2, block_size=16)).eval()
    tokens = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    return model, tokens, tracing.trace(model, tokens, capture="stats")


# --------------------------------------------------------------------------- saved traces


@pytest.mark.parametrize("capture", ["stats", "values"])
def test_find_next_nonfinite_stops_at_the_op_that_made_it(overflowing, capture):
    model, x = overflowing
    t = tracing.trace(model, x, capture=capture)
    mul = _the_overflowing_mul(t)
    assert t.tensor(t.steps[mul].outputs[0]).stats.inf > 0
    hit = find_hit(t, -1, [NonFinite()])
    assert hit.step == mul and hit.event == "exit"
    assert "Inf" in hit.reason
    assert hit.source.endswith("h = h * self.gain  # block 2's gain overflows float32 to Inf")
    assert find_next(t, -1, [NonFinite()]) == mul
    # the residual add and the head only carry the Inf on: it was not made there
    carried = [s.index for s in t.steps if s.index > mul and s.outputs
               and t.tensor(s.outputs[0]).stats.inf]  # fmt: skip
    assert carried and find_hit(t, mul, NonFinite()) is None
    assert find_next(t, len(t.steps), NonFinite()) is None


def test_float16_values_do_not_fake_an_overflow():
    """Values kept as float16 overflow at 65504; the statistics (float32) decide."""
    torch.manual_seed(0)
    model, x = Overflowing(gain1=1e6).eval(), torch.randn(2, 6) + 1.0
    t = tracing.trace(model, x, capture="values", value_dtype=torch.float16)
    early = next(s for s in t.steps if s.module == "blocks.1" and s.op == "mul")
    assert torch.isinf(t.value(early.outputs[0])).any()  # the float16 copy overflowed
    assert t.tensor(early.outputs[0]).stats.inf == 0  # the real tensor did not
    assert find_next(t, -1, NonFinite()) == _the_overflowing_mul(t)
    assert find_next(t, -1, AbsAbove(1e30)) == _the_overflowing_mul(t)


def test_abs_above_uses_stats_or_values(overflowing):
    model, x = overflowing
    t = tracing.trace(model, x, capture="stats")
    big = max(abs(t.tensor(s.outputs[0]).stats.max) for s in t.steps if s.module == "blocks.0")
    first = find_hit(t, -1, AbsAbove(big * 0.999))
    assert t.steps[first.step].module.startswith("blocks.0")
    # nothing in blocks 0-1 exceeds `big` by much; the first thing above 1e30 is the overflow
    assert find_next(t, -1, AbsAbove(1e30)) == _the_overflowing_mul(t)


def test_name_conditions_and_composition(demo):
    _, _, t = demo
    ff = find_hit(t, -1, ModuleIs("blocks.1.feed_forward"))
    assert ff.event == "enter" and t.steps[ff.step].kind == "module"
    assert ff.step == t.module_steps("blocks.1.feed_forward")[0].index
    softmaxes = [s.index for s in t.steps if s.op == "softmax"]
    assert find_next(t, -1, OpIs("softmax")) == softmaxes[0]
    assert find_next(t, softmaxes[0], OpIs("softmax")) == softmaxes[1]
    inside = ModuleIs("blocks.1", within=True) & OpIs("softmax")
    assert find_next(t, -1, inside) == softmaxes[1]
    either = OpIs("nothing_like_this") | ModuleIs("lm_head")
    assert find_next(t, -1, either) == t.module_steps("lm_head")[0].index
    assert [h.step for h in find_all(t, OpIs("softmax"))] == softmaxes
    with pytest.raises(TypeError, match="break_on expects"):
        find_next(t, -1, ["softmax"])


def test_attention_entropy_below(demo):
    _, _, t = demo
    maps = t.attention_maps()  # kept at every capture level
    ref = {
        path: float(torch.distributions.Categorical(probs=w[..., 1:, :]).entropy().min())
        for path, w in maps.items()
    }  # independent entropy, skipping the first query (which sees one key only)
    w0 = maps["blocks.0.self_attn.attention"]
    torch.testing.assert_close(
        attention_entropy(w0),
        torch.distributions.Categorical(probs=w0.double()).entropy(),
    )
    assert min(ref.values()) > 0
    # a threshold above layer 0's sharpest row hits layer 0's map; below every row: none
    hit = find_hit(t, -1, AttentionEntropyBelow(ref["blocks.0.self_attn.attention"] + 1e-6))
    assert t.steps[hit.step].module.startswith("blocks.0.self_attn")
    assert "entropy" in hit.reason
    assert find_next(t, -1, AttentionEntropyBelow(min(ref.values()) - 1e-6)) is None
    # without skipping, the first query row (entropy 0) always matches
    assert find_next(t, -1, AttentionEntropyBelow(1e-9, skip_rows=0)) is not None


# --------------------------------------------------------------------------- live


def test_live_break_on_inf_stops_at_the_op_with_its_source_line(overflowing):
    model, x = overflowing
    full = tracing.trace(model, x, capture="stats")
    t = tracing.trace(model, x, capture="stats", break_on=[NonFinite()])
    mul = _the_overflowing_mul(full)
    assert t.complete  # stopped on purpose: not an error
    assert len(t.steps) == mul + 1 < len(full.steps)  # the forward was not finished
    last = t.steps[-1]
    assert (last.module, last.op) == ("blocks.2", "mul")
    assert last.source.text == "h = h * self.gain  # block 2's gain overflows float32 to Inf"
    stopped = t.meta["stopped_at"]
    assert stopped["index"] == mul and "Inf" in stopped["reason"]
    assert stopped["step"] == mul + 1  # the number the app's step bar shows
    assert stopped["source"].endswith(last.source.text)
    assert t.steps[:-1] == full.steps[:mul] or all(
        (a.module, a.op) == (b.module, b.op) for a, b in zip(t.steps, full.steps)
    )
    # enclosing module calls are closed at the stop
    for s in t.steps:
        if s.kind == "module":
            assert s.end is not None and s.end <= mul
    assert model.training is False and not model._forward_hooks  # cleaned up
    assert "stopped_at" not in full.meta


def test_live_break_on_module_entry_and_saved_file(demo, tmp_path):
    model, tokens, full = demo
    t = tracing.trace(model, tokens, capture="values", break_on=[ModuleIs("blocks.1")])
    entry = full.module_steps("blocks.1")[0].index
    assert len(t.steps) == entry + 1 and t.meta["stopped_at"]["event"] == "enter"
    t.save(tmp_path / "stopped.trace")
    stopped = tracing.load(tmp_path / "stopped.trace").meta["stopped_at"]
    assert (stopped["index"], stopped["step"]) == (entry, entry + 1)
    # no condition met: the whole forward runs
    done = tracing.trace(model, tokens, capture="stats", break_on=[OpIs("no_such_op")])
    assert len(done.steps) == len(full.steps) and "stopped_at" not in done.meta
    # a file written before stopped_at had "index" kept the 0-based index as "step"
    old = {k: v for k, v in t.meta["stopped_at"].items() if k != "index"}
    t.meta["stopped_at"] = {**old, "step": entry}
    t.save(tmp_path / "old.trace")
    stopped = tracing.load(tmp_path / "old.trace").meta["stopped_at"]
    assert (stopped["index"], stopped["step"]) == (entry, entry + 1)
    assert stopped["event"] == "enter" and stopped["label"] == old["label"]


def test_live_nonfinite_ignores_the_causal_mask_but_not_a_real_inf() -> None:
    """Our model writes -inf above the diagonal with masked_fill: that is not a problem,
    so a live NonFinite breakpoint runs through every attention layer to the end."""
    import scratchformer

    model = scratchformer.demo_model()
    ids = torch.tensor([scratchformer.ByteTokenizer().encode(scratchformer.DEMO_PROMPT)])
    trace = tracing.trace(model, ids, break_on=[NonFinite()])
    assert "stopped_at" not in trace.meta
    assert any(s.op == "masked_fill" for s in trace.steps)
    # the same condition still stops at a mask op that makes a NaN
    from tracing.breakpoints import Output

    masked = next(s for s in trace.steps if s.op == "masked_fill")
    nan_value = torch.tensor([float("nan"), float("-inf")])
    assert NonFinite().on_exit(masked, [Output(None, nan_value, name="output")])
