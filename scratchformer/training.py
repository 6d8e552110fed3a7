"""A small, plain training loop: AdamW, warm-up then cosine decay, gradient clipping.

The loop knows nothing about terminals: it reports through callbacks (``on_step``,
``on_eval``), and the command line draws the progress bar. Checkpoints are written every
``checkpoint_interval`` steps and at the end, to the same file (atomically replaced).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scratchformer.checkpoint import save_checkpoint
from scratchformer.model import DecoderOnlyTransformer

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class TrainConfig:
    """Optimisation settings (the model's own settings live in ``ModelConfig``)."""

    steps: int = 3000
    batch_size: int = 64
    lr: float = 3e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_batches: int = 8
    checkpoint_interval: int = 1000

    def lr_at(self, step: int) -> float:
        """Linear warm-up for ``warmup_steps``, then cosine decay to the floor."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    tokens: int = 0


@torch.no_grad()
def evaluate(model: DecoderOnlyTransformer, batches: list[Batch]) -> float:
    """Mean loss over fixed batches, with dropout off (restores the training mode)."""
    was_training = model.training
    model.eval()
    losses = [model(x, y)[1].item() for x, y in batches]
    model.train(was_training)
    return sum(losses) / len(losses)


def train(
    model: DecoderOnlyTransformer,
    next_batch: Callable[[], Batch],
    eval_set: list[Batch],
    config: TrainConfig,
    *,
    checkpoint_path: str | Path | None = None,
    checkpoint_meta: dict[str, Any] | None = None,
    on_step: Callable[[int, float, float, float], None] | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    on_start: Callable[[torch.optim.Optimizer], None] | None = None,
) -> TrainResult:
    """Train ``model`` for ``config.steps`` steps on ``next_batch()`` batches.

    ``on_step(step, loss, tokens_per_second, lr)`` runs after every step;
    ``on_eval(step, eval_loss)`` after every evaluation on ``eval_set``;
    ``on_start(optimizer)`` once before the first step (to attach ``tracing.watch``).
    """
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.99),
    )

    def checkpoint(step: int, eval_loss: float | None) -> None:
        if checkpoint_path is not None:
            meta = {**(checkpoint_meta or {}), "step": step, "eval_loss": eval_loss}
            save_checkpoint(model, checkpoint_path, extra_meta=meta)

    if on_start is not None:
        on_start(optimizer)
    result = TrainResult(steps=config.steps, final_loss=float("nan"))
    model.train()
    start = time.perf_counter()
    eval_loss = None
    for step in range(config.steps):
        # --- one optimisation step
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        x, y = next_batch()
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()

        result.tokens += x.numel()
        result.final_loss = loss.item()
        elapsed = time.perf_counter() - start
        if on_step is not None:
            on_step(
                step + 1, result.final_loss, result.tokens / max(elapsed, 1e-9), config.lr_at(step)
            )

        # --- periodic evaluation and checkpoint
        last = step + 1 == config.steps
        if (step + 1) % config.eval_interval == 0 or last:
            eval_loss = evaluate(model, eval_set)
            result.eval_losses.append((step + 1, eval_loss))
            if on_eval is not None:
                on_eval(step + 1, eval_loss)
        if (step + 1) % config.checkpoint_interval == 0 or last:
            checkpoint(step + 1, eval_loss)

    result.seconds = time.perf_counter() - start
    model.eval()
    return result
