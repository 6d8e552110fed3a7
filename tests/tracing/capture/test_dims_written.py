"""Sizes the code writes as numbers (issue 22): an axis whose size a line writes, as
mRoPE's ``position_ids.expand(3, b, -1)`` (its three position streams) or a complex
rotation's ``x.reshape(*x.shape[:-1], -1, 2)``, is named by that number, and the rest of
a split by the arithmetic (``C/2``). Before, such an axis took any letter of its size
(the top-k ``K`` when it was 3 or 2) or read ``?``. ``x[..., None]`` keeps its axes and
adds a ``1``; ``view_as_complex``/``view_as_real`` drop and add the pair axis."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tracing

pytestmark = pytest.mark.usefixtures("one_thread")


class Written(nn.Module):
    """Each line writes a size; ``hidden_size`` proves C (12)."""

    def __init__(self, top_k: int = 3):
        super().__init__()
        self.hidden_size, self.top_k = 12, top_k
        self.proj = nn.Linear(12, 12)

    def forward(self, x):
        h = self.proj(x)
        pos = torch.arange(x.shape[1])[None, None, :].expand(3, x.shape[0], -1)
        pairs = h.float().reshape(*h.shape[:-1], -1, 2)
        z = torch.view_as_complex(pairs)
        back = torch.view_as_real(z)
        top = h.topk(2, dim=-1)
        grown = h[..., None]
        return h.sum() + pos.sum() + back.sum() + top.values.sum() + grown.sum()


def _dims(trace) -> dict[str, list]:
    out: dict[str, list] = {}
    for step in trace.steps:
        if step.kind == "op":
            for rid in step.outputs:
                out.setdefault(step.op, []).append(trace.tensors[rid].dims)
    return out


def test_numbers_the_lines_write_name_their_axes():
    dims = _dims(tracing.trace(Written(), torch.randn(5, 7, 12), capture="shapes"))
    assert dims["expand"] == [("3", "B", "T")]  # not K, which is 3 too
    assert dims["reshape"] == [("B", "T", "C/2", "2")]
    assert dims["view_as_complex"] == [("B", "T", "C/2")]
    assert dims["view_as_real"] == [("B", "T", "C/2", "2")]
    assert dims["topk"] == [("B", "T", "2"), ("B", "T", "2")]  # values and indices
    assert ("B", "T", "C", "1") in dims["getitem"]


def test_a_number_is_the_same_name_whatever_letter_shares_its_size():
    """B=3 (the streams' size) and B=2 (the pairs'), T=3: the names stay."""
    distinct = _dims(tracing.trace(Written(), torch.randn(5, 7, 12), capture="shapes"))
    for shape in [(3, 7, 12), (2, 3, 12)]:
        same = _dims(tracing.trace(Written(), torch.randn(*shape), capture="shapes"))
        assert same == distinct, shape


def test_a_number_the_line_does_not_write_is_not_guessed():
    """``reshape(b, t, 6, -1)``: the 6 is written, the 2 that follows is not."""

    class Six(nn.Module):
        def forward(self, x):
            b, t, _ = x.shape
            return x.reshape(b, t, 6, -1) * 2

    trace = tracing.trace(Six(), torch.randn(5, 7, 12), capture="shapes")
    (reshape,) = [s for s in trace.steps if s.op == "reshape"]
    assert trace.tensors[reshape.outputs[0]].dims == ("B", "T", "6", "?")
