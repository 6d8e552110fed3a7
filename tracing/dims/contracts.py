"""What torch's own layers document about their parameters' shapes: which attribute sizes
which axis.

``nn.Linear.weight`` is ``(out_features, in_features)``; an ``nn.LSTM``'s ``weight_hh_l0`` is
``(4·hidden_size, hidden_size)`` and its ``weight_ih_l0`` ``(4·hidden_size, input_size)``. The
layer's own attributes give the sizes, and the contract says which axis each one is, at any
sizes: where ``input_size == hidden_size`` the declared 40s are still two different things,
and the input weight's columns are the input's width, not the model width ``C`` that
``hidden_size`` spells. (Linear and Embedding are read as layer shapes by
:mod:`tracing.dims.letters`; this covers the layers that own several parameters.)

Gathered from the model as plain data (:class:`Contract` per parameter path); naming
(:mod:`tracing.dims.naming`) reads it without the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch.nn as nn


@dataclass(frozen=True)
class Contract:
    """One axis of a parameter: ``times`` × the layer's attribute ``attr`` (of ``size``)."""

    attr: str
    size: int
    times: int = 1


_RECURRENT = re.compile(r"(weight|bias)_(ih|hh|hr)_l(\d+)(_reverse)?$")
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _recurrent(module: nn.RNNBase, name: str) -> tuple[Contract | None, ...] | None:
    """``nn.LSTM``/``GRU``/``RNN``: each gate stacked on the rows, the columns the input's
    width (layer 0), the layer below's output (later layers) or the hidden state."""
    found = _RECURRENT.match(name)
    gates = _GATES.get(module.mode.split("_")[0]) if isinstance(module.mode, str) else None
    if found is None or gates is None:
        return None
    kind, which, layer = found.group(1), found.group(2), int(found.group(3))
    hidden = Contract("hidden_size", module.hidden_size)
    proj = module.proj_size
    out = Contract("proj_size", proj) if proj else hidden
    if which == "hr":  # the projection: (proj_size, hidden_size)
        return (out, hidden) if kind == "weight" else (out,)
    rows = Contract("hidden_size", module.hidden_size, gates)
    if kind == "bias":
        return (rows,)
    if which == "hh":
        return (rows, out)
    if layer == 0:
        return (rows, Contract("input_size", module.input_size))
    directions = 2 if module.bidirectional else 1
    return (rows, Contract(out.attr, out.size, directions))


def _attention(module: nn.MultiheadAttention, name: str) -> tuple[Contract | None, ...] | None:
    """``nn.MultiheadAttention``: q/k/v stacked on the rows of ``in_proj_weight``; separate
    key and value projections read ``kdim`` and ``vdim`` wide inputs."""
    embed = Contract("embed_dim", module.embed_dim)
    return {
        "in_proj_weight": (Contract("embed_dim", module.embed_dim, 3), embed),
        "in_proj_bias": (Contract("embed_dim", module.embed_dim, 3),),
        "q_proj_weight": (embed, embed),
        "k_proj_weight": (embed, Contract("kdim", module.kdim)),
        "v_proj_weight": (embed, Contract("vdim", module.vdim)),
        "bias_k": (None, None, embed),
        "bias_v": (None, None, embed),
    }.get(name)


_LAYERS = ((nn.RNNBase, _recurrent), (nn.MultiheadAttention, _attention))


def layer_contracts(model: Any) -> dict[str, tuple[Contract | None, ...]]:
    """Per parameter path (``rnn.weight_ih_l0``), what sizes each of its axes, for the
    parameters of torch's own multi-parameter layers; ``None`` for an axis none does."""
    out: dict[str, tuple[Contract | None, ...]] = {}
    modules = getattr(model, "named_modules", None)
    if modules is None:
        return out
    for path, module in modules():
        read = next((read for kind, read in _LAYERS if isinstance(module, kind)), None)
        if read is None:
            continue
        for name, param in module.named_parameters(recurse=False):
            try:
                axes = read(module, name)
            except (AttributeError, TypeError):  # a subclass that renamed what we read
                axes = None
            if axes is not None and _agrees(axes, tuple(param.shape)):
                out[f"{path}.{name}" if path else name] = axes
    return out


def _agrees(axes: tuple[Contract | None, ...], shape: tuple[int, ...]) -> bool:
    """The contract read against the parameter itself: every axis it sizes is that size."""
    return len(axes) == len(shape) and all(
        c is None or c.times * c.size == n for c, n in zip(axes, shape)
    )
