"""Edits while tracing (tracing.edits): fidelity against independent references.

The references: zeroing a head's output is zeroing that head's slice of the output
projection's weight (our W_o, HF GPT-2's c_proj); a patched residual stream reproduces the
run it came from; a no-op edit changes nothing, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import tiny_gpt2
from torch import nn

import scratchformer
import tracing
from tracing.capture.edits import (
    Add,
    Edit,
    EditError,
    MeanAblate,
    Patch,
    Scale,
    Set,
    Zero,
    edited_steps,
)
from tracing.runs.edit_run import run_edited
from tracing.sites import Site, parse_site, site_steps, step_site

HEAD_SITE = "blocks.{}.self_attn.attention"  # (output (B, H, T, D), weights)


@pytest.fixture(scope="module")
def demo():
    torch.manual_seed(0)
    model = scratchformer.demo_model()
    tok = scratchformer.ByteTokenizer()
    clean = torch.tensor([tok.encode("wordplay|yalpdrow.")])
    corrupted = torch.tensor([tok.encode("wordpaly|yalpdrow.")])
    return model, clean, corrupted


def _logits(model, x, edits=()):
    with torch.no_grad():
        return run_edited(model, x, edits=edits) if edits else model(x)


def _root_output(trace: tracing.Trace) -> torch.Tensor:
    root = trace.steps[0]
    return trace.value(root.outputs[0])


# --------------------------------------------------------------------------- sites


def test_sites_parse_and_print():
    assert parse_site("blocks.1.feed_forward") == Site("blocks.1.feed_forward")
    site = parse_site("blocks.1@1:add#2")
    assert (site.module, site.call, site.op, site.occurrence) == ("blocks.1", 1, "add", 2)
    assert str(site) == "blocks.1@1:add#2"
    assert parse_site("<root>") == Site("")
    with pytest.raises(ValueError, match="cannot read site"):
        parse_site("blocks.1:add#x")


def test_step_site_round_trips(demo):
    model, clean, _ = demo
    t = tracing.trace(model, clean, capture="shapes")
    for step in t.steps:
        site = step_site(t, step)
        assert step in site_steps(t, site)
        assert len(site_steps(t, site)) == 1  # with the call number, one step exactly


# --------------------------------------------------------------------------- fidelity


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 2)])
def test_zero_head_equals_zeroing_its_w_o_columns(demo, layer, head):
    model, clean, _ = demo
    D = model.config.d_model // model.config.n_heads
    edited = _logits(model, clean, [Edit(HEAD_SITE.format(layer), Zero(), head=head)])
    reference = scratchformer.demo_model()
    with torch.no_grad():
        reference.blocks[layer].self_attn.W_o.weight[:, head * D : (head + 1) * D] = 0
        expected = reference(clean)
    torch.testing.assert_close(edited, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(edited, _logits(model, clean), atol=1e-3)  # it did something


def _hf_gpt2():
    return tiny_gpt2(seed=1)


def test_zero_head_equals_zeroing_hf_gpt2_c_proj_rows():
    model = _hf_gpt2()
    x = torch.randint(0, 97, (2, 10))
    layer, head, D = 1, 3, 8
    # in eager attention, matmul#1 is weights @ values: (B, H, T, D) per head
    site = f"transformer.h.{layer}.attn:matmul#1"
    t = tracing.trace(model, x, capture="values", edits=[Edit(site, Zero(), head=head)])
    edited = t.value(site_steps(t, "")[0].outputs[0])
    reference = _hf_gpt2()
    with torch.no_grad():  # Conv1D: y = x @ W + b, so head h feeds rows h*D:(h+1)*D
        reference.transformer.h[layer].attn.c_proj.weight[head * D : (head + 1) * D] = 0
        expected = reference(x).logits
    torch.testing.assert_close(edited, expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        light = run_edited(model, x, edits=[Edit(site, Zero(), head=head)]).logits
    torch.testing.assert_close(light, expected, rtol=0, atol=1e-5)


def test_patching_last_block_output_gives_the_clean_logits_exactly(demo):
    model, clean, corrupted = demo
    clean_trace = tracing.trace(model, clean, capture="values")
    last = f"blocks.{model.config.n_layers - 1}"
    patched = tracing.trace(model, corrupted, capture="values", edits=[(last, Patch(clean_trace))])
    assert torch.equal(_root_output(patched), _logits(model, clean))
    assert not torch.equal(_logits(model, corrupted), _logits(model, clean))


@pytest.mark.parametrize("capture", ["shapes", "stats", "values"])
def test_noop_edits_change_nothing_bit_for_bit(demo, capture):
    model, clean, _ = demo
    plain = tracing.trace(model, clean, capture="values")
    edits = [
        Edit("blocks.0.feed_forward", Scale(1.0)),
        Edit("blocks.1.self_attn.attention:softmax#0", Scale(1.0), head=1, on="weights"),
        Edit("blocks.1", Patch(plain)),  # the run's own value
        Edit("blocks.0.self_attn.attention:matmul#1", Patch(plain), positions=[2, 5]),
    ]
    edited = tracing.trace(model, clean, capture=capture, edits=edits)
    assert [s.op for s in edited.steps] == [s.op for s in plain.steps]
    assert all(entry["steps"] for entry in edited.meta["edits"])
    if capture == "values":
        for s in plain.steps:
            for a, b in zip(s.outputs, edited.steps[s.index].outputs):
                va, vb = plain.value(a), edited.value(b)
                if va is not None:
                    assert torch.equal(va, vb), s.label
    assert torch.equal(_logits(model, clean, edits), _logits(model, clean))


class _Twice(nn.Module):
    """One submodule called twice: edits name the call."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)

    def forward(self, x):
        return self.shared(torch.relu(self.shared(x)))


@pytest.mark.parametrize("site", ["shared@1", "shared@1:linear#0"])
def test_second_call_edited_first_untouched(site):
    torch.manual_seed(0)
    model = _Twice().eval()
    x = torch.randn(2, 4)
    plain = tracing.trace(model, x, capture="values")
    edited = tracing.trace(model, x, capture="values", edits=[(site, Zero())])
    first_a, second_a = plain.module_steps("shared")
    first_b, second_b = edited.module_steps("shared")
    assert torch.equal(plain.value(first_a.outputs[0]), edited.value(first_b.outputs[0]))
    assert torch.equal(edited.value(second_b.outputs[0]), torch.zeros(2, 4))
    assert not torch.equal(plain.value(second_a.outputs[0]), torch.zeros(2, 4))
    with torch.no_grad():
        assert torch.equal(run_edited(model, x, edits=[(site, Zero())]), torch.zeros(2, 4))
    # without a call number, every call is edited
    both = tracing.trace(model, x, edits=[("shared", Zero())])
    assert len(both.meta["edits"][0]["steps"]) == 2


def test_model_unchanged_afterwards(demo):
    model, clean, _ = demo
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = _logits(model, clean)
    tracing.trace(model, clean, edits=[(HEAD_SITE.format(0), Zero(), {"head": 1})])
    _logits(model, clean, [("blocks.0.self_attn.attention:softmax#0", Zero())])
    for name, module in model.named_modules():
        assert "forward" not in module.__dict__, name
        assert not module._forward_hooks and not module._forward_pre_hooks, name
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(_logits(model, clean), expected)


# --------------------------------------------------------------------------- actions


def test_actions_on_selected_heads_and_positions(demo):
    model, clean, _ = demo
    site = "blocks.0.feed_forward"
    plain = tracing.trace(model, clean, capture="values")
    (step,) = site_steps(plain, site)
    value = plain.value(step.outputs[0])  # (1, T, C)

    def edited_value(edit):
        t = tracing.trace(model, clean, capture="values", edits=[edit])
        return t.value(site_steps(t, site)[0].outputs[0])

    out = edited_value(Edit(site, Scale(2.0), positions=[1, 3]))
    assert torch.equal(out[:, [1, 3]], value[:, [1, 3]] * 2)
    keep = [i for i in range(value.shape[1]) if i not in (1, 3)]
    assert torch.equal(out[:, keep], value[:, keep])
    out = edited_value(Edit(site, MeanAblate(), positions=0))
    assert torch.allclose(out[:, 0], value.mean(dim=1))
    direction = torch.randn(value.shape[-1])
    assert torch.equal(edited_value(Edit(site, Add(direction))), value + direction)
    assert torch.equal(edited_value(Edit(site, Set(direction))), direction.expand_as(value))
    assert torch.equal(edited_value(Edit(site, lambda v: -v)), -value)
    out = edited_value(Edit(site, MeanAblate(over=plain)))  # a reference trace: its mean
    assert torch.equal(out, value)  # batch of one: its mean is itself


def test_edited_steps_kept_in_the_file(demo, tmp_path):
    model, clean, _ = demo
    t = tracing.trace(model, clean, edits=[Edit(HEAD_SITE.format(1), Zero(), head=2)])
    (index,) = t.meta["edits"][0]["steps"]
    assert t.steps[index].module == HEAD_SITE.format(1)
    assert edited_steps(t) == {index: ["Zero() at blocks.1.self_attn.attention head 2"]}
    t.save(tmp_path / "e.trace")
    loaded = tracing.load(tmp_path / "e.trace")
    assert loaded.meta["edits"] == t.meta["edits"]
    assert edited_steps(loaded) == edited_steps(t)
    plain = tracing.trace(model, clean, capture="shapes")
    assert "edits" not in plain.meta and edited_steps(plain) == {}  # old files: no edits


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "edit,message",
    [
        (("blocks.0.self_attn.attention:softmax#1", Zero()), "softmax ran 1 time"),
        (("blocks.0.self_atn", Zero()), "did you mean 'blocks.0.self_attn'"),
        (("blocks.0.feed_forward@1", Zero()), "ran 1 time"),
        (("blocks.0.self_attn:gelu#0", Zero()), "no 'gelu' op ran directly"),
        (("blocks.0.feed_forward", Zero(), {"head": 1}), "needs a value with a heads axis"),
        ((HEAD_SITE.format(0), Zero(), {"head": 9}), "head=9 .* out of range"),
        (("blocks.0", Set(torch.ones(3))), "does not broadcast"),
    ],
)
def test_bad_edits_are_one_clear_error(demo, edit, message):
    model, clean, _ = demo
    with pytest.raises((EditError, tracing.TraceError), match=message):
        tracing.trace(model, clean, edits=[edit])
    with pytest.raises(EditError, match=message), torch.no_grad():
        run_edited(model, clean, edits=[edit])
    assert "forward" not in model.blocks[0].__dict__  # cleaned up after the error


def test_patch_errors_name_the_problem(demo):
    model, clean, _ = demo
    stats = tracing.trace(model, clean, capture="stats")
    with pytest.raises(tracing.TraceError, match=r"kept no value .* capture='values'"):
        tracing.trace(model, clean, edits=[("blocks.0", Patch(stats))])
    shorter = tracing.trace(model, clean[:, :-2], capture="values")
    with pytest.raises(tracing.TraceError, match=r"source value has shape \(1, 16, 64\)"):
        tracing.trace(model, clean, edits=[("blocks.0", Patch(shorter))])


def test_op_sites_need_ops(demo):
    model, clean, _ = demo
    with pytest.raises(ValueError, match="op sites need ops=True"):
        tracing.trace(model, clean, ops=False, edits=[("blocks.0:add#0", Zero())])
    t = tracing.trace(model, clean, ops=False, edits=[("blocks.0", Zero())])
    assert t.meta["edits"][0]["steps"]
