"""Attention maps: from our ScaledDotProductAttention, and from softmax in models we did
not write, compared with what each model itself returns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import tiny_gpt2, tiny_model
from torch import nn

import tracing


def test_our_model_maps_equal_the_weights_the_module_returns():

    model = tiny_model(seed=None)
    tokens = torch.randint(0, 40, (2, 9))
    returned = {}

    def keep(path):
        def hook(module, args, output):
            returned[path] = output[1].detach().clone()

        return hook

    handles = [
        m.register_forward_hook(keep(p))
        for p, m in model.named_modules()
        if type(m).__name__ == "ScaledDotProductAttention"
    ]
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    for capture in ("shapes", "stats", "values"):
        maps = tracing.trace(model, tokens, capture=capture).attention_maps()
        assert list(maps) == ["blocks.0.self_attn.attention", "blocks.1.self_attn.attention"]
        for path, weights in maps.items():
            assert weights.shape == (2, 4, 9, 9)
            assert torch.equal(weights, returned[path])
            # rows are distributions, the future is masked
            torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 9))
            assert torch.all(weights.triu(1) == 0)


@pytest.mark.slow
def test_hf_gpt2_maps_equal_output_attentions():
    model = tiny_gpt2(seed=None, n_layer=3, vocab_size=64, n_positions=16)
    tokens = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        expected = model(tokens, output_attentions=True).attentions
    trace = tracing.trace(model, tokens, capture="shapes")
    maps = trace.attention_maps()
    assert list(maps) == [f"transformer.h.{i}.attn" for i in range(3)]
    for got, want in zip(maps.values(), expected):
        assert torch.equal(got, want)
    records = [r for r in trace.tensors if r.role == "attention"]
    assert {r.dims for r in records} == {("B", "H", "T", "T")}


class ReusedAttention(nn.Module):
    """One attention module called twice, e.g. weight-shared layers."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        y, _ = self.attn(x, x, x, need_weights=True, average_attn_weights=False)
        z, _ = self.attn(y, y, y, need_weights=True, average_attn_weights=False)
        return z


def test_repeated_calls_are_keyed_path_and_path_hash_n():
    model = ReusedAttention().eval()
    x = torch.randn(2, 5, 8)
    # with autograd on, nn.MultiheadAttention skips its fused fast path (as under the tracer)
    _, w0 = model.attn(x, x, x, need_weights=True, average_attn_weights=False)
    w0 = w0.detach()
    maps = tracing.trace(model, x, capture="shapes").attention_maps()
    assert list(maps) == ["attn", "attn#1"]
    assert torch.equal(maps["attn"], w0)
    assert maps["attn#1"].shape == (2, 2, 5, 5)


def test_softmax_outside_attention_is_not_a_map():
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):  # rank 4 softmax, but not attention
            return F.softmax(self.lin(x), dim=-1)

    trace = tracing.trace(Classifier(), torch.randn(2, 3, 4, 4))
    assert trace.attention_maps() == {}
    assert all(r.role != "attention" for r in trace.tensors)


@pytest.mark.parametrize("batch_first", [False, True])
def test_torch_multihead_attention_maps_equal_per_head_weights(batch_first):
    torch.manual_seed(0)
    B, T, C, H = 2, 5, 16, 4
    layer = torch.nn.TransformerDecoderLayer(
        C, H, dim_feedforward=32, dropout=0.0, batch_first=batch_first
    ).eval()
    x = torch.randn(B, T, C) if batch_first else torch.randn(T, B, C)
    memory = torch.randn_like(x)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad():
        plain = layer(x, memory, tgt_mask=mask)
        with tracing.Tracer(layer, capture="shapes") as tracer:
            traced = layer(x, memory, tgt_mask=mask)
        t = tracer.trace
        # the reference: the same module asked for per-head weights on the same input
        _, expected = layer.self_attn(
            x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False
        )
    assert torch.equal(traced, plain)  # the recomputed weights leave the output alone
    maps = t.attention_maps()
    key = next(k for k in maps if k.startswith("self_attn"))
    got = maps[key]
    assert got.shape == (B, H, T, T)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got.sum(-1), torch.ones(B, H, T))
    assert torch.all(got.triu(1) == 0)
    assert any(k.startswith("multihead_attn") for k in maps)  # cross-attention too
