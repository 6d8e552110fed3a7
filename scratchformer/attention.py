"""Attention: the scaled dot-product core and the multi-head wrapper around it.

Both are ``nn.Module`` objects with their own ``forward`` so that a forward hook (or the
tracer) sees each one. The code follows the seed text step by step; the changes from it
are listed in ``ScaledDotProductAttention``'s docstring.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledDotProductAttention(nn.Module):
    """softmax(Q Kᵀ / sqrt(D) + causal mask) V, returning the output *and* the weights.

    Each step is an explicit tensor op (``matmul``, division by the scale, ``masked_fill``,
    ``softmax``, ``matmul``) so an op-level tracer records every one of them; no fused
    kernel hides the attention map.

    Changes from the seed's ``scaled_dot_product_attention`` function, and why:

    - The seed calls ``F.softmax`` but never imports ``torch.nn.functional as F``, so it
      fails with ``NameError`` on first use. The import is here.
    - The seed masks with ``-1e9`` ("equivalent to -infinity"). It is not: ``-1e9`` does
      not fit in float16 (max 65504), so ``masked_fill`` refuses it for half-precision
      scores; and it is only "small enough" relative to the scores, a magic number rather
      than the rule. ``float("-inf")`` is what the maths says (the prose even says so):
      ``exp(-inf)`` is exactly 0 in every dtype, so masked weights are exactly zero, as in
      ``torch.nn.functional.scaled_dot_product_attention``. The causal mask always leaves
      the diagonal visible, so no row is fully masked and the softmax never sees a row of
      only ``-inf`` (which would give NaN).
    - The causal mask lives here as a registered buffer (built once, moved with the
      module by ``.to(device)``, not saved in checkpoints) instead of being passed in by
      every caller. An optional extra ``mask`` (e.g. for padding) can still be given.
    """

    def __init__(self, block_size: int, causal: bool = True):
        super().__init__()
        self.block_size = block_size
        self.causal = causal
        # True where query position i may attend to key position j (j <= i): the lower
        # triangle. Shaped (1, 1, T, T) so it broadcasts over batch and heads.
        allowed = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("causal_mask", allowed.view(1, 1, block_size, block_size), False)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k, v: (B, H, T, D). ``mask``: bool, True = may attend, broadcastable to
        (B, H, T, T). Returns ``(output (B, H, T, D), weights (B, H, T, T))``."""
        d_k = q.size(-1)
        T_q, T_k = q.size(-2), k.size(-2)

        # --- similarity of every query with every key, scaled so the softmax stays soft
        # (B, H, T, D) @ (B, H, D, T) -> (B, H, T, T)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)

        # --- hide the future (and anything the caller masks) before the softmax
        if self.causal:
            if T_q > self.block_size or T_k > self.block_size:
                raise ValueError(
                    f"attention over {T_k} positions exceeds block_size={self.block_size}"
                )
            causal = self.causal_mask[:, :, :T_q, :T_k]  # (1, 1, T, T)
            mask = causal if mask is None else causal & mask
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))  # (B, H, T, T)

        # --- each row becomes a probability distribution over the keys
        attention_weights = F.softmax(scores, dim=-1)  # (B, H, T, T)

        # --- weighted sum of the values
        # (B, H, T, T) @ (B, H, T, D) -> (B, H, T, D)
        output = torch.matmul(attention_weights, v)
        return output, attention_weights

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}, causal={self.causal}"


# ---


class MultiHeadAttention(nn.Module):
    """Project to queries, keys and values, split into H heads, attend, merge, project.

    Each head sees its own D = C / H dimensional slice, so heads can specialise (one may
    track the previous token, another the matching bracket...). The projections are the
    seed's four ``nn.Linear`` layers ``W_q``, ``W_k``, ``W_v``, ``W_o``.
    """

    def __init__(self, d_model: int, n_heads: int, block_size: int, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads

        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)
        self.attention = ScaledDotProductAttention(block_size)

    def split_heads(self, x: torch.Tensor, batch_size: int) -> torch.Tensor:
        """(B, T, C) -> (B, T, H, D) -> (B, H, T, D): one attention problem per head."""
        x = x.view(batch_size, -1, self.n_heads, self.d_head)  # (B, T, H, D)
        return x.transpose(1, 2)  # (B, H, T, D)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q, k, v: (B, T, C) (the same normalised x for self-attention) -> (B, T, C)."""
        batch_size = q.size(0)

        # 1. Project Q, K, V
        q = self.W_q(q)  # (B, T, C)
        k = self.W_k(k)  # (B, T, C)
        v = self.W_v(v)  # (B, T, C)

        # 2. Split into heads
        q = self.split_heads(q, batch_size)  # (B, H, T, D)
        k = self.split_heads(k, batch_size)  # (B, H, T, D)
        v = self.split_heads(v, batch_size)  # (B, H, T, D)

        # 3. Scaled dot-product attention in every head at once
        attention_output, _ = self.attention(q, k, v, mask)  # (B, H, T, D)

        # 4. Concatenate heads and project
        attention_output = attention_output.transpose(1, 2)  # (B, T, H, D)
        attention_output = attention_output.contiguous().view(batch_size, -1, self.d_model)
        return self.W_o(attention_output)  # (B, T, C)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_head={self.d_head}"
