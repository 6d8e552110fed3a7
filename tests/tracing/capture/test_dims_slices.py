"""Axes cut by a slice the source writes (issue 22): Kimi-Linear's delta attention solves
its chunk's triangular system row by row, ``for i in range(1, chunk_size)``, taking
``attn[..., i, :i]`` and ``attn[..., :i, :i]``: an axis of ``i`` positions of the chunk
``Q``, another size at every step. No letter has one size per step, so no letter may name
it (here ``i`` is 3 once, B's size); the line proves what it is, and it is named as
written: ``Q[:i]``, carried through what the loop does with it.

The function is transformers' own, unchanged, called at a chunk of 8 on random tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tracing import Tracer
from tracing.dim_legend import dims_hover, letter_legend

kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
pytestmark = pytest.mark.usefixtures("one_thread")

B, T, H, DK, DV, CHUNK = 3, 11, 9, 20, 26, 8


class KDA(nn.Module):
    """Kimi-Linear's chunked delta rule over inputs projected from ``x``."""

    def __init__(self):
        super().__init__()
        self.num_heads, self.head_k_dim, self.head_v_dim = H, DK, DV
        self.q = nn.Linear(16, H * DK)
        self.k = nn.Linear(16, H * DK)
        self.v = nn.Linear(16, H * DV)
        self.g = nn.Linear(16, H * DK)
        self.b = nn.Linear(16, H)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.num_heads, self.head_k_dim)
        k = self.k(x).view(b, t, self.num_heads, self.head_k_dim)
        v = self.v(x).view(b, t, self.num_heads, self.head_v_dim)
        g = -torch.nn.functional.softplus(self.g(x)).view(b, t, self.num_heads, self.head_k_dim)
        beta = self.b(x).sigmoid()
        out, _ = kimi.chunk_kimi_delta_attention(q, k, v, g, beta, chunk_size=CHUNK)
        return out


def _trace():
    torch.manual_seed(0)
    model = KDA().eval()
    x = torch.randn(B, T, 16)
    with torch.no_grad():
        plain = model(x)
    with torch.no_grad(), Tracer(model, capture="values") as tracer:
        traced = model(x)
    return traced, plain, tracer.trace


def _loop_steps(trace):
    return [
        s
        for s in trace.steps
        if s.kind == "op" and s.source is not None and ":i]" in s.source.text and s.outputs
    ]


def test_the_loop_rows_read_as_the_slice_their_line_writes():
    traced, plain, trace = _trace()
    assert torch.equal(traced, plain)  # traced bit for bit
    steps = _loop_steps(trace)
    sizes = sorted({trace.tensors[s.outputs[0]].shape[-1] for s in steps if s.op == "getitem"})
    assert sizes == list(range(1, CHUNK))  # every i of the loop, B's size 3 among them
    for step in steps:
        if step.op != "getitem":
            continue
        record = trace.tensors[step.outputs[0]]
        i = record.shape[-1]
        cut = "1" if i == 1 else "Q[:i]"  # a size-one cut is "1", as any size-one axis
        if "..., :i, :i]" in step.source.text:
            assert record.dims == ("B", "H", "?", cut, cut), (record.shape, record.dims)
        else:  # attn[..., i, :i]: the row i, its first i columns
            assert record.dims == ("B", "H", "?", cut), (record.shape, record.dims)
    # the chunk itself is the letter its source passes as a shape; the chunks (T padded to
    # whole chunks, over Q) no evidence names
    assert trace.meta["dim_letters"]["Q"]["size"] == CHUNK


def test_what_the_loop_computes_from_the_cut_keeps_its_name():
    _, _, trace = _trace()
    line = "attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)"
    seen = {}
    for step in trace.steps:
        if step.kind != "op" or step.source is None or step.source.text.strip() != line:
            continue
        record = trace.tensors[step.outputs[0]]
        if record.shape[3] > 1:
            seen.setdefault(step.op, record.dims)
    assert seen["unsqueeze"] == ("B", "H", "?", "Q[:i]", "1")
    assert seen["mul"] == ("B", "H", "?", "Q[:i]", "Q[:i]")
    assert seen["sum"] == ("B", "H", "?", "Q[:i]")
    assert seen["add"] == ("B", "H", "?", "Q[:i]")


def test_no_letter_names_a_cut_of_another_size():
    """Where i is B's size (3), the axis is still the slice, and no axis of the trace
    carries a letter of another size than the letter's."""
    _, _, trace = _trace()
    letters = {k: v["size"] for k, v in trace.meta["dim_letters"].items()}
    for record in trace.tensors:
        for name, size in zip(record.dims or (), record.shape):
            if name in letters:
                assert letters[name] == size, (record.shape, record.dims)
    rows = [trace.tensors[s.outputs[0]] for s in _loop_steps(trace) if s.op == "getitem"]
    at_b = [r for r in rows if r.shape[-1] == B]
    assert at_b and all(r.dims[-1] == "Q[:i]" and r.dims[0] == "B" for r in at_b)


def test_the_hover_says_what_a_slice_name_is():
    _, _, trace = _trace()
    legend = letter_legend(trace.meta)
    text = dims_hover((B, H, 2, 5), ("B", "H", "?", "Q[:i]"), legend)
    assert "Q[:i] = 5 · Q cut by the slice [:i] its source line writes" in text
    assert f"Q = {CHUNK}" in text
