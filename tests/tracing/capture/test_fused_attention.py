"""Attention maps rebuilt from F.scaled_dot_product_attention calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import tiny_gpt2

from tracing.capture.fused_attention import attention_weights, bind_arguments, weights_from_call

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


def test_one_key_head_broadcasts_to_every_query_head_without_enable_gqa():
    """Multi-query attention (Falcon's sdpa path): the kernel broadcasts a single key head."""
    q, k, v = _qkv(H=4, Hkv=1)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    w = attention_weights(q, k, is_causal=True)
    assert w.shape == (2, 4, 5, 5)
    torch.testing.assert_close(w @ v, fused)
    with pytest.raises(ValueError, match="enable_gqa"):
        attention_weights(*_qkv(H=4, Hkv=2)[:2])


def test_falcon_multi_query_sdpa_maps_equal_eager_and_its_heads_edit():
    """Falcon's multi-query sdpa call (one key head, no enable_gqa) gives eager's maps, and a
    head edit by its attention module's path equals zeroing that head's ``dense`` columns."""
    import copy

    import transformers
    from tracing.edits import Edit, Zero

    import tracing

    models = {}
    for impl in ("sdpa", "eager"):
        torch.manual_seed(0)
        config = transformers.FalconConfig(
            vocab_size=60, hidden_size=48, num_hidden_layers=2, num_attention_heads=6
        )
        models[impl] = transformers.FalconForCausalLM._from_config(
            config, attn_implementation=impl
        ).eval()
    x = torch.randint(0, 60, (2, 7))
    with torch.no_grad():
        eager = models["eager"](x, output_attentions=True).attentions
    t = tracing.trace(models["sdpa"], x, capture="shapes")
    got = t.attention_maps()
    assert len(got) == len(eager) == 2
    for ref, (_, m) in zip(eager, sorted(got.items())):
        torch.testing.assert_close(m, ref, rtol=1e-5, atol=1e-6)

    edited = tracing.trace(
        models["sdpa"],
        x,
        capture="values",
        edits=[Edit("transformer.h.1.self_attention", Zero(), head=2)],
    )
    surgery = copy.deepcopy(models["sdpa"])
    with torch.no_grad():
        surgery.transformer.h[1].self_attention.dense.weight[:, 16:24] = 0
        want = surgery(x).logits
        assert not torch.allclose(want, models["sdpa"](x).logits)
    torch.testing.assert_close(edited.value(edited.steps[0].outputs[0]), want, rtol=0, atol=2e-6)


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


# --------------------------------------------------------------------------- in the tracer


class FusedSelfAttention(torch.nn.Module):
    """Multi-head self-attention through the fused kernel (no weights come back)."""

    def __init__(self, C: int = 16, H: int = 4, causal: bool = True):
        super().__init__()
        self.H, self.causal = H, causal
        self.qkv = torch.nn.Linear(C, 3 * C)
        self.proj = torch.nn.Linear(C, C)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class TinyFusedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = FusedSelfAttention()
        self.cross = FusedSelfAttention(causal=False)

    def forward(self, x, mask=None):
        return self.cross(self.attn(x), mask)


@pytest.mark.parametrize("capture", ["shapes", "stats", "values"])
def test_tracer_rebuilds_fused_attention_maps(capture):
    import tracing

    model = TinyFusedModel().eval()
    x = torch.randn(2, 6, 16)
    mask = torch.rand(2, 1, 6, 6) > 0.4
    mask[..., 0] = True
    t = tracing.trace(model, x, mask, capture=capture)
    maps = t.attention_maps()
    assert set(maps) == {"attn", "cross"}
    for path, m, kwargs in (("attn", model.attn, {"is_causal": True}),
                            ("cross", model.cross, {"attn_mask": mask})):  # fmt: skip
        (op,) = [s for s in t.steps if s.op == "scaled_dot_product_attention" and s.module == path]
        rec = t.tensor(op.outputs[-1])
        assert rec.role == "attention" and rec.shape == (2, 4, 6, 6)
        assert op.output_names == ("output", "attention_weights")
        # reference: the same q, k, v recomputed outside the tracer
        with torch.no_grad():
            inp = x if path == "attn" else model.attn(x)
            q, k, v = m.qkv(inp).split(16, dim=-1)
            q, k, v = (u.view(2, 6, 4, 4).transpose(1, 2) for u in (q, k, v))
            fused = F.scaled_dot_product_attention(q, k, v, **kwargs)
        torch.testing.assert_close(maps[path] @ v, fused, rtol=1e-5, atol=1e-6)
    # tracing did not change the result
    with torch.no_grad():
        assert torch.equal(model(x, mask), model(x, mask))


@pytest.mark.slow
def test_hf_gpt2_sdpa_maps_equal_eager_output_attentions():
    import tracing

    maps = {}
    for impl in ("sdpa", "eager"):
        maps[impl] = tiny_gpt2(vocab_size=50, n_positions=16, attn_implementation=impl)
    x = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        eager = maps["eager"](x, output_attentions=True).attentions  # L x (B, H, T, T)
    t = tracing.trace(maps["sdpa"], x, capture="shapes")
    assert any(s.op == "scaled_dot_product_attention" for s in t.steps)
    got = t.attention_maps()
    assert list(got) == ["transformer.h.0.attn", "transformer.h.1.attn"]
    for layer, ref in enumerate(eager):
        torch.testing.assert_close(got[f"transformer.h.{layer}.attn"], ref, rtol=1e-5, atol=1e-6)
