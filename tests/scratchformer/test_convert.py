"""Hugging Face GPT-2 -> our model: same weights, same logits (random weights, no download)."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import tiny_gpt2

transformers = pytest.importorskip("transformers")

from scratchformer import DecoderOnlyTransformer  # noqa: E402
from scratchformer.convert import config_from_hf_gpt2, from_hf_gpt2  # noqa: E402


def small_hf_gpt2(**overrides):
    model = tiny_gpt2(
        n_layer=3, n_embd=48, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **overrides
    )
    # HF initialises LayerNorms to identity and biases to 0; randomise them so the test
    # would catch a swapped or missing bias / LayerNorm parameter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.slow
def test_logits_match_hf_gpt2():
    hf = small_hf_gpt2()
    ours = from_hf_gpt2(hf)
    assert isinstance(ours, DecoderOnlyTransformer) and not ours.training
    idx = torch.randint(0, 97, (2, 32))
    with torch.no_grad():
        expected = hf(idx).logits
        got = ours(idx)
    err = (got - expected).abs().max().item()
    print(f"GPT-2 logits max abs error vs transformers: {err:.2e}")
    assert err < 1e-4
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters())


def test_conversion_ties_and_transposes():
    hf = small_hf_gpt2()
    ours = from_hf_gpt2(hf)
    assert ours.lm_head.weight is ours.token_embedding.weight
    c_attn = hf.transformer.h[1].attn.c_attn.weight  # Conv1D: (C, 3C), y = x @ W
    torch.testing.assert_close(ours.blocks[1].self_attn.W_k.weight, c_attn[:, 48:96].T)
    c_fc = hf.transformer.h[2].mlp.c_fc.weight  # (C, F)
    torch.testing.assert_close(ours.blocks[2].feed_forward.linear1.weight, c_fc.T)


def test_config_mapping_of_real_gpt2_small_is_our_preset():
    from scratchformer import ModelConfig

    cfg = config_from_hf_gpt2(transformers.GPT2Config())  # GPT-2 small's published config
    assert cfg == ModelConfig.preset("gpt2-small")


def test_unsupported_activation_is_named():
    with pytest.raises(ValueError, match="silu"):
        config_from_hf_gpt2(transformers.GPT2Config(activation_function="silu"))
