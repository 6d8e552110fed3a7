"""Attention features on architectures found by ``benchmarks/bench_attention_architectures.py``:
each test a tiny config of one, against eager ``output_attentions`` or weight surgery."""

from __future__ import annotations

import copy

import pytest
import torch
from tracing.edits import Edit, Zero

import tracing

transformers = pytest.importorskip("transformers")


def _longcat():
    torch.manual_seed(0)
    config = transformers.LongcatFlashConfig(
        vocab_size=60, hidden_size=48, num_layers=1, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=12, qk_rope_head_dim=4,
        qk_nope_head_dim=6, v_head_dim=5, head_dim=4, n_routed_experts=2, zero_expert_num=1,
        moe_topk=2, expert_ffn_hidden_size=16, ffn_hidden_size=32, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.LongcatFlashForCausalLM._from_config(
        config, attn_implementation="eager"
    ).eval()


def test_attention_modules_in_a_list_make_maps_and_edit_by_path():
    """LongCat-Flash keeps two ``LongcatFlashMLA`` per layer in ``self_attn`` (a ModuleList):
    ``self_attn.0``, ``self_attn.1``; neither name says attention, the list's does. Their
    eager softmax is the map ``output_attentions`` returns, and a head edit by the module's
    path equals zeroing that head's ``o_proj`` columns (``H·Dv``: Dv = 5)."""
    model = _longcat()
    ids = torch.randint(0, 60, (2, 7))
    with torch.no_grad():
        eager = model(ids, output_attentions=True).attentions
    t = tracing.trace(model, ids, capture="shapes")
    maps = t.attention_maps()
    assert list(maps) == ["model.layers.0.self_attn.0", "model.layers.0.self_attn.1"]
    assert len(eager) == 2
    for ref, got in zip(eager, maps.values()):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)

    path = "model.layers.0.self_attn.1"
    edited = tracing.trace(model, ids, capture="values", edits=[Edit(path, Zero(), head=2)])
    surgery = copy.deepcopy(model)
    with torch.no_grad():
        surgery.get_submodule(path).o_proj.weight[:, 10:15] = 0
        want = surgery(ids).logits
        assert (want - model(ids).logits).abs().max() > 1e-4
    got = edited.value(edited.steps[0].outputs[0])
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
