"""Attention maps of a trace: every attention-weight tensor, keyed by module path.

The tracer marks attention weights with ``role="attention"`` and always keeps their
values, whatever the capture level. It recognises them by what they do
(:mod:`tracing.attention_flow`), wherever they sit and whatever the modules are called:

- a ``softmax`` over the last axis of a rank-4 ``(B, H, T, S)`` tensor whose output a
  ``matmul``, ``bmm`` or ``einsum`` contracts over that axis with the values, unless the
  names of its axes prove that it is no map of tokens
  (:mod:`tracing.capture.attention_roles`), or a rank-3 one whose first axis is proven
  ``B·H`` (the heads folded into the batch: BART, MVP, TrOCR), shown here as its
  ``(B, H, T, S)`` view, or ``B`` (a single head), shown as ``(B, 1, T, S)``;
- the weights of a fused call (``scaled_dot_product_attention``, ``nn.MultiheadAttention``'s
  call), rebuilt from its arguments.

A map belongs to the module call that contracts it with the values (our
``ScaledDotProductAttention``, a Hugging Face ``LlamaAttention``, x-transformers'
``Attend``), or, for a fused call, to the one that ran it; an ``nn.Softmax`` module owns
nothing (its attention module does). Each module *call* owns at most one map: the tensor it
returned if it returned one, else the last one. A module called twice gives ``path`` and
``path#1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.attention_flow import values_mix

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing.record import Trace


FLAT_HEADS = "B·H"  # the first axis of a rank-3 map (tracing.capture.attention_roles)
ONE_HEAD = "B"  # ... of a single head's (B, T, S) map


def _is_softmax_call(trace: Trace, step) -> bool:
    info = trace.modules.get(step.module)
    return step.kind == "module" and info is not None and info.type == "Softmax"


def _owner(trace: Trace, tensor_id: int, consumers: dict[int, list]) -> int | None:
    """The module call that owns map ``tensor_id``: the one that contracts it with the
    values (:func:`tracing.attention_flow.values_mix`), where the map is used as attention;
    else (a map a fused call rebuilt, a map never used) the one that made it. An
    ``nn.Softmax`` module never owns a map: its parent, the attention, does."""
    record = trace.tensors[tensor_id]
    mix = values_mix(trace, record, consumers)
    step_index = mix.index if mix is not None else record.producer
    if step_index is None:
        return None
    step = trace.steps[step_index]
    index = step.index if step.kind == "module" else step.parent
    while index is not None and _is_softmax_call(trace, trace.steps[index]):
        index = trace.steps[index].parent
    return index


def _is_map_record(record) -> bool:
    if len(record.shape) == 4:
        return True
    return len(record.shape) == 3 and bool(record.dims) and record.dims[0] in (FLAT_HEADS, ONE_HEAD)


def attention_map_records(trace: Trace) -> dict[str, int]:
    """``{module path (#n for repeated calls): tensor id}`` of every attention map.

    Linear in the size of the trace. Only rank-4 ``(B, H, T, T)`` records count, and
    rank-3 ``(B·H, T, T)`` and ``(B, T, T)`` ones, whatever a file's ``role`` field says.
    """
    tensors = trace.tensors
    attention = [r.id for r in tensors if r.role == "attention" and _is_map_record(r)]
    consumers: dict[int, list] = {}  # record id -> the steps that take it
    for s in trace.steps if attention else ():
        for rid in s.inputs:
            consumers.setdefault(rid, []).append(s)
    by_owner: dict[int, list[int]] = {}
    for tensor_id in attention:
        owner = _owner(trace, tensor_id, consumers)
        if owner is not None:
            by_owner.setdefault(owner, []).append(tensor_id)
    maps: dict[str, int] = {}
    seen: dict[str, int] = {}
    for owner in sorted(by_owner):
        ids = by_owner[owner]
        step = trace.steps[owner]
        outputs = set(step.outputs)
        returned = [i for i in ids if i in outputs]
        chosen = returned[0] if returned else ids[-1]
        n = seen.get(step.module, 0)
        seen[step.module] = n + 1
        maps[step.module if n == 0 else f"{step.module}#{n}"] = chosen
    return maps


def attention_maps(trace: Trace) -> dict[str, torch.Tensor]:
    """``{module path: weights (B, H, T, T)}`` for every attention map the trace kept
    (a ``(B·H, T, T)`` one unfolded to ``(B, H, T, T)``, a single head's ``(B, T, T)`` shown
    as ``(B, 1, T, T)``)."""
    out = {}
    batch = ((trace.meta.get("dim_letters") or {}).get("B") or {}).get("size")
    for key, tensor_id in attention_map_records(trace).items():
        value = trace.value(tensor_id)
        if value is None:
            continue
        if value.dim() == 3 and (trace.tensors[tensor_id].dims or ("",))[0] == ONE_HEAD:
            value = value.unsqueeze(1)  # one head: (B, 1, T, S)
        elif value.dim() == 3:
            if not batch or value.shape[0] % batch:
                continue  # the batch size is not known: no honest way to unfold it
            value = value.unflatten(0, (batch, value.shape[0] // batch))
        out[key] = value
    return out
