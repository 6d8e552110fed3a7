"""Attention maps rebuilt from F.scaled_dot_product_attention calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tracing.fused_attention import attention_weights, bind_arguments, weights_from_call

# --------------------------------------------------------------------------- the rebuild


def _qkv(B=2, H=3, T=5, D=8, Hkv=None, S=None, dtype=torch.float64):
    Hkv = Hkv or H
    S = S or T
    q = torch.randn(B, H, T, D, dtype=dtype)
    k = torch.randn(B, Hkv, S, D, dtype=dtype)
    v = torch.randn(B, Hkv, S, D, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"is_causal": True},
        {"scale": 0.3},
        {"is_causal": True, "scale": 2.0},
    ],
)
def test_weights_times_values_equal_fused_output(kwargs):
    q, k, v = _qkv()
    fused = F.scaled_dot_product_attention(q, k, v, **kwargs)
    w = attention_weights(q, k, **kwargs)
    assert w.shape == (2, 3, 5, 5)  # (B, H, T, T)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=w.dtype))
    torch.testing.assert_close(w @ v, fused)


def test_causal_map_is_lower_triangular():
    q, k, _ = _qkv()
    w = attention_weights(q, k, is_causal=True)
    upper = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    assert (w[..., upper] == 0).all()
    assert (w[..., ~upper] > 0).all()


def test_bool_and_float_masks_broadcast_like_the_kernel():
    q, k, v = _qkv()
    bool_mask = torch.rand(2, 1, 5, 5) > 0.3  # (B, 1, T, T), broadcast over heads
    bool_mask[..., 0] = True  # at least one key per row
    float_mask = torch.randn(5, 5, dtype=torch.float64)
    for mask in (bool_mask, float_mask):
        fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        w = attention_weights(q, k, attn_mask=mask)
        torch.testing.assert_close(w @ v, fused)
    w = attention_weights(q, k, attn_mask=bool_mask)
    assert (w.masked_select(~bool_mask.expand_as(w)) == 0).all()


def test_fully_masked_row_is_zero_like_the_kernel():
    q, k, v = _qkv()
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    w = attention_weights(q, k, attn_mask=mask)
    assert not torch.isnan(w).any()
    assert (w[:, :, 2] == 0).all()
    torch.testing.assert_close(w @ v, fused)


def test_grouped_query_attention():
    q, k, v = _qkv(H=4, Hkv=2)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    w = attention_weights(q, k, is_causal=True, enable_gqa=True)
    assert w.shape == (2, 4, 5, 5)
    torch.testing.assert_close(w @ v.repeat_interleave(2, dim=1), fused)
    with pytest.raises(ValueError, match="enable_gqa"):
        attention_weights(q, k)


def test_cross_attention_lengths_and_float32():
    q, k, v = _qkv(T=3, S=7, dtype=torch.float32)
    fused = F.scaled_dot_product_attention(q, k, v)
    w = attention_weights(q, k)
    assert w.shape == (2, 3, 3, 7) and w.dtype == torch.float32
    torch.testing.assert_close(w @ v, fused, rtol=1e-5, atol=1e-5)


def test_arguments_bind_positionally_and_by_name():
    q, k, v = _qkv()
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    a = weights_from_call((q, k, v, mask), {})
    b = weights_from_call((q,), {"key": k, "value": v, "is_causal": True})
    torch.testing.assert_close(a, b)
    assert bind_arguments((q, k, v), {"scale": 0.5})["scale"] == 0.5
    with pytest.raises(TypeError, match="unexpected argument 'bogus'"):
        bind_arguments((q, k, v), {"bogus": 1})
    with pytest.raises(ValueError, match="cannot be used together"):
        weights_from_call((q, k, v, mask), {"is_causal": True})
