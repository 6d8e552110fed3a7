"""A loss that turns NaN mid-training, caught by ``tracing.watch`` at the step it happens.

    python examples/nan_loss.py            # trains until the loss is NaN, saves that step
    scratchformer app nan_step.trace       # then press N: the op that made the first Inf

The model takes ``log`` of a ``softmax`` in two steps. Once one logit leads the others
by more than ~104, a probability underflows to exactly 0 in float32, its ``log`` is
``-inf``, the loss is Inf and every gradient NaN. ``F.log_softmax`` would not do this.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

import tracing


class NaiveClassifier(nn.Module):
    def __init__(self, n_in: int = 16, hidden: int = 32, n_classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x):
        probs = self.fc2(self.fc1(x).relu()).softmax(-1)
        return probs.log()  # the bug: log(0) = -inf once a probability underflows


def main(path: str = "nan_step.trace", steps: int = 200) -> tracing.Trace | None:
    torch.manual_seed(0)
    model = NaiveClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    x, y = torch.randn(64, 16) * 10, torch.randint(0, 4, (64,))
    loss_fn = lambda out: F.nll_loss(out, y)  # noqa: E731 - reads the loop's current y
    with tracing.watch(model, optimizer, "nonfinite", path, loss_fn=loss_fn, capture="values") as w:
        for step in range(1, steps + 1):
            optimizer.zero_grad()
            loss = loss_fn(model(x))
            loss.backward()
            optimizer.step()
            if w.traces:
                print(f"step {step}: loss {loss.item()} - saved {path} ({w.reasons[0]})")
                return tracing.load(path)
    print(f"the loss stayed finite for {steps} steps")
    return None


if __name__ == "__main__":
    main(*sys.argv[1:2])
