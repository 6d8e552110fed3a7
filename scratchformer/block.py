"""``DecoderBlock``: attention and feed-forward, each inside a residual connection."""

from __future__ import annotations

import torch
import torch.nn as nn

from scratchformer.attention import MultiHeadAttention
from scratchformer.config import ModelConfig
from scratchformer.feed_forward import PositionWiseFeedForward


class DecoderBlock(nn.Module):
    """One layer of the decoder: self-attention, then the feed-forward network.

    Each sub-layer is wrapped in a residual connection (``x + sublayer(...)``) so gradients
    have a straight path through deep stacks. Where the LayerNorm goes is a switch:

    - ``"pre"`` (the seed, GPT-2): ``x = x + dropout(sublayer(norm(x)))``. The residual
      stream itself is never normalised; stable for deep models without warm-up tricks.
    - ``"post"`` (the original 2017 Transformer): ``x = norm(x + dropout(sublayer(x)))``.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        C = config.d_model
        self.norm_position = config.norm_position
        self.norm1 = nn.LayerNorm(C, eps=config.layer_norm_eps, bias=config.bias)
        self.self_attn = MultiHeadAttention(C, config.n_heads, config.block_size, config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.norm2 = nn.LayerNorm(C, eps=config.layer_norm_eps, bias=config.bias)
        self.feed_forward = PositionWiseFeedForward(C, config.d_ff, config.activation, config.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C). ``mask`` is an optional extra attention mask."""
        if self.norm_position == "pre":
            # --- self-attention sub-layer
            norm_x = self.norm1(x)  # (B, T, C)
            attn_output = self.self_attn(norm_x, norm_x, norm_x, mask)  # (B, T, C)
            x = x + self.dropout(attn_output)  # residual connection
            # --- feed-forward sub-layer
            norm_x = self.norm2(x)  # (B, T, C)
            ff_output = self.feed_forward(norm_x)  # (B, T, C)
            x = x + self.dropout(ff_output)  # residual connection
        else:
            # --- Post-LN: normalise after adding the residual
            attn_output = self.self_attn(x, x, x, mask)  # (B, T, C)
            x = self.norm1(x + self.dropout(attn_output))
            ff_output = self.feed_forward(x)  # (B, T, C)
            x = self.norm2(x + self.dropout(ff_output))
        return x

    def extra_repr(self) -> str:
        return f"norm_position={self.norm_position!r}"
