"""Attention and MLP steps written out axis by axis for the models people write by hand:
nanoGPT's ``model.py``, the tutorial's classes (verbatim, fixed), ``nn.TransformerDecoder``
and our own ``scratchformer`` model. (The Hugging Face architectures are in
``test_dims_evidence.py``.)"""

from __future__ import annotations

import pytest
import torch
from helpers.dims_models import steps_of
from helpers.own_models import NANOGPT, TUTORIAL_FIXED, load
from test_dims_evidence import DecoderLM

import tracing

pytestmark = pytest.mark.usefixtures("one_thread")


def test_nanogpt_attention_and_mlp():
    loaded = load(NANOGPT, "gpt", shape=(2, 10))
    trace = tracing.trace(loaded.model, *loaded.args, capture="shapes")
    assert steps_of(trace, "h.0.attn") == [
        ("c_attn", "linear", "(B,T,3C)"),
        ("", "split", "(B,T,C) (B,T,C) (B,T,C)"),
        ("", "view", "(B,T,H,D)"),
        ("", "transpose", "(B,H,T,D)"),
        ("", "view", "(B,T,H,D)"),
        ("", "transpose", "(B,H,T,D)"),
        ("", "view", "(B,T,H,D)"),
        ("", "transpose", "(B,H,T,D)"),
        ("", "scaled_dot_product_attention", "(B,H,T,D) (B,H,T,T)"),
        ("", "transpose", "(B,T,H,D)"),
        ("", "contiguous", "(B,T,H,D)"),
        ("", "view", "(B,T,C)"),
        ("c_proj", "linear", "(B,T,C)"),
    ]
    assert steps_of(trace, "h.0.mlp") == [
        ("c_fc", "linear", "(B,T,F)"),
        ("gelu", "gelu", "(B,T,F)"),
        ("c_proj", "linear", "(B,T,C)"),
    ]


def test_tutorial_attention_and_feed_forward():
    loaded = load(TUTORIAL_FIXED, "TutorialLM", shape=(2, 10))
    trace = tracing.trace(loaded.model, *loaded.args, capture="shapes")
    qkv = [("view", "(B,T,H,D)"), ("transpose", "(B,H,T,D)")] * 3
    assert steps_of(trace, "blocks.0.self_attn") == [
        ("W_q", "linear", "(B,T,C)"),
        ("W_k", "linear", "(B,T,C)"),
        ("W_v", "linear", "(B,T,C)"),
        *(("", op, dims) for op, dims in qkv),
        ("", "transpose", "(B,H,D,T)"),
        ("", "matmul", "(B,H,T,T)"),
        ("", "div", "(B,H,T,T)"),
        ("", "eq", "(T,T)"),  # the causal mask
        ("", "masked_fill", "(B,H,T,T)"),
        ("", "softmax", "(B,H,T,T)"),
        ("", "matmul", "(B,H,T,D)"),
        ("", "transpose", "(B,T,H,D)"),
        ("", "contiguous", "(B,T,H,D)"),
        ("", "view", "(B,T,C)"),
        ("W_o", "linear", "(B,T,C)"),
    ]
    assert steps_of(trace, "blocks.0.feed_forward") == [
        ("linear1", "linear", "(B,T,F)"),
        ("relu", "relu", "(B,T,F)"),
        ("linear2", "linear", "(B,T,C)"),
    ]


def test_transformer_decoder_layer():
    torch.manual_seed(0)
    trace = tracing.trace(DecoderLM().eval(), torch.randint(0, 101, (3, 11)), capture="shapes")
    got = steps_of(trace, "decoder.layers.0")
    assert got[:3] == [  # batch first: PyTorch's MHA works time first
        ("self_attn", "transpose", "(T,B,C)"),
        ("self_attn", "multi_head_attention_forward", "(T,B,C) (B,H,T,D) (B,H,T,T)"),
        ("self_attn", "transpose", "(B,T,C)"),
    ]
    assert ("multihead_attn", "multi_head_attention_forward", "(T,B,C) (B,H,T,D) (B,H,T,T)") in got
    assert got[-7:] == [
        ("linear1", "linear", "(B,T,F)"),
        ("", "relu", "(B,T,F)"),
        ("dropout", "dropout", "(B,T,F)"),
        ("linear2", "linear", "(B,T,C)"),
        ("dropout3", "dropout", "(B,T,C)"),
        ("", "add", "(B,T,C)"),
        ("norm3", "layer_norm", "(B,T,C)"),
    ]


def test_our_own_model_attention_and_feed_forward():
    """The nano preset: its position table's rows (N = 128) have the model width's size,
    and merging the heads back still reads C."""
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset("nano")).eval()
    trace = tracing.trace(model, torch.randint(0, 256, (3, 11)), capture="shapes")
    qkv = [("view", "(B,T,H,D)"), ("transpose", "(B,H,T,D)")] * 3
    assert steps_of(trace, "blocks.0.self_attn") == [
        ("W_q", "linear", "(B,T,C)"),
        ("W_k", "linear", "(B,T,C)"),
        ("W_v", "linear", "(B,T,C)"),
        *(("", op, dims) for op, dims in qkv),
        ("attention", "transpose", "(B,H,D,T)"),
        ("attention", "matmul", "(B,H,T,T)"),
        ("attention", "div", "(B,H,T,T)"),
        ("attention", "getitem", "(1,1,T,T)"),  # the causal mask buffer, sliced to T
        ("attention", "invert", "(1,1,T,T)"),
        ("attention", "masked_fill", "(B,H,T,T)"),
        ("attention", "softmax", "(B,H,T,T)"),
        ("attention", "matmul", "(B,H,T,D)"),
        ("", "transpose", "(B,T,H,D)"),
        ("", "contiguous", "(B,T,H,D)"),
        ("", "view", "(B,T,C)"),
        ("W_o", "linear", "(B,T,C)"),
    ]
    assert steps_of(trace, "blocks.0.feed_forward") == [
        ("linear1", "linear", "(B,T,F)"),
        ("activation", "gelu", "(B,T,F)"),
        ("linear2", "linear", "(B,T,C)"),
    ]
