"""Attention maps of Hugging Face models whose maps are not a plain ``(B, H, T, T)`` softmax
in an attention module, against what each returns with ``output_attentions=True``:

- MVP and TrOCR fold the heads into the batch: their softmax is ``(B·H, T, T)``;
- CPM-Ant's softmax is an ``nn.Softmax`` child of its attention, over its 32 learned prompt
  tokens and the input (``Pr+T``); its eager maps drop the prompt;
- DeepSeek-V4's hyper-connections make a ``(B, T, 4, 4)`` softmax in a module called
  ``attn_hc``, and its compressor a softmax gate: neither is a map;
- MiniMax's lightning (linear) attention returns its ``KᵀV`` state ``(B, H, D, D)`` where
  an attention returns its weights: no map either.
"""

from __future__ import annotations

import pytest
import torch
from helpers.dims_models import from_config

import tracing

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

B, T = 3, 11


def _eager(model, ids) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model(ids, output_attentions=True).attentions


def mvp():
    from transformers import MvpConfig, MvpForCausalLM

    return from_config(
        MvpConfig, MvpForCausalLM, d_model=48, decoder_layers=2, encoder_layers=1,
        decoder_attention_heads=6, encoder_attention_heads=6, decoder_ffn_dim=40,
        encoder_ffn_dim=40, max_position_embeddings=32, use_cache=False,
    )  # fmt: skip


def trocr():
    from transformers import TrOCRConfig, TrOCRForCausalLM

    return from_config(
        TrOCRConfig, TrOCRForCausalLM, d_model=48, decoder_layers=2, decoder_attention_heads=6,
        decoder_ffn_dim=40, max_position_embeddings=32, use_cache=False,
    )  # fmt: skip


def cpmant():
    from transformers import CpmAntConfig, CpmAntForCausalLM

    return from_config(
        CpmAntConfig, CpmAntForCausalLM, hidden_size=48, num_attention_heads=6, dim_head=8,
        dim_ff=40, num_hidden_layers=2, prompt_length=5, prompt_types=3, use_cache=False,
    )  # fmt: skip


def deepseek_v4():
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    return from_config(
        DeepseekV4Config, DeepseekV4ForCausalLM, hidden_size=96, num_attention_heads=6,
        num_key_value_heads=1, head_dim=20, qk_rope_head_dim=8, q_lora_rank=26,
        intermediate_size=200, moe_intermediate_size=40, num_hidden_layers=2,
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        n_routed_experts=5, num_experts_per_tok=2, index_n_heads=3, index_head_dim=8,
        index_topk=4, sliding_window=8, max_position_embeddings=64, use_cache=False,
    )  # fmt: skip


@pytest.mark.parametrize("build", [mvp, trocr], ids=["mvp", "trocr"])
def test_heads_folded_into_the_batch_give_maps_equal_to_eager(build):
    model, ids = build()
    trace = tracing.trace(model, ids, capture="shapes")
    maps = trace.attention_maps()
    assert list(maps) == [f"model.decoder.layers.{i}.self_attn" for i in range(2)]
    for got, want in zip(maps.values(), _eager(model, ids), strict=True):
        assert got.shape == (B, 6, T, T)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    softmaxes = [r for r in trace.tensors if r.role == "attention"]
    assert [r.dims for r in softmaxes] == [("B·H", "T", "T")] * 2  # as the model made them


def test_a_softmax_module_in_attention_over_a_learned_prompt():
    model, ids = cpmant()
    trace = tracing.trace(model, ids, capture="shapes")
    maps = trace.attention_maps()
    layers = [f"cpmant.encoder.layers.{i}.self_att.self_attention" for i in range(2)]
    assert list(maps) == layers  # the attention module's, not its nn.Softmax child's
    records = [r for r in trace.tensors if r.role == "attention"]
    assert [r.dims for r in records] == [("B", "H", "Pr+T", "Pr+T")] * 2
    assert trace.meta["dim_letters"]["Pr"] == {
        "size": 5,
        "origin": "config.prompt_length",
        "meaning": "prompt: learned tokens the model puts before T",
    }
    for got, want in zip(maps.values(), _eager(model, ids), strict=True):
        assert got.shape == (B, 6, 5 + T, 5 + T)  # the softmax the model computed
        torch.testing.assert_close(got[..., 5:, 5:], want, atol=1e-6, rtol=0)  # eager's part


def test_hyper_connections_and_compressor_gates_are_not_maps():
    model, ids = deepseek_v4()
    trace = tracing.trace(model, ids, capture="shapes")
    maps = trace.attention_maps()
    assert list(maps) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    for got, want in zip(maps.values(), _eager(model, ids), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    softmax_paths = {
        trace.steps[r.producer].module
        for r in trace.tensors
        if r.producer is not None and trace.steps[r.producer].op == "softmax"
    }
    assert "model.layers.0.attn_hc" in softmax_paths  # a softmax there, not an attention map
    hc = [
        r
        for r in trace.tensors
        if r.producer is not None and ".attn_hc" in trace.steps[r.producer].module
    ]
    assert all(r.role != "attention" for r in hc)
    mixing = [r.dims for r in hc if trace.steps[r.producer].op == "softmax"]
    assert (
        mixing == [("B", "T", "hc_mult", "hc_mult")] * 2
    )  # config.hc_mult streams, not R/2 by size


def test_a_linear_attention_state_returned_as_weights_is_not_a_map():
    from transformers import MiniMaxConfig, MiniMaxForCausalLM

    model, ids = from_config(
        MiniMaxConfig, MiniMaxForCausalLM, hidden_size=96, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, intermediate_size=200, num_hidden_layers=2,
        layer_types=["full_attention", "linear_attention"], num_local_experts=5,
        num_experts_per_tok=2, block_size=4, max_position_embeddings=64, use_cache=False,
    )  # fmt: skip
    full, linear = _eager(model, ids)
    assert full.shape == (B, 6, T, T) and linear.shape == (B, 6, 16, 16)  # (B, H, D, D)
    trace = tracing.trace(model, ids, capture="shapes")
    maps = trace.attention_maps()
    assert list(maps) == ["model.layers.0.self_attn"]
    torch.testing.assert_close(maps["model.layers.0.self_attn"], full, atol=1e-6, rtol=0)
    states = [r for r in trace.tensors if r.shape == (B, 6, 16, 16) and r.producer is not None]
    assert states and all(r.role != "attention" for r in states)


def test_heads_folded_into_the_batch_edit_by_the_attention_module_path():
    """MVP's (B·H, T, D) per-head output: head h is rows b·H + h; zeroing it by the
    attention module's path equals zeroing head h's input columns of out_proj, and a heads
    sweep has a row per layer."""
    import copy

    from tracing.edits import Edit, Zero

    from tracing.runs.patching import head_sites, sweep

    model, ids = mvp()
    trace = tracing.trace(model, ids, capture="shapes")
    assert [str(s) for s, _ in head_sites(trace)] == [
        f"model.decoder.layers.{i}.self_attn@0:bmm#1" for i in range(2)
    ]
    edited = tracing.trace(
        model,
        ids,
        capture="values",
        edits=[Edit("model.decoder.layers.1.self_attn", Zero(), head=4)],
    )
    assert edited.meta["edits"][0]["heads_folded"] == 6
    surgery = copy.deepcopy(model)
    D = surgery.config.d_model // 6
    with torch.no_grad():
        surgery.model.decoder.layers[1].self_attn.out_proj.weight[:, 4 * D : 5 * D] = 0
        want, plain = surgery(ids).logits, model(ids).logits
    assert not torch.allclose(want, plain)
    torch.testing.assert_close(edited.value(edited.steps[0].outputs[0]), want, atol=2e-6, rtol=0)
    result = sweep(model, ids, ids.flip(1), over="heads", action=Zero())
    assert result.rows == ["layer 0", "layer 1"] and len(result.columns) == 6


def test_a_head_of_cpmant_edits_by_its_attention_module_path():
    """CPM-Ant's map is made in an nn.Softmax child and masked after it; zeroing head h by
    the attention module's path equals zeroing head h's columns of attention_out."""
    import copy

    from tracing.edits import Edit, Zero

    model, ids = cpmant()
    path = "cpmant.encoder.layers.1.self_att.self_attention"
    edited = tracing.trace(model, ids, capture="values", edits=[Edit(path, Zero(), head=2)])
    assert edited.meta["edits"][0]["site"] == f"{path}:matmul#1"
    surgery = copy.deepcopy(model)
    with torch.no_grad():
        surgery.get_submodule(path).attention_out.weight[:, 2 * 8 : 3 * 8] = 0
        want, plain = surgery(ids).logits, model(ids).logits
    assert not torch.allclose(want, plain)
    torch.testing.assert_close(edited.value(edited.steps[0].outputs[0]), want, atol=2e-6, rtol=0)
