"""The logit lens and per-head contributions, against independent reference computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.tiny_models import tiny_gpt2

import tracing
from scratchformer import DecoderOnlyTransformer, ModelConfig
from tracing.analysis.lens import find_blocks, head_contributions, head_writes, logit_lens

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return DecoderOnlyTransformer(ModelConfig.preset("demo", n_layers=3, block_size=16)).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def values_trace(model, tokens):
    return tracing.trace(model, tokens, capture="values", meta={"tokens": tokens.tolist()})


def _stream_after(model, tokens, n_blocks: int) -> torch.Tensor:
    """The residual stream after ``n_blocks`` blocks, computed by calling modules by hand."""
    with torch.no_grad():
        x = model.position_encoding(model.token_embedding(tokens))  # (B, T, C)
        for block in model.blocks[:n_blocks]:
            x = block(x)
    return x


# --------------------------------------------------------------------------- logit lens


def test_logit_lens_matches_reading_out_each_block_by_hand(model, tokens, values_trace):
    lens = logit_lens(model, values_trace, include_embeddings=True, top_k=3, batch=1)
    assert lens.layers == ["embeddings", "blocks.0", "blocks.1", "blocks.2"]
    assert lens.top_tokens.shape == (4, 7, 3) and lens.shape == (4, 7)
    assert lens.input_tokens == tokens[1].tolist()
    with torch.no_grad():
        final = torch.softmax(model(tokens)[1], -1)  # (T, V): the model's own prediction
    np.testing.assert_array_equal(lens.final_tokens, final.argmax(-1).numpy())
    for layer in range(4):
        with torch.no_grad():
            x = _stream_after(model, tokens, layer)[1]
            probs = torch.softmax(model.lm_head(model.final_norm(x)), -1)  # (T, V)
        top = probs.topk(3, -1)
        np.testing.assert_array_equal(lens.top_tokens[layer], top.indices.numpy())
        np.testing.assert_allclose(lens.top_probs[layer], top.values.numpy(), rtol=1e-5)
        expected = probs.gather(-1, final.argmax(-1, keepdim=True))[:, 0]
        np.testing.assert_allclose(lens.final_token_probs[layer], expected.numpy(), rtol=1e-5)
    # the last layer's read-out is the model's output
    np.testing.assert_allclose(lens.final_token_probs[-1], final.max(-1).values.numpy(), 1e-5)
    assert lens.top_token.shape == lens.top_prob.shape == (4, 7)
    assert set(lens.to_dict()) >= {"layers", "top_tokens", "final_token_probs"}


def test_logit_lens_needs_values(model, tokens):
    t = tracing.trace(model, tokens, capture="stats")
    with pytest.raises(ValueError, match="capture='values'"):
        logit_lens(model, t)
    with pytest.raises(ValueError, match="no module 'nope'"):
        logit_lens(model, tracing.trace(model, tokens, capture="values"), lm_head="nope")


def test_find_blocks_prefers_blocks_then_largest_uniform_list(values_trace):
    assert find_blocks(values_trace) == ["blocks.0", "blocks.1", "blocks.2"]


# --------------------------------------------------------------------------- heads


def test_head_writes_sum_to_the_attention_output(model, values_trace):
    for i in range(3):
        path = f"blocks.{i}.self_attn"
        writes, bias = head_writes(model, values_trace, path)
        assert writes.shape == (2, 4, 7, 64)  # (B, H, T, C)
        attn_out = values_trace.value(values_trace.module_steps(path)[0].outputs[0])
        torch.testing.assert_close(writes.sum(1) + bias, attn_out, rtol=1e-5, atol=1e-6)
        # head h alone: its slice of the concatenated heads through W_o's matching columns
        W = model.blocks[i].self_attn.W_o.weight
        concat = values_trace.value(values_trace.module_steps(f"{path}.W_o")[0].inputs[0])
        h = 2
        ref = concat[..., h * 16 : (h + 1) * 16] @ W[:, h * 16 : (h + 1) * 16].T
        torch.testing.assert_close(writes[:, h], ref, rtol=1e-5, atol=1e-6)


def test_head_contributions_layers_by_heads(model, values_trace):
    contrib = head_contributions(model, values_trace)
    assert contrib.shape == (3, 4)  # (layers, heads)
    writes, _ = head_writes(model, values_trace, "blocks.1.self_attn")
    np.testing.assert_allclose(contrib[1], writes.norm(dim=-1).mean(dim=(0, 2)).numpy(), 1e-5)
    assert (contrib > 0).all()
    per_pos = head_contributions(model, values_trace, per_position=True)
    assert per_pos.shape == (3, 4, 7)
    np.testing.assert_allclose(per_pos.mean(-1), contrib, rtol=1e-5)


# --------------------------------------------------------------------------- HF GPT-2


@pytest.fixture(scope="module")
def gpt2():
    return tiny_gpt2(n_positions=16)


@pytest.mark.slow
def test_logit_lens_and_heads_on_hf_gpt2(gpt2):
    x = torch.randint(0, 97, (1, 6))
    t = tracing.trace(gpt2, x, capture="values")
    lens = logit_lens(gpt2, t, final_norm="transformer.ln_f")
    assert lens.layers == ["transformer.h.0", "transformer.h.1"]
    with torch.no_grad():
        probs = torch.softmax(gpt2(x).logits[0], -1)
    np.testing.assert_allclose(lens.final_token_probs[-1], probs.max(-1).values.numpy(), 1e-5)
    writes, bias = head_writes(gpt2, t, "transformer.h.1.attn", out_proj="c_proj")
    proj_out = t.value(t.module_steps("transformer.h.1.attn.c_proj")[0].outputs[0])
    torch.testing.assert_close(writes.sum(1) + bias, proj_out, rtol=1e-5, atol=1e-6)
    assert head_contributions(gpt2, t, out_proj="c_proj").shape == (2, 4)
