"""Dims read from the model itself (attributes, layer shapes, shape comments) and made to
follow the ops where two letters share a size: the tutorial's model, a nanoGPT-style model
and a Hugging Face GPT-2 built from a config."""

from __future__ import annotations

import pytest
import torch
from helpers.own_models import HF_GPT2, NANOGPT, TUTORIAL_FIXED, load
from torch import nn

import tracing
from tracing.dims.letters import house_sizes, letter_sizes
from tracing.dims.source import shape_comment

pytestmark = pytest.mark.usefixtures("one_thread")


def op_dims(trace, module_suffix: str) -> list[tuple[str, tuple]]:
    """(op, dims of its first output) for every op step of the first module ending so."""
    first = next(s for s in trace.steps if s.kind == "module" and s.module.endswith(module_suffix))
    return [
        (s.op, trace.tensor(s.outputs[0]).dims)
        for s in trace.steps[first.index : first.end + 1]
        if s.kind == "op" and s.module == first.module and s.outputs
    ]


def all_dims(trace) -> set[tuple]:
    return {r.dims for r in trace.tensors if r.dims is not None}


@pytest.mark.parametrize("seq_len", [10, 8])  # 8: T == D, the names must come from the ops
def test_tutorial_model_reads_every_axis(seq_len):
    loaded = load(TUTORIAL_FIXED, "TutorialLM", shape=(2, seq_len))
    trace = tracing.trace(loaded.model, *loaded.args)
    assert trace.meta["dims"] == {
        "B": 2,
        "T": seq_len,
        "C": 32,
        "H": 4,
        "D": 8,
        "F": 128,
        "V": 256,
        "N": 64,
    }
    attn = op_dims(trace, "0.self_attn")
    by_op = [(op, d) for op, d in attn if op in ("view", "transpose", "matmul", "softmax")]
    assert by_op == [
        ("view", ("B", "T", "H", "D")),
        ("transpose", ("B", "H", "T", "D")),  # q
        ("view", ("B", "T", "H", "D")),
        ("transpose", ("B", "H", "T", "D")),  # k
        ("view", ("B", "T", "H", "D")),
        ("transpose", ("B", "H", "T", "D")),  # v
        ("transpose", ("B", "H", "D", "T")),  # k.transpose(-2, -1)
        ("matmul", ("B", "H", "T", "T")),  # scores
        ("softmax", ("B", "H", "T", "T")),
        ("matmul", ("B", "H", "T", "D")),  # weights @ v
        ("transpose", ("B", "T", "H", "D")),
        ("view", ("B", "T", "C")),
    ]
    assert ("B", "T", "F") in all_dims(trace)
    assert trace.tensor(trace.steps[0].outputs[0]).dims == ("B", "T", "V")
    unnamed = [r for r in trace.tensors if r.dims is None or "?" in r.dims]
    assert unnamed == []
    positions = trace.meta["dim_letters"]["N"]  # the position table's rows
    assert positions["size"] == 64 and "position_embedding" in positions["origin"]


@pytest.mark.parametrize("seq_len", [10, 12])  # 12: T == D
def test_nanogpt_dims_from_n_head_and_n_embd(seq_len):
    loaded = load(NANOGPT, "gpt", shape=(2, seq_len))
    assert not hasattr(loaded.model, "config")
    trace = tracing.trace(loaded.model, *loaded.args)
    assert trace.meta["dims"] == {"B": 2, "T": seq_len, "C": 48, "H": 4, "D": 12, "F": 192, "V": 96}
    attn = op_dims(trace, "h.0.attn")
    c_attn = next(s for s in trace.steps if s.module.endswith("h.0.attn.c_attn"))
    assert trace.tensor(c_attn.outputs[0]).dims == ("B", "T", "3C")
    assert ("split", ("B", "T", "C")) in attn
    assert [d for op, d in attn if op == "transpose"][:3] == [("B", "H", "T", "D")] * 3
    fused = next(s for s in trace.steps if s.op == "scaled_dot_product_attention")
    assert [trace.tensor(i).dims for i in fused.outputs] == [
        ("B", "H", "T", "D"),
        ("B", "H", "T", "T"),
    ]
    assert ("B", "T", "F") in all_dims(trace) and ("B", "T", "V") in all_dims(trace)


def test_hf_gpt2_dims_from_its_config_and_ops():
    loaded = load(HF_GPT2, "tiny_gpt2", shape=(2, 8))  # T == D == 8
    trace = tracing.trace(loaded.model, *loaded.args)
    assert trace.meta["dims"] == {
        "B": 2,
        "T": 8,
        "C": 32,
        "H": 4,
        "D": 8,
        "F": 128,
        "V": 80,
        "N": 32,
    }
    attn = op_dims(trace, "h.0.attn")
    transposes = [d for op, d in attn if op == "transpose"]
    assert transposes[:4] == [("B", "H", "T", "D")] * 3 + [("B", "H", "D", "T")]
    assert ("matmul", ("B", "H", "T", "T")) in attn
    assert ("B", "T", "F") in all_dims(trace)
    assert trace.tensor(trace.steps[0].outputs[0]).dims == ("B", "T", "V")


def test_sizes_from_attribute_spellings_and_layers():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.nhead, self.embed_dim = 2, 12

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(50, 12)
            self.attn = Attn()
            self.mlp = nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 12))

    def sizes(model):
        house = house_sizes(None, model, None)
        return {k: v.size for k, v in letter_sizes(house, None, model, None).items()}

    # F: no module declares it and no layer is named for it (``mlp.0``): not guessed
    assert sizes(Net()) == {"H": 2, "C": 12, "V": 50, "D": 6}
    assert sizes(nn.Linear(3, 4)) == {}


def test_shape_comments_parse_house_tutorial_and_nanogpt_words():
    assert shape_comment("x = f(x)  # (batch_size, num_heads, seq_len, d_head)") == tuple("BHTD")
    assert shape_comment("k = k.view(B, T, nh, hs)  # (B, nh, T, hs)") == tuple("BHTD")
    assert shape_comment("s = a @ b  # (..., T, D) @ (..., D, T) -> (..., seq_len, seq_len)") == (
        "...",
        "T",
        "T",
    )
    assert shape_comment("y = f(y)  # re-assemble all head outputs (side by side)") is None
    assert shape_comment("y = f(y)") is None


def test_shape_comments_name_a_model_with_no_attributes():
    """Nothing on the modules says H or D: the comment on the line does."""

    class Bare(nn.Module):
        def forward(self, x):  # x: (2, 6, 12)
            q = x.view(2, 6, 3, 4).transpose(1, 2)  # (B, nh, T, hs)
            return q @ q.transpose(-2, -1)  # (B, nh, T, T)

    trace = tracing.trace(Bare(), torch.randn(2, 6, 12))
    assert trace.meta["dims"]["H"] == 3 and trace.meta["dims"]["D"] == 4
    last = trace.steps[-1]
    assert trace.tensor(last.outputs[0]).dims == ("B", "H", "T", "T")
