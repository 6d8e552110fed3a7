"""Attention maps of a trace: every attention-weight tensor, keyed by module path.

The tracer marks attention weights with ``role="attention"`` and always keeps their
values, whatever the capture level:

- the second output ``(output, weights)`` of a scaled-dot-product-attention module (our
  ``ScaledDotProductAttention``), and
- for models we did not write, a ``softmax`` producing a rank-4 ``(B, H, T, T)`` tensor
  inside an attention module (a module whose type or name says ``Attention``/``attn``).

Each module *call* owns at most one map: the tensor it returned if it returned one, else
the last attention softmax inside it. A module called twice gives ``path`` and
``path#1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing.record import Trace


def _owner(trace: Trace, step_index: int | None) -> int | None:
    """The module step that owns a tensor produced at ``step_index``."""
    if step_index is None:
        return None
    step = trace.steps[step_index]
    return step.index if step.kind == "module" else step.parent


def attention_map_records(trace: Trace) -> dict[str, int]:
    """``{module path (#n for repeated calls): tensor id}`` of every attention map.

    Linear in the size of the trace. Only rank-4 ``(B, H, T, T)`` records count, whatever
    a file's ``role`` field says.
    """
    tensors = trace.tensors
    attention = {r.id for r in tensors if r.role == "attention" and len(r.shape) == 4}
    # a module call that returned an attention tensor (e.g. SDPA's weights) owns it, even
    # when it was produced by an op deeper inside (softmax -> dropout -> returned)
    # (the last call to return it, in step order, wins: the innermost of nested returns)
    returned_by: dict[int, int] = {}
    for step in trace.steps:
        if step.kind == "module":
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
    """``{module path: weights (B, H, T, T)}`` for every attention map the trace kept."""
    out = {}
    for key, tensor_id in attention_map_records(trace).items():
        value = trace.value(tensor_id)
        if value is not None:
            out[key] = value
    return out
