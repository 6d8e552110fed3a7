"""Letters that only some Hugging Face models have, each proven by their configs: CPM-Ant's
learned prompt before the tokens (``Pr+T``), its ``dim_head`` and ``dim_ff``; ProphetNet's
n-gram streams (``ngram``), its relative-position buckets (``Nb``) and its decoder's heads."""

from __future__ import annotations

import pytest
import torch
from helpers.dims_models import SMALL, from_config

import tracing

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

B, T = 3, 11


def _trace(config_class, model_class, **kwargs):
    model, ids = from_config(config_class, model_class, **{"use_cache": False, **kwargs})
    return tracing.trace(model, ids, capture="shapes")


def _axes(trace) -> list[tuple[str, int]]:
    return [
        (d, n)
        for r in trace.tensors
        if len(r.shape) >= 2 and r.dims
        for d, n in zip(r.dims, r.shape)
    ]


def _letters_fit(trace) -> None:
    """Every single-letter name stands for its letter's size."""
    sizes = {k: v["size"] for k, v in trace.meta["dim_letters"].items()}
    for name, size in _axes(trace):
        if name in sizes:
            assert sizes[name] == size, (name, size)


def test_cpmant_reads_its_prompt_head_width_and_feed_forward_from_its_config():
    from transformers import CpmAntConfig, CpmAntForCausalLM

    trace = _trace(
        CpmAntConfig, CpmAntForCausalLM, hidden_size=48, num_attention_heads=6, dim_head=8,
        dim_ff=40, num_hidden_layers=2, prompt_length=5, prompt_types=3,
    )  # fmt: skip
    axes = _axes(trace)
    assert sum(d != "?" for d, _ in axes) / len(axes) > 0.98  # was 0.55
    letters = trace.meta["dim_letters"]
    assert {k: (v["size"], v["origin"]) for k, v in letters.items() if k in ("Pr", "F")} == {
        "Pr": (5, "config.prompt_length"),
        "F": (40, "config.dim_ff"),
    }
    assert letters["D"]["size"] == 8 and letters["D"]["origin"].endswith("dim_head")
    assert ("Pr+T", 5 + T) in axes and ("T+Pr", 5 + T) not in axes  # one name, in cat order
    _letters_fit(trace)


def test_prophetnet_reads_its_streams_buckets_and_decoder_heads():
    from transformers import ProphetNetConfig, ProphetNetForCausalLM

    trace = _trace(
        ProphetNetConfig, ProphetNetForCausalLM, hidden_size=48, num_encoder_layers=1,
        num_decoder_layers=2, num_encoder_attention_heads=2, num_decoder_attention_heads=4,
        encoder_ffn_dim=36, decoder_ffn_dim=36, ngram=2, num_buckets=10,
        max_position_embeddings=32,
    )  # fmt: skip
    letters = {k: (v["size"], v["origin"]) for k, v in trace.meta["dim_letters"].items()}
    assert letters["H"] == (4, "config.num_decoder_attention_heads")  # not the encoder's 2
    assert letters["ngram"] == (2, "config.ngram") and letters["Nb"] == (10, "config.num_buckets")
    dims = {
        r.dims
        for r in trace.tensors
        if r.producer is not None and trace.steps[r.producer].op == "softmax"
    }
    assert ("B", "H", "T", "T") in dims  # the main stream's attention
    assert any(d[:3] == ("B", "ngram", "H") for d in dims)  # each predicting stream's
    axes = _axes(trace)
    assert ("Nb·H", 10 * 4) in axes  # the relative-position projection, then split
    _letters_fit(trace)


def test_a_factorised_embedding_reads_ce_and_one_as_wide_as_the_model_reads_c():
    from transformers import ElectraConfig, ElectraForCausalLM

    small = dict(num_hidden_layers=1, num_attention_heads=4, intermediate_size=36,
                 max_position_embeddings=32, is_decoder=True)  # fmt: skip
    trace = _trace(ElectraConfig, ElectraForCausalLM, hidden_size=48, embedding_size=20, **small)
    assert trace.meta["dim_letters"]["Ce"]["origin"] == "config.embedding_size"
    embeddings = [r.dims for r in trace.tensors if r.producer is not None and r.shape == (B, T, 20)]
    assert embeddings and all(d == ("B", "T", "Ce") for d in embeddings)
    _letters_fit(trace)
    same = _trace(ElectraConfig, ElectraForCausalLM, hidden_size=48, embedding_size=48, **small)
    assert "Ce" not in same.meta["dim_letters"]  # the same axis as the model's: C


@pytest.mark.parametrize("heads", [None, 5], ids=["consistent", "config-disagrees"])
def test_jetmoe_query_heads_are_its_top_k_experts_times_its_key_value_heads(heads):
    """JetMoE's attention is a mixture of experts: each token's top-k experts (K = 3) each
    project KV = 2 query heads, viewed ``(B, T, K, KV·D) -> (B, T, K·KV, D)``. The knob
    passes prove it: moving ``num_experts_per_tok`` or ``num_key_value_heads`` moves the axis,
    moving ``num_attention_heads`` moves nothing (the model never reads it). So it is
    ``K·KV`` whatever the config's ``num_attention_heads`` says, never ``E+1``."""
    from transformers import JetMoeConfig, JetMoeForCausalLM

    config = JetMoeConfig(
        **SMALL, use_cache=False, hidden_size=96, num_hidden_layers=1, num_key_value_heads=2,
        kv_channels=16, num_local_experts=5, num_experts_per_tok=3, intermediate_size=200,
        max_position_embeddings=40,
    )  # fmt: skip
    config._attn_implementation = "eager"
    if heads is not None:
        config.num_attention_heads = heads
    torch.manual_seed(0)
    model = JetMoeForCausalLM(config).eval()
    trace = tracing.trace(model, torch.randint(3, 101, (B, T)), capture="shapes")
    (weights,) = [r for r in trace.tensors if r.role == "attention"]
    assert weights.shape == (B, 6, T, T)
    assert weights.dims == ("B", "K·KV", "T", "T")
    assert all("E+1" not in r.dims for r in trace.tensors if r.dims)
    _letters_fit(trace)


def test_sliding_window_layers_with_their_own_heads_read_hw_kvw_dw():
    """Inkling-2's sliding-window layers have their own query heads, key/value heads and
    head width (``swa_*``); they read ``Hw``, ``KVw``, ``Dw`` where they differ from H, KV,
    D (and their projection ``Hw·Dw``), never a letter of the same size by chance."""
    from transformers import Inkling2ForCausalLM, Inkling2TextConfig

    trace = _trace(
        Inkling2TextConfig, Inkling2ForCausalLM, hidden_size=96, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, swa_num_attention_heads=14,
        swa_num_key_value_heads=7, swa_head_dim=12, sliding_window_size=32, rel_extent=32,
        num_hidden_layers=2, intermediate_size=200, moe_intermediate_size=40,
        n_routed_experts=5, num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    letters = {k: (v["size"], v["origin"]) for k, v in trace.meta["dim_letters"].items()}
    assert letters["Hw"] == (14, "config.swa_num_attention_heads")
    assert letters["KVw"] == (7, "config.swa_num_key_value_heads")
    assert letters["Dw"] == (12, "config.swa_head_dim")
    maps = [r.dims for r in trace.tensors if r.role == "attention"]
    assert maps and all(d[:3] == ("B", "Hw", "T") for d in maps)
    assert ("Hw·Dw", 14 * 12) in _axes(trace)
    _letters_fit(trace)


def test_gemma4_full_attention_layers_have_their_own_head_width():
    """Gemma-4's config gives its full-attention layers their own head width
    (``global_head_dim``, 52 here, where the sliding layers' ``D`` is 16) through
    ``per_layer_config``, and the
    per-layer input embeddings their own width (``hidden_size_per_layer_input``, 18)."""
    import transformers as tf

    trace = _trace(
        tf.Gemma4TextConfig, tf.Gemma4ForCausalLM,
        hidden_size=96, intermediate_size=200, num_attention_heads=6, num_key_value_heads=2,
        head_dim=16, global_head_dim=52, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=8,
        hidden_size_per_layer_input=18, vocab_size_per_layer_input=101,
        max_position_embeddings=76,
    )  # fmt: skip
    letters = trace.meta["dim_letters"]
    assert (
        letters["D"]["size"],
        letters["global_head_dim"]["size"],
        letters["hidden_size_per_layer_input"]["size"],
    ) == (16, 52, 18)
    assert letters["global_head_dim"]["origin"] == "config.per_layer_config[…].head_dim"
    assert "vocab_size_per_layer_input" not in letters  # the model's own vocabulary: V
    _letters_fit(trace)
    views = {
        (s.module, trace.tensors[s.outputs[0]].dims)
        for s in trace.steps
        if s.op == "view" and s.module.endswith("self_attn")
    }
    assert ("model.layers.0.self_attn", ("B", "T", "H", "D")) in views
    assert ("model.layers.1.self_attn", ("B", "T", "H", "global_head_dim")) in views
    assert ("model.layers.1.self_attn", ("B", "T", "KV", "global_head_dim")) in views
    assert any(r.dims and r.dims[-1] == "hidden_size_per_layer_input" for r in trace.tensors)
