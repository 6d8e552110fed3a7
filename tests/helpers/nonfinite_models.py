"""Small models whose numbers go non-finite on purpose: the cases the NaN hunt must end on."""

from __future__ import annotations

from torch import nn


class SqrtAtZero(nn.Module):
    """A forward that is finite everywhere whose backward is not: d sqrt(x)/dx at 0."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.scale = nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x).relu()  # zeros where the projection is negative
        r = h.sqrt()  # the culprit: infinite slope at 0
        return self.scale(r)


class NaiveLogSoftmax(nn.Module):
    """``log(softmax(x))`` in two steps: the softmax underflows to 0 for a large input,
    the log makes -inf, and the loss and every gradient go NaN."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        p = self.proj(x).softmax(-1)
        return p.log()  # the culprit: log(0)
