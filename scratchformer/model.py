"""``DecoderOnlyTransformer``: the seed's blocks, completed into a GPT-style language model.

Data flow (shapes in the house letters)::

    idx (B, T) token ids
      -> token_embedding            (B, T, C)
      -> position_encoding          (B, T, C)   adds where each token is
      -> dropout
      -> blocks.0 ... blocks.{L-1}  (B, T, C)   DecoderBlock: attention + feed-forward
      -> final_norm                 (B, T, C)   LayerNorm (Pre-LN leaves the stream raw)
      -> lm_head                    (B, T, V)   a score per vocabulary entry: the logits

The seed stops after the decoder block; embeddings, stacking, the final LayerNorm and the
LM head follow GPT-2, so Hugging Face GPT-2 weights load into this model unchanged
(``scratchformer.convert.from_hf_gpt2``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from scratchformer.block import DecoderBlock
from scratchformer.config import ModelConfig
from scratchformer.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding


class DecoderOnlyTransformer(nn.Module):
    """A decoder-only (causal) Transformer language model."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        C = config.d_model

        self.token_embedding = nn.Embedding(config.vocab_size, C)
        if config.positional == "learned":
            self.position_encoding = LearnedPositionalEncoding(config.block_size, C)
        else:
            self.position_encoding = SinusoidalPositionalEncoding(config.block_size, C)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(C, eps=config.layer_norm_eps, bias=config.bias)
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.token_embedding.weight  # weight tying: one V x C matrix

        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2L),
        # so the stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith(("self_attn.W_o.weight", "feed_forward.linear2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """GPT-2 initialisation: N(0, 0.02) weights, zero biases, LayerNorm at identity."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ---

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Unique parameters (a tied matrix counts once)."""
        n = sum(p.numel() for p in self.parameters())
        if not include_embeddings:
            n -= self.token_embedding.weight.numel()
            if isinstance(self.position_encoding, LearnedPositionalEncoding):
                n -= self.position_encoding.embedding.weight.numel()
        return n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """idx: (B, T) int64 token ids -> logits (B, T, V).

        With ``targets`` (B, T) (the next token at each position; -100 = ignore), returns
        ``(logits, loss)`` with the mean cross-entropy.
        """
        if idx.dim() != 2:
            raise ValueError(f"expected token ids shaped (B, T), got shape {tuple(idx.shape)}")
        if idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"token ids must be integers (int64), got {idx.dtype}")
        seq_len = idx.size(1)  # T
        if seq_len > self.config.block_size:
            raise ValueError(
                f"sequence of {seq_len} tokens is longer than the model's block_size "
                f"{self.config.block_size}; crop the prompt to the last "
                f"{self.config.block_size} tokens"
            )

        # --- embeddings
        x = self.token_embedding(idx)  # (B, T, C)
        x = self.position_encoding(x)  # (B, T, C)
        x = self.dropout(x)

        # --- the decoder stack
        for block in self.blocks:
            x = block(x)  # (B, T, C)

        # --- read out
        x = self.final_norm(x)  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, V)

        if targets is None:
            return logits
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100
        )
        return logits, loss

    # ---

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        stop_token: int | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` (B, T) by up to ``max_new_tokens`` tokens, one at a time.

        ``temperature`` 0 takes the most likely token (greedy, deterministic); otherwise the
        logits are divided by it and a token is sampled (``generator`` makes it
        reproducible), among the ``top_k`` most likely when given. The context is cropped
        to the last ``block_size`` tokens. Stops early once every row has produced
        ``stop_token``. Call ``model.eval()`` first to switch dropout off.
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        finished = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]  # (B, T') with T' <= block_size
            logits = self(context)[:, -1, :]  # (B, V): scores for the next token
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)  # (B, V)
                next_token = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, next_token], dim=1)  # (B, T + 1)
            if stop_token is not None:
                finished |= next_token.squeeze(1) == stop_token
                if bool(finished.all()):
                    break
        return idx
