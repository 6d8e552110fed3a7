"""Gradient norms read from a training-step trace, for views that show where gradients
explode or vanish (no Qt here: the app colours what these functions compute).

Norms come from a gradient record's statistics (``sqrt(n (std² + mean²))`` over its
finite elements), or from its kept value when there are no statistics; a ``shapes``
trace has neither, and every function here then returns nothing for it.
"""

from __future__ import annotations

import math

from tracing.breakpoints import Output, grad_norm
from tracing.record import Trace


def tensor_grad_norm(trace: Trace, tensor_id: int) -> float | None:
    """L2 norm of the gradient of forward tensor ``tensor_id``, or None."""
    rec = trace.grad(tensor_id)
    if rec is None:
        return None
    return grad_norm(Output(rec, loader=lambda: trace.value(rec.id)))


def step_grad_norm(trace: Trace, index: int) -> float | None:
    """The gradient norm of what step ``index`` produced: a forward step's first output,
    or the gradient a backward step holds."""
    step = trace.steps[index]
    if not step.outputs:
        return None
    if step.kind == "backward":
        rec = trace.tensors[step.outputs[0]]
        return grad_norm(Output(rec, loader=lambda: trace.value(rec.id)))
    return tensor_grad_norm(trace, step.outputs[0])


def layer_of(name: str, depth: int = 2) -> str:
    """The layer a parameter belongs to: a repeated layer up to its number
    (``blocks.3`` for ``blocks.3.attn.W_q.weight``, ``model.layers.3`` for a Hugging Face
    Llama's, ``transformer.h.1`` for nanoGPT's), else its module's first path part
    (``lm_head`` for ``lm_head.weight``); the parameter's own
    name is excluded. ``depth`` is kept for callers; the number decides."""
    parts = name.split(".")[:-1]
    for i, part in enumerate(parts):
        if part.isdigit() and i > 0:
            return ".".join(parts[: i + 1])  # a numbered layer: "model.layers.3"
    return ".".join(parts[:1])


def layer_grad_norms(trace: Trace, depth: int = 2) -> dict[str, float]:
    """L2 norm of the parameters' gradients per layer (``blocks.0``, ``lm_head``...), in
    model order: a vanishing or exploding stack shows as a slope across them. A layer
    with a NaN (or an Inf) gradient has a NaN (an Inf) norm."""
    squares: dict[str, float] = {}
    order = {path: i for i, path in enumerate(trace.modules)}
    for name in trace.meta.get("param_grads", {}):
        rec = trace.param_grad(name)
        if rec is None:
            continue
        n = grad_norm(Output(rec, loader=lambda rec=rec: trace.value(rec.id)))
        if n is None:
            continue
        layer = layer_of(name, depth)
        squares[layer] = squares.get(layer, 0.0) + n * n
    ranked = sorted(squares, key=lambda layer: order.get(layer, len(order)))
    return {layer: math.sqrt(squares[layer]) for layer in ranked}


def log_scale(norms: dict, floor: float = 1e-12) -> dict:
    """Each norm's position from 0 to 1 on a log10 scale between the smallest and the
    largest finite norm; a non-finite norm is 1 (the colour of trouble)."""
    logs = {k: math.log10(max(v, floor)) for k, v in norms.items() if math.isfinite(v)}
    if not logs:
        return {k: 1.0 for k in norms}
    lo, hi = min(logs.values()), max(logs.values())
    span = hi - lo or 1.0
    return {k: (logs[k] - lo) / span if k in logs else 1.0 for k in norms}


__all__ = ["layer_grad_norms", "layer_of", "log_scale", "step_grad_norm", "tensor_grad_norm"]
