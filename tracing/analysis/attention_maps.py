"""Attention maps of a trace: every attention-weight tensor, keyed by module path.

The tracer marks attention weights with ``role="attention"`` and always keeps their
values, whatever the capture level:

- the second output ``(output, weights)`` of a scaled-dot-product-attention module (our
  ``ScaledDotProductAttention``), and
- for models we did not write, a ``softmax`` producing a rank-4 ``(B, H, T, T)`` tensor
  inside an attention module (a module whose type or name says ``Attention``/``attn``,
  also through its own ``nn.Softmax`` child), unless the names of its axes prove that it
  is no token map (:mod:`tracing.capture.attention_roles`), or a rank-3 one whose first
  axis is proven ``B·H`` (the heads folded into the batch: BART, MVP, TrOCR), shown here
  as its ``(B, H, T, S)`` view.

Each module *call* owns at most one map: the tensor it returned if it returned one, else
the last attention softmax inside it. A module called twice gives ``path`` and
``path#1``. An ``nn.Softmax`` module owns nothing: its attention module does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing.record import Trace


FLAT_HEADS = "B·H"  # the first axis of a rank-3 map (tracing.capture.attention_roles)


def _is_softmax_call(trace: Trace, step) -> bool:
    info = trace.modules.get(step.module)
    return step.kind == "module" and info is not None and info.type == "Softmax"


def _owner(trace: Trace, step_index: int | None) -> int | None:
    """The module step that owns a tensor produced at ``step_index`` (an ``nn.Softmax``
    module's parent: the attention module that has it)."""
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
    return len(record.shape) == 3 and bool(record.dims) and record.dims[0] == FLAT_HEADS


def attention_map_records(trace: Trace) -> dict[str, int]:
    """``{module path (#n for repeated calls): tensor id}`` of every attention map.

    Linear in the size of the trace. Only rank-4 ``(B, H, T, T)`` records count, and
    rank-3 ``(B·H, T, T)`` ones, whatever a file's ``role`` field says.
    """
    tensors = trace.tensors
    attention = {r.id for r in tensors if r.role == "attention" and _is_map_record(r)}
    # a module call that returned an attention tensor (e.g. SDPA's weights) owns it, even
    # when it was produced by an op deeper inside (softmax -> dropout -> returned)
    # (the last call to return it, in step order, wins: the innermost of nested returns)
    returned_by: dict[int, int] = {}
    for step in trace.steps:
        if step.kind == "module" and not _is_softmax_call(trace, step):
            for i in step.outputs:
                if i in attention:
                    returned_by[i] = step.index
    by_owner: dict[int, list[int]] = {}
    for tensor_id in sorted(attention - returned_by.keys()):
        owner = _owner(trace, tensors[tensor_id].producer)
        if owner is not None:
            by_owner.setdefault(owner, []).append(tensor_id)
    for tensor_id, owner in returned_by.items():
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
    (a ``(B·H, T, T)`` one unfolded to ``(B, H, T, T)``)."""
    out = {}
    batch = ((trace.meta.get("dim_letters") or {}).get("B") or {}).get("size")
    for key, tensor_id in attention_map_records(trace).items():
        value = trace.value(tensor_id)
        if value is None:
            continue
        if value.dim() == 3:
            if not batch or value.shape[0] % batch:
                continue  # the batch size is not known: no honest way to unfold it
            value = value.unflatten(0, (batch, value.shape[0] // batch))
        out[key] = value
    return out
