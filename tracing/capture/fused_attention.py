"""Rebuild the attention map that ``F.scaled_dot_product_attention`` never returns.

A fused attention kernel computes ``softmax(Q K^T * scale + mask) V`` in one call and keeps
the weights to itself. The tracer sees that call's arguments, so it can recompute the
weights the way PyTorch documents the reference implementation:

    scores  = Q @ K^T * scale                       # (B, H, Tq, Tk)
    scores += bias   (-inf where is_causal or a bool mask hides a key; a float mask added)
    weights = softmax(scores, dim=-1)               # each row sums to 1

and ``weights @ V`` then equals the fused output (to rounding). Two details follow the
fused kernels rather than the textbook: a row whose keys are all masked gets weights 0 (the
fused output for it is 0, not NaN), and with ``enable_gqa=True`` each key head is shared by
``Hq / Hkv`` query heads (``repeat_interleave`` over the head axis); without it a single
key head is broadcast to every query head, as the kernels' broadcasting does (Falcon's
multi-query attention calls it so).

Dropout is not replayed: the map is the one before dropout (what a person wants to see;
trace in ``eval()`` mode to make it the one that was used).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
"""Parameter names of ``torch.nn.functional.scaled_dot_product_attention``, in order."""


def is_fused_attention(func: Any) -> bool:
    """True for ``torch.nn.functional.scaled_dot_product_attention`` (however reached)."""
    return func is torch.nn.functional.scaled_dot_product_attention or (
        getattr(func, "__name__", "") == "scaled_dot_product_attention"
    )


def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """The attention weights of a fused call: ``(..., Hq, Tq, Tk)``, each row summing to 1.

    Arguments mean what they mean for ``F.scaled_dot_product_attention``. Computed in
    float32 at least (float64 stays float64) and returned detached.
    """
    with torch.no_grad():
        q, k = query.detach(), key.detach()
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k = q.to(dtype), k.to(dtype)
        Tq, Tk = q.size(-2), k.size(-2)
        scale_factor = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)

        if k.dim() >= 3 and q.dim() >= 3 and k.size(-3) != q.size(-3):
            Hq, Hkv = q.size(-3), k.size(-3)
            if Hkv == 1 and not enable_gqa:
                pass  # one key head broadcast to every query head (multi-query, Falcon)
            elif not enable_gqa:
                raise ValueError(
                    f"query has {Hq} heads but key has {Hkv}: pass enable_gqa=True for "
                    "grouped-query attention"
                )
            elif Hq % Hkv:
                raise ValueError(f"query heads ({Hq}) must be a multiple of key heads ({Hkv})")
            else:
                k = k.repeat_interleave(Hq // Hkv, dim=-3)

        scores = (q @ k.transpose(-2, -1)) * scale_factor  # (B, H, Tq, Tk)
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
        if is_causal:
            if attn_mask is not None:
                raise ValueError("is_causal=True and an attn_mask cannot be used together")
            allowed = allowed.tril(diagonal=0)  # top-left aligned, as PyTorch does
        if attn_mask is not None:
            mask = attn_mask.detach()
            if mask.dtype == torch.bool:
                allowed = allowed & mask
            else:
                scores = scores + mask.to(dtype)
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        # a row with every key masked: 0 (as the fused kernels give), not NaN
        return torch.nan_to_num(weights, nan=0.0)


def bind_arguments(args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Map a call's positional and keyword arguments onto :data:`PARAMS` (with defaults)."""
    bound: dict[str, Any] = {
        "attn_mask": None,
        "dropout_p": 0.0,
        "is_causal": False,
        "scale": None,
        "enable_gqa": False,
    }
    if len(args) > len(PARAMS):
        raise TypeError(f"scaled_dot_product_attention takes at most {len(PARAMS)} arguments")
    bound.update(zip(PARAMS, args))
    for name, value in (kwargs or {}).items():
        if name not in PARAMS:
            raise TypeError(f"scaled_dot_product_attention got an unexpected argument {name!r}")
        bound[name] = value
    for name in ("query", "key"):
        if not isinstance(bound.get(name), torch.Tensor):
            raise TypeError(f"scaled_dot_product_attention needs a tensor {name!r}")
    return bound


def weights_from_call(args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> torch.Tensor:
    """The attention weights of one ``F.scaled_dot_product_attention(*args, **kwargs)`` call.

    This is what the tracer calls when it records such an op (from inside its torch
    function mode, where these computations are not recorded themselves).
    """
    b = bind_arguments(args, kwargs)
    return attention_weights(
        b["query"],
        b["key"],
        attn_mask=b["attn_mask"],
        is_causal=bool(b["is_causal"]),
        scale=b["scale"],
        enable_gqa=bool(b["enable_gqa"]),
    )
