"""Per-head outputs: where an attention layer's heads can be edited, and torch's own attention.

A head edit changes one head's output, the ``(B, H, T, D)`` tensor the attention weights
make from the values before the heads are merged and projected. Most attention code has that
tensor as a step of its own (a ``matmul`` of the map with the values, a fused
``scaled_dot_product_attention``); :func:`head_site_of_map` finds it from the map, and
:func:`resolve_head_edit` readdresses ``Edit(<attention module>, ..., head=h)`` there.

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
NaN across its row (``inf * 0`` in the identity projection); finite values are exact. A
trace records that per-head output as the call's ``head_outputs``
(:func:`mha_head_outputs`), so a head can be patched from a saved trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tracing.attention_flow import values_mix
from tracing.capture.op_names import mha_signature
from tracing.sites import Site, site_steps, step_site

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


def mha_head_outputs(
    func: Callable, args: tuple, kwargs: dict | None, weights: bool = False
) -> tuple[torch.Tensor | None, Any]:
    """(per-head output ``(B, H, T, D)``, weights) of the call ``func(*args, **kwargs)``
    (``F.multi_head_attention_forward``), computed by the call itself with an identity
    output projection and dropout off (no random numbers drawn): what
    :func:`edited_mha_call` hands an edit. With ``weights``, the call also returns its
    per-head weights ``(B, H, T, S)`` (one call for both; the heads then come from torch's
    unfused path, equal to the fused one's to float rounding), else the weights are what
    the call returns as asked. ``(None, None)`` for an unbatched call."""
    seen: list[torch.Tensor] = []

    def keep(heads: torch.Tensor) -> torch.Tensor:
        seen.append(heads)
        return heads

    bound = mha_signature(func).bind(*args, **(kwargs or {}))
    bound.arguments["training"] = False
    if weights:
        bound.arguments.update(need_weights=True, average_attn_weights=False)
    if bound.arguments["query"].dim() != 3:
        return None, None
    _, found = edited_mha_call(func, bound.args, bound.kwargs, keep)
    return seen[0].detach(), found


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
    the op that contracts it with the values (:func:`tracing.attention_flow.values_mix`), or
    the fused attention call that made it, as its module's output when the module returns
    it (a module site needs no op instrument, so patching it is cheaper); for
    ``nn.MultiheadAttention``, the module itself (see the module doc). None when there is
    none."""
    steps = trace.steps
    producer = steps[rec.producer]
    heads = int(rec.shape[1]) if len(rec.shape) == 4 else folded_heads(trace, rec) or 0
    if producer.kind == "op" and producer.op == MHA_OP:
        if producer.parent is None:
            return None
        parent = steps[producer.parent]
        return step_site(trace, parent), 0, heads
    if producer.kind == "op" and producer.op == "scaled_dot_product_attention":
        step = producer  # fused: its first output is already per head
    else:
        step = values_mix(trace, rec, consumers)
        if step is None:
            return None
    if not step.outputs:
        return None
    out = step.outputs[0]
    parent = steps[step.parent] if step.parent is not None else None
    if parent is not None and out in parent.outputs:
        return step_site(trace, parent), parent.outputs.index(out), heads
    return step_site(trace, step), 0, heads


def folded_heads(trace, rec) -> int | None:
    """H, when tensor ``rec`` (an attention map, a per-head output) is ``(B·H, T, ...)``:
    the heads folded into the batch, batch outer (BART, MVP, TrOCR, XGLM compute attention
    with ``bmm`` so), proven by its first axis's name and the trace's letter sizes; None
    otherwise."""
    if len(rec.shape) != 3 or not rec.dims or rec.dims[0] != "B·H":
        return None
    letters = trace.meta.get("dim_letters") or {}
    sizes = [(letters.get(c) or {}).get("size") for c in ("B", "H")]
    if not all(isinstance(n, int) and n > 0 for n in sizes) or sizes[0] * sizes[1] != rec.shape[0]:
        return None
    return sizes[1]


def heads_folded_at(trace, site: Site, k: int = 0) -> int | None:
    """H when the per-head output at ``site`` (its output ``k``) is ``(B·H, T, D)``: the
    heads folded into the batch, as ``bmm`` attention leaves them (BART, MVP, XGLM, Bloom),
    proven by that axis's name and the trace's letter sizes; what an :class:`Edit` of a
    head there needs as ``heads_folded``. None for a ``(B, H, T, D)`` one."""
    steps = site_steps(trace, site)
    if not steps or len(steps[0].outputs) <= k:
        return None
    return folded_heads(trace, trace.tensor(steps[0].outputs[k]))


def head_sites_in(trace, module: str | None = None) -> list[tuple[Site, int, int]]:
    """(site, output index, heads) of each attention layer's per-head output, in the order
    they ran; only those at or inside ``module`` when given. A ``(B·H, T, S)`` map's output
    is ``(B·H, T, D)``, its heads folded into the batch (:func:`heads_folded_at`)."""
    consumers = consumers_of(trace)
    found: list[tuple[Site, int, int]] = []
    for rec in trace.tensors:
        if rec.role != "attention" or rec.producer is None:
            continue
        if len(rec.shape) != 4 and folded_heads(trace, rec) is None:
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
    names = [_site_text(site, k) for site, k, _ in found[:4]]
    return "; the per-head output there: " + ", ".join(names)


# --------------------------------------------------------------------------- a module's head


def resolve_head_edit(trace, edit):
    """``edit`` (``head=`` on a module whose output has no heads axis, say a Hugging Face
    ``LlamaAttention`` or our ``MultiHeadAttention``) readdressed to the one per-head output
    that ``trace`` shows inside that module, with ``via`` naming the module it was given;
    None when ``trace`` holds no call of the module to read that from. The evidence is the
    trace: the attention map the tracer recognised inside the module call and the op that
    multiplies it with the values (:func:`head_site_of_map`); a module with none or with
    several (a block with self- and cross-attention) raises :class:`EditError` naming them."""
    from tracing.capture.edits import Edit, EditError, _index_text

    module, call = edit.site.module, edit.site.call
    calls = [s for s in site_steps(trace, Site(module, call=call)) if s.end is not None]
    if not calls:
        return None
    outer = calls[0]
    found = [
        (site, k, heads)
        for site, k, heads in head_sites_in(trace, module)
        if _inside(trace, outer, site)
    ]
    where = str(Site(module, call=call))
    if len(found) != 1:
        if not found:
            shape = (
                f"its output has shape {tuple(trace.tensor(outer.outputs[0]).shape)}, and "
                if outer.outputs
                else ""
            )
            maps = [
                r
                for r in trace.tensors
                if r.role == "attention"
                and len(r.shape) == 4
                and r.producer is not None
                and outer.index < r.producer <= (outer.end or outer.index)
            ]
            why = (
                "an attention map was recorded inside it, but the op that mixes it with the "
                "values does not lay out its output (B, H, T, D), the heads on axis 1"
                if maps
                else "no attention map was recorded inside it to find the heads' output by"
            )
            raise EditError(
                f"head={_index_text(edit.head)} at {where} needs a value with a heads axis, "
                f"(B, H, T, ...); {shape}{why} (edit a site after the heads are split, or "
                "give head_axis=)"
            )
        names = ", ".join(_site_text(site, k) for site, k, _ in found)
        raise EditError(
            f"head={_index_text(edit.head)} at {where}: {len(found)} attention layers ran "
            f"inside it, so which head is meant is not clear; address one: {names}"
        )
    site, k, _ = found[0]
    inner_call = None if call is None else site.call  # the same call of the inner module
    target = Site(site.module, site.op, site.occurrence, inner_call)
    return Edit(
        target, edit.action, head=edit.head, positions=edit.positions, output=k,
        position_axis=edit.position_axis, via=str(edit.site),
        note=kv_note(trace, site, edit.head), heads_folded=heads_folded_at(trace, site, k),
    )  # fmt: skip


def _inside(trace, outer, site: Site) -> bool:
    """Whether ``site`` (with its call) ran within module step ``outer``'s call."""
    return any(outer.index < s.index <= outer.end for s in site_steps(trace, site))


def _site_text(site: Site, k: int) -> str:
    plain = str(Site(site.module, site.op, site.occurrence))
    return f"Edit({plain!r}, ..., head=h" + (f", output={k})" if k else ")")


def kv_heads_of(trace, site: Site) -> tuple[int, int] | None:
    """(query heads, key/value heads) of the attention whose per-head output is ``site``,
    when the trace shows grouped-query attention, else None: a fused call given fewer key
    heads than query heads (torch's ``enable_gqa``: query head ``h`` reads key/value head
    ``h // (H // KV)``), or values repeated per group the way Hugging Face's ``repeat_kv``
    does (``(B, KV, 1, S, D)`` expanded to ``(B, KV, n, S, D)`` then merged: the same
    mapping)."""
    steps = site_steps(trace, site)
    if not steps:
        return None
    step = steps[0]
    if step.kind == "module":  # a module that returns the per-head output: its last op
        inner = trace.steps[step.index + 1 : (step.end or step.index) + 1]
        ops = [s for s in inner if s.kind == "op" and s.outputs and s.outputs[0] == step.outputs[0]]
        if not ops:
            return None
        step = ops[-1]
    shapes = [trace.tensor(i).shape for i in step.inputs]
    if step.op == "scaled_dot_product_attention" and len(shapes) >= 2:
        q, k = shapes[0], shapes[1]
        if len(q) == 4 and len(k) == 4 and k[1] < q[1] and q[1] % k[1] == 0:
            return q[1], k[1]
        return None
    for rid in step.inputs:
        rec = trace.tensor(rid)
        if len(rec.shape) != 4 or rec.role == "attention" or rec.producer is None:
            continue
        merge = trace.steps[rec.producer]
        if merge.op not in ("reshape", "view") or not merge.inputs:
            continue
        grouped = trace.tensor(merge.inputs[0])
        if len(grouped.shape) != 5 or grouped.producer is None:
            continue
        expand = trace.steps[grouped.producer]
        source = [trace.tensor(i).shape for i in expand.inputs]
        KV, n = grouped.shape[1:3]
        if (
            expand.op == "expand"
            and source
            and len(source[0]) == 5
            and source[0][2] == 1
            and source[0][1] == KV
            and KV * n == rec.shape[1]
            and n > 1
        ):
            return rec.shape[1], KV
    return None


def kv_note(trace, site: Site, head) -> str:
    """``query head 4; it shares key/value head 1 of 2 with query heads 3-5`` for one head
    of a grouped-query attention whose per-head output is ``site``; "" otherwise."""
    found = kv_heads_of(trace, site)
    if found is None or not isinstance(head, int):
        return ""
    H, KV = found
    group = H // KV
    h = head % H
    kv = h // group
    return (
        f"query head {h}; it shares key/value head {kv} of {KV} with query heads "
        f"{kv * group}-{(kv + 1) * group - 1}"
    )


__all__ = [
    "MHA_OP",
    "edited_mha_call",
    "head_site_hint",
    "head_site_of_map",
    "head_sites_in",
    "kv_heads_of",
    "kv_note",
    "mha_head_outputs",
    "resolve_head_edit",
]
