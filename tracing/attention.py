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
    """``{module path (#n for repeated calls): tensor id}`` of every attention map."""
    by_owner: dict[int, list[int]] = {}
    for record in trace.tensors:
        if record.role != "attention":
            continue
        owner = _owner(trace, record.producer)
        if owner is None:
            continue
        by_owner.setdefault(owner, []).append(record.id)
    # a module call that returned an attention tensor (e.g. SDPA's weights) owns it, even
    # when it was produced by an op deeper inside (softmax -> dropout -> returned)
    for step in trace.steps:
        if step.kind != "module":
            continue
        returned = [i for i in step.outputs if trace.tensors[i].role == "attention"]
        if returned:
            for ids in by_owner.values():
                for i in returned:
                    if i in ids:
                        ids.remove(i)
            by_owner.setdefault(step.index, []).extend(returned)
    maps: dict[str, int] = {}
    seen: dict[str, int] = {}
    for owner in sorted(by_owner):
        ids = by_owner[owner]
        if not ids:
            continue
        step = trace.steps[owner]
        returned = [i for i in ids if i in step.outputs]
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
