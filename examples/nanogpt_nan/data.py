"""Batches for ``examples/nanogpt_nan/model.py``: byte windows of a short text.

``get_batch(step)`` returns ``(inputs, targets)``, both ``(B, T)`` token ids, the targets
shifted by one: what ``scratchformer train --data data.py:get_batch`` calls each step.
"""

from __future__ import annotations

import torch

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak. "
    "All: Speak, speak. First Citizen: You are all resolved rather to die than to famish? "
    "All: Resolved. resolved. First Citizen: First, you know Caius Marcius is chief enemy "
    "to the people. All: We know't, we know't. "
) * 4
DATA = torch.tensor(list(TEXT.encode("utf-8")), dtype=torch.long)
BATCH, BLOCK = 4, 32


def get_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)  # the same batch for the same step
    starts = torch.randint(len(DATA) - BLOCK - 1, (BATCH,), generator=gen).tolist()
    x = torch.stack([DATA[s : s + BLOCK] for s in starts])  # (B, T)
    y = torch.stack([DATA[s + 1 : s + 1 + BLOCK] for s in starts])  # (B, T)
    return x, y
