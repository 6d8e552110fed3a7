"""Dims from evidence on the models people bring: each architecture's attention and MLP
steps named axis by axis (written out here), the same names when two sizes coincide,
and every letter's size and origin kept in the trace and its file."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tracing
from tests.dims_models import build
from tracing.dim_evidence import other_sizes
from tracing.dim_letters import size_of

pytestmark = pytest.mark.usefixtures("one_thread")


def ops(trace, suffix: str, wanted: set[str]) -> list[tuple[str, str]]:
    """``(op, "(B,T,C) ...")`` for the wanted ops of the first call of a module path ending so."""
    first = next(s for s in trace.steps if s.kind == "module" and s.module.endswith(suffix))
    out = []
    for s in trace.steps[first.index : first.end + 1]:
        if s.kind == "op" and s.op in wanted and s.outputs:  # its ops and its children's
            dims = " ".join("(" + ",".join(trace.tensor(i).dims or ()) + ")" for i in s.outputs)
            out.append((s.op, dims))
    return out


def named_share(trace) -> float:
    axes = [d for r in trace.tensors if len(r.shape) >= 2 for d in (r.dims or ("?",) * len(r.shape))]
    return sum(d != "?" for d in axes) / len(axes)


PROJ = {"linear", "view", "transpose", "reshape", "matmul", "softmax"}

EXPECTED = {
    "llama": {  # GQA: 6 query heads, 2 key/value heads
        "self_attn": [
            ("linear", "(B,T,C)"), ("view", "(B,T,H,D)"), ("transpose", "(B,H,T,D)"),
            ("linear", "(B,T,KV·D)"), ("view", "(B,T,KV,D)"), ("transpose", "(B,KV,T,D)"),
            ("linear", "(B,T,KV·D)"), ("view", "(B,T,KV,D)"), ("transpose", "(B,KV,T,D)"),
            ("reshape", "(B,H,T,D)"), ("reshape", "(B,H,T,D)"), ("transpose", "(B,H,D,T)"),
            ("matmul", "(B,H,T,T)"), ("softmax", "(B,H,T,T)"), ("matmul", "(B,H,T,D)"),
            ("transpose", "(B,T,H,D)"), ("reshape", "(B,T,C)"), ("linear", "(B,T,C)"),
        ],
        "mlp": [("linear", "(B,T,F)"), ("linear", "(B,T,F)"), ("linear", "(B,T,C)")],
    },
    "gpt_neox": {  # rotary_pct=0.25: a rotary width R = D/4 of each head
        "attention": [
            ("linear", "(B,T,3C)"), ("view", "(B,T,H,3D)"), ("transpose", "(B,H,T,3D)"),
            ("chunk", "(B,H,T,D) (B,H,T,D) (B,H,T,D)"), ("getitem", "(B,H,T,R)"),
            ("getitem", "(B,H,T,D-R)"), ("cat", "(B,H,T,D)"),
        ],
        "mlp": [("linear", "(B,T,F)"), ("linear", "(B,T,C)")],
    },
    "mixtral": {  # 5 experts, top-2
        "mlp": [("view", "(B·T,C)"), ("reshape", "(B,T,C)")],
        "mlp.gate": [("linear", "(B·T,E)"), ("softmax", "(B·T,E)"), ("topk", "(B·T,K) (B·T,K)")],
        "mlp.experts": [("chunk", "(B·T·K,F) (B·T·K,F)"), ("view", "(B·T,K,C)")],
    },
    "gpt2": {
        "attn": [
            ("split", "(B,T,C) (B,T,C) (B,T,C)"), ("view", "(B,T,H,D)"), ("transpose", "(B,H,T,D)"),
            ("matmul", "(B,H,T,T)"), ("softmax", "(B,H,T,T)"), ("matmul", "(B,H,T,D)"),
        ],
    },
    "falcon": {  # new decoder architecture: one fused (H+2KV)·D projection
        "self_attention": [
            ("matmul", "(B,T,(H+2KV)·D)"), ("view", "(B,T,KV,H/KV+2,D)"),
            ("getitem", "(B,T,KV,H/KV,D)"), ("getitem", "(B,T,KV,1,D)"),
        ],
        "mlp": [("matmul", "(B,T,F)"), ("matmul", "(B,T,C)")],
    },
    "phi3": {
        "self_attn": [("linear", "(B,T,(H+2KV)·D)"), ("view", "(B,T,H,D)")],
        "mlp": [("linear", "(B,T,2F)"), ("chunk", "(B,T,F) (B,T,F)"), ("linear", "(B,T,C)")],
    },
    "gemma2": {
        "self_attn": [("linear", "(B,T,C)"), ("linear", "(B,T,KV·D)"), ("softmax", "(B,H,T,T)")],
        "mlp": [("linear", "(B,T,F)"), ("linear", "(B,T,C)")],
    },
    "deepseek_v3": {  # multi-head latent attention (its rotary width is its D), routed experts
        "self_attn.q_a_proj": [("linear", "(B,T,Lq)")],
        "self_attn.q_b_proj": [("linear", "(B,T,H·(Dn+D))")],
        "self_attn.kv_a_proj_with_mqa": [("linear", "(B,T,Lkv+D)")],
        "self_attn": [
            ("view", "(B,T,H,Dn+D)"), ("split", "(B,H,T,Dn) (B,H,T,D)"),
            ("split", "(B,T,Lkv) (B,T,D)"), ("view", "(B,T,H,Dn+Dv)"),
            ("split", "(B,H,T,Dn) (B,H,T,Dv)"), ("matmul", "(B,H,T,T)"),
        ],
        "mlp.gate": [("linear", "(B·T,E)")],
    },
}
_WANT = PROJ | {"chunk", "getitem", "cat", "split", "topk"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_attention_and_mlp_steps_read_in_full(kind):
    model, ids = build(kind)
    trace = tracing.trace(model, ids, capture="shapes")
    for suffix, expected in EXPECTED[kind].items():
        layer = "h.0." if kind in ("gpt2", "falcon") else "layers.0."
        got = ops(trace, layer + suffix, _WANT)
        for step in expected:
            assert step in got, (suffix, step, got)
    assert named_share(trace) >= 0.98
