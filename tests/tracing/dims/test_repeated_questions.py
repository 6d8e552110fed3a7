"""A step asked again is answered as it was the first time (issue 31, cost).

The walk names a step that no rule names — it broadcasts (``h * 0.5 + 1.0``, ``gelu``) —
once per question: its op, module and line, each input's names, sizes and role, and its
output's sizes; a loop of 25,000 such steps asks a handful of questions. The reference is
the walk that asks every step afresh (``_question`` answering ``None``): every tensor's
names and proofs must be the same.
"""

from __future__ import annotations

import pytest
import torch
from helpers.models.nanogpt import GPT
from test_outside_models import EinsumLM
from torch import nn

import tracing
import tracing.dims.naming as naming
import tracing.dims.passes as passes
import tracing.dims.prove as prove


class Loop(nn.Module):
    """The same two steps again and again, then a step of another line."""

    def __init__(self, n: int = 200):
        super().__init__()
        self.n, self.lin = n, nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        for _ in range(self.n):
            h = h * 0.5 + 1.0
        return torch.tanh(h) + x


class TwoWidths(nn.Module):
    """Two ``relu`` of ``(B, T, 8)``: the token table's width, declared ``C``, and a second
    input's, which nothing names. Same op, same sizes in every pass: two questions."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)

    def forward(self, ids, x):
        return torch.relu(self.emb(ids)), torch.relu(x)


def _traced(model, args, asked_afresh: bool, monkeypatch):
    passes._CACHE.clear()
    prove._MEMO.clear()
    with monkeypatch.context() as m:
        if asked_afresh:
            m.setattr(naming._Namer, "_question", lambda self, *a: None)
        torch.manual_seed(0)
        return tracing.trace(model, *args, capture="shapes")


@pytest.mark.parametrize("name", ["loop", "nanogpt", "einsum", "two widths"])
def test_names_and_proofs_are_those_of_a_walk_that_asks_every_step(name, monkeypatch):
    model, args = {
        "loop": lambda: (Loop().eval(), (torch.randn(2, 5, 8),)),
        "nanogpt": lambda: (GPT(vocab_size=96).eval(), (torch.randint(0, 96, (2, 9)),)),
        "einsum": lambda: (EinsumLM().eval(), (torch.randint(0, 101, (3, 11)),)),
        "two widths": lambda: (TwoWidths(), (torch.randint(0, 50, (2, 5)), torch.randn(2, 5, 8))),
    }[name]()
    once = _traced(model, args, asked_afresh=False, monkeypatch=monkeypatch)
    afresh = _traced(model, args, asked_afresh=True, monkeypatch=monkeypatch)
    assert [(r.dims, r.why) for r in once.tensors] == [(r.dims, r.why) for r in afresh.tensors]
    assert any(r.dims for r in once.tensors if r.producer is not None)  # something named
