"""Attention against PyTorch's own implementations (independent references)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from scratchformer import MultiHeadAttention, ScaledDotProductAttention


def test_sdpa_matches_torch_causal():
    B, H, T, D = 3, 4, 17, 8
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    sdpa = ScaledDotProductAttention(block_size=32).double()
    out, weights = sdpa(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    err = (out - ref).abs().max().item()
    print(f"SDPA max abs error vs torch (float64): {err:.2e}")
    assert err < 1e-6
    # also in float32, the dtype the model runs in
    out32, _ = ScaledDotProductAttention(32)(q.float(), k.float(), v.float())
    ref32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    err32 = (out32 - ref32).abs().max().item()
    print(f"SDPA max abs error vs torch (float32): {err32:.2e}")
    assert err32 < 1e-6
    assert weights.shape == (B, H, T, T)


def test_sdpa_weights_are_causal_distributions():
    q, k, v = (torch.randn(2, 3, 9, 5) for _ in range(3))
    _, weights = ScaledDotProductAttention(block_size=9)(q, k, v)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 9))
    above = torch.triu(torch.ones(9, 9, dtype=torch.bool), diagonal=1)
    assert (weights[..., above] == 0).all()
    assert (weights[..., ~above] > 0).all()


def test_sdpa_extra_mask_combines_with_causal():
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    keep = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    keep[..., 0] = False  # hide key 0 ... except from query 0, which would see nothing
    keep[..., 0, 0] = True
    out, weights = ScaledDotProductAttention(6)(q, k, v, keep)
    assert (weights[..., 1:, 0] == 0).all()
    allowed = torch.tril(torch.ones(6, 6, dtype=torch.bool)) & keep
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, ref)


def test_sdpa_rejects_sequence_longer_than_block():
    q = torch.randn(1, 1, 5, 4)
    with pytest.raises(ValueError, match="block_size=4"):
        ScaledDotProductAttention(4)(q, q, q)


def test_mha_matches_nn_multiheadattention():
    C, H, T, B = 32, 4, 11, 2
    ours = MultiHeadAttention(C, H, block_size=16)
    ref = nn.MultiheadAttention(C, H, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        ref.out_proj.weight.copy_(ours.W_o.weight)
        ref.out_proj.bias.copy_(ours.W_o.bias)
    x = torch.randn(B, T, C)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True = blocked
    expected, _ = ref(x, x, x, attn_mask=future, need_weights=False)
    got = ours(x, x, x)
    err = (got - expected).abs().max().item()
    print(f"MHA max abs error vs nn.MultiheadAttention: {err:.2e}")
    assert err < 1e-5


def test_split_heads_shapes():
    mha = MultiHeadAttention(12, 3, block_size=8)
    x = torch.arange(2 * 5 * 12, dtype=torch.float32).view(2, 5, 12)
    heads = mha.split_heads(x, 2)
    assert heads.shape == (2, 3, 5, 4)
    # head h at time t holds the h-th slice of width D of position t
    torch.testing.assert_close(heads[1, 2, 3], x[1, 3, 8:12])


def test_attention_weights_visible_to_a_forward_hook():
    mha = MultiHeadAttention(16, 2, block_size=8)
    seen = []
    mha.attention.register_forward_hook(lambda m, args, out: seen.append(out[1]))
    mha(*(torch.randn(1, 5, 16),) * 3)
    assert len(seen) == 1 and seen[0].shape == (1, 2, 5, 5)
