"""Models too big for the machine, built on the meta device, trace at ``shapes``.

A Llama-3-70B-sized config (8,192 wide, 64 query heads, 8 key/value heads) and a
Mixtral-8x7B-sized one (8 experts, 2 per token) need no memory for weights on ``meta``, and
seeing their shapes is what a shapes trace is for. The suite runs a few layers of the real
width; ``SCRATCHFORMER_FRONTIER=1`` runs the full depths and prints the timings.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

import tracing
from tracing.capture.tracer import META_NOTE

transformers = pytest.importorskip("transformers")

FULL = os.environ.get("SCRATCHFORMER_FRONTIER") == "1"
T = 2048 if FULL else 256


def llama_70b(layers: int):
    return transformers.LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    )


def mixtral_8x7b(layers: int):
    return transformers.MixtralConfig(
        num_hidden_layers=layers,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
    )


def _trace_on_meta(config, tmp_path, name, dtype=torch.float32):
    started = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    trace = tracing.trace(model, ids, capture="shapes")
    traced = time.perf_counter()
    path = tmp_path / f"{name}.sft"
    trace.save(path)
    if FULL:
        print(
            f"\n{name}: {config.num_hidden_layers} layers, {T} tokens: "
            f"trace {traced - started:.2f} s, file {path.stat().st_size / 1e6:.1f} MB"
        )
    return trace, path


@pytest.mark.slow
def test_llama_70b_sized_traces_at_shapes_on_meta(tmp_path):
    layers = 80 if FULL else 2
    trace, path = _trace_on_meta(llama_70b(layers), tmp_path, "llama-70b")
    assert trace.error is None
    assert META_NOTE in trace.meta.get("notes", [])
    maps = [r for r in trace.tensors if r.role == "attention"]
    assert len(maps) == layers
    assert all(tuple(r.shape) == (1, 64, T, T) and r.device == "meta" for r in maps)
    assert any(tuple(r.shape) == (1, T, 128256) for r in trace.tensors)  # the logits
    k_proj = [r for r in trace.tensors if r.role == "param" and tuple(r.shape) == (1024, 8192)]
    assert k_proj  # 8 KV heads of 128: the k/v projections are 1,024 wide
    assert not trace.values  # nothing was computed, nothing kept
    assert path.stat().st_size < 5e6 * max(1, layers / 80)


@pytest.mark.slow
def test_mixtral_sized_traces_at_shapes_on_meta(tmp_path):
    layers = 32 if FULL else 2
    trace, _ = _trace_on_meta(
        mixtral_8x7b(layers), tmp_path, "mixtral-8x7b", dtype=torch.bfloat16
    )  # bf16 as released: its grouped matmul wants bf16 on meta, traced or not
    assert trace.error is None
    maps = [r for r in trace.tensors if r.role == "attention"]
    assert len(maps) == layers and all(tuple(r.shape) == (1, 32, T, T) for r in maps)
