"""The position-wise feed-forward network: the same two-layer MLP applied at every position."""

from __future__ import annotations

import torch
import torch.nn as nn


class PositionWiseFeedForward(nn.Module):
    """linear2(activation(linear1(x))): widen C -> F, apply a non-linearity, narrow F -> C.

    Attention moves information *between* positions; this network transforms it *within*
    each position, independently. The seed uses ReLU; GPT-2 uses GELU (tanh approximation),
    chosen with ``activation``. The activation is its own module, so a hook sees it.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        if activation == "gelu":
            self.activation = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        elif activation == "relu":
            self.activation = nn.ReLU()
        else:
            raise ValueError(f"activation must be 'gelu' or 'relu', got {activation!r}")
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear1(x)  # (B, T, F)
        h = self.activation(h)  # (B, T, F)
        return self.linear2(h)  # (B, T, C)
