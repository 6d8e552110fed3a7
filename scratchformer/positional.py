"""Positional information: self-attention alone cannot tell positions apart.

Attention compares every query with every key as a set; shuffling the input positions
would shuffle the output the same way. Adding a position-dependent vector to each token
embedding breaks that symmetry. Two classic choices, picked by ``ModelConfig.positional``:

- ``LearnedPositionalEncoding`` (GPT-2): a trainable table, one C-vector per position.
- ``SinusoidalPositionalEncoding`` (Vaswani et al. 2017): fixed sines and cosines of
  geometrically spaced frequencies; nothing to learn.

Both take the token embeddings (B, T, C) and return them with positions added.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


class LearnedPositionalEncoding(nn.Module):
    """x + table[0:T]: a trainable embedding per position (``embedding``: (block_size, C))."""

    def __init__(self, block_size: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(block_size, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)
        positions = torch.arange(T, device=x.device)  # (T,)
        return x + self.embedding(positions)  # (B, T, C) + (T, C)


class SinusoidalPositionalEncoding(nn.Module):
    """x + pe[0:T] with pe[t, 2i] = sin(t / 10000^(2i/C)), pe[t, 2i+1] = cos(same).

    The table is a buffer (moves with ``.to(device)``, not trained, not saved).
    """

    def __init__(self, block_size: int, d_model: int):
        super().__init__()
        position = torch.arange(block_size, dtype=torch.float32).unsqueeze(1)  # (T, 1)
        frequency = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
        )  # (C/2,)
        pe = torch.zeros(block_size, d_model)
        pe[:, 0::2] = torch.sin(position * frequency)
        pe[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
        self.register_buffer("pe", pe, persistent=False)  # (block_size, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)
        return x + self.pe[:T]  # (B, T, C) + (T, C)
