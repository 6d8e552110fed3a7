"""Per-head outputs: where an attention layer's heads can be edited, and torch's own attention.

A head edit changes one head's output, the ``(B, H, T, D)`` tensor the attention weights
make from the values before the heads are merged and projected. Most attention code has that
tensor as a step of its own (a ``matmul`` of the map with the values, a fused
``scaled_dot_product_attention``); :func:`head_site_of_map` finds it from the map.

``nn.MultiheadAttention`` (so ``nn.TransformerEncoder`` and ``nn.TransformerDecoder``) does
all of it in one call, ``F.multi_head_attention_forward``, and applies ``out_proj``
functionally inside it, so no step holds the per-head output. An edit of such a module with
``head=`` (``Edit("dec.layers.0.self_attn", Zero(), head=1)``) replaces that call by
:func:`edited_mha_call`: the same call with an identity output projection, which returns the
merged heads exactly (the out-projection's input, ``(T·B, H·D)``, head ``h`` in columns
``h·D:(h+1)·D``); the edit sees them as ``(B, H, T, D)``; then the module's own ``out_proj``
weight and bias are applied with the same ``linear`` torch applies. Editing there rather
than inside the call is the robust choice: it is the same whichever branch torch takes
(``need_weights=True`` makes the heads a ``bmm`` of shape ``(B·H, T, D)``, merged axes;
``need_weights=False`` a fused ``(B, H, T, D)``), whatever ``batch_first`` says (the call
always sees ``(T, B, E)``), and it is exactly what zeroing head ``h``'s columns of
``out_proj.weight`` does. A value that is infinite or NaN in the per-head output becomes
NaN across its row (``inf * 0`` in the identity projection); finite values are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tracing.capture.op_names import mha_signature
from tracing.sites import Site, step_site

MHA_OP = "multi_head_attention_forward"


# --------------------------------------------------------------------------- nn.MultiheadAttention


def edited_mha_call(
    func: Callable, args: tuple, kwargs: dict | None, edit: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, Any]:
    """``func(*args, **kwargs)`` (``F.multi_head_attention_forward``) with its per-head
    output, seen as ``(B, H, T, D)``, replaced by ``edit(heads)`` before ``out_proj``."""
    bound = mha_signature(func).bind(*args, **(kwargs or {}))
    arguments = bound.arguments
    weight = arguments["out_proj_weight"]
    bias = arguments.get("out_proj_bias")
    num_heads = int(arguments["num_heads"])
    embed = weight.shape[1]  # out_proj's input: the merged heads, H·D
    arguments["out_proj_weight"] = torch.eye(embed, dtype=weight.dtype, device=weight.device)
    arguments["out_proj_bias"] = None
    merged, weights = func(*bound.args, **bound.kwargs)  # (T, B, H·D), or (T, H·D) unbatched
    unbatched = merged.dim() == 2
    x = merged.unsqueeze(1) if unbatched else merged
    T, B, _ = x.shape
    heads = x.view(T, B, num_heads, embed // num_heads).permute(1, 2, 0, 3)  # (B, H, T, D)
    new = edit(heads)
    flat = new.permute(2, 0, 1, 3).reshape(T * B, embed)  # as torch merges them
    out = F.linear(flat, weight, bias).view(T, B, -1)
    return (out.squeeze(1) if unbatched else out), weights


# --------------------------------------------------------------------------- finding head sites


def consumers_of(trace) -> dict[int, list]:
    """Record id -> the steps that take it as an input."""
    consumers: dict[int, list] = {}
    for s in trace.steps:
        for rid in s.inputs:
            consumers.setdefault(rid, []).append(s)
    return consumers


def head_site_of_map(trace, rec, consumers: dict[int, list]) -> tuple[Site, int, int] | None:
    """(site, output index, heads) of the per-head output made from attention map ``rec``:
    the op that multiplies it with the values (or the fused attention call that made it),
    as its module's output when the module returns it (a module site needs no op
    instrument, so patching it is cheaper); for ``nn.MultiheadAttention``, the module itself
    (see the module doc). None when there is none."""
    steps = trace.steps
    producer = steps[rec.producer]
    heads = int(rec.shape[1]) if len(rec.shape) == 4 else 0
    if producer.kind == "op" and producer.op == MHA_OP:
        if producer.parent is None:
            return None
        parent = steps[producer.parent]
        return step_site(trace, parent), 0, heads
    if producer.kind == "op" and producer.op == "scaled_dot_product_attention":
        step = producer  # fused: its first output is already per head
    else:
        mixes = [c for c in consumers.get(rec.id, ()) if c.op in ("matmul", "bmm", "einsum")]
        if not mixes:
            return None
        step = mixes[0]
    if not step.outputs:
        return None
    out = step.outputs[0]
    parent = steps[step.parent] if step.parent is not None else None
    if parent is not None and out in parent.outputs:
        return step_site(trace, parent), parent.outputs.index(out), heads
    return step_site(trace, step), 0, heads


def head_sites_in(trace, module: str | None = None) -> list[tuple[Site, int, int]]:
    """(site, output index, heads) of each attention layer's per-head output, in the order
    they ran; only those at or inside ``module`` when given."""
    consumers = consumers_of(trace)
    found: list[tuple[Site, int, int]] = []
    for rec in trace.tensors:
        # a (B·H, T, S) map (MVP, TrOCR) makes a (B·H, T, D) output: no heads axis to edit
        if rec.role != "attention" or rec.producer is None or len(rec.shape) != 4:
            continue
        path = trace.steps[rec.producer].module
        if module is not None and module and path != module and not path.startswith(module + "."):
            continue
        site = head_site_of_map(trace, rec, consumers)
        if site is not None and all(site[:2] != f[:2] for f in found):
            found.append(site)
    return found


def head_site_hint(trace, module: str) -> str:
    """A sentence naming the head sites at or inside ``module`` (for an error message)."""
    found = head_sites_in(trace, module)
    if not found:
        return ""
    names = []
    for site, k, _ in found[:4]:
        plain = str(Site(site.module, site.op, site.occurrence))
        names.append(f"Edit({plain!r}, ..., head=h" + (f", output={k})" if k else ")"))
    return "; the per-head output there: " + ", ".join(names)


__all__ = ["MHA_OP", "edited_mha_call", "head_site_hint", "head_site_of_map", "head_sites_in"]
