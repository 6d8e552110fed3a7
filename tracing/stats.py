"""Summary statistics of a tensor with as few passes over its memory as possible.

The common case (every element finite) costs ``torch.aminmax``, a sum, one subtraction
and a dot product of the centred copy with itself (``torch.std_mean`` is a Welford pass,
about 15x slower on the CPU). Only when the minimum or maximum is not finite — a NaN propagates into
both, an Inf shows up in one — do we pay for the masks that count NaN and Inf and the
statistics over the finite elements alone. ``std`` is the population standard deviation
(``correction=0``), so a one-element tensor has std 0 rather than a warning and a NaN.
"""

from __future__ import annotations

import math

import torch

from tracing.record import TensorStats

_NAN = float("nan")


def _as_float(t: torch.Tensor) -> torch.Tensor:
    """Reductions like ``std_mean`` need a floating dtype; half types are widened."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    return t.to(torch.float32)


def _mean_std(t: torch.Tensor, n: int) -> tuple[float, float]:
    """Mean, then the population std from the centred copy (two passes, no Welford)."""
    f = _as_float(t)
    mean = f.sum() / n
    centred = (f - mean).view(-1)
    var = torch.dot(centred, centred) / n
    return mean.item(), math.sqrt(max(var.item(), 0.0))


def tensor_stats(t: torch.Tensor) -> TensorStats | None:
    """min/max/mean/std over the finite elements, and the NaN and Inf counts.

    Returns ``None`` for tensors that have no meaningful statistics (empty, complex, or
    on the ``meta`` device).
    """
    n = t.numel()
    if n == 0 or t.is_complex() or t.device.type == "meta":
        return None
    with torch.no_grad():
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        if not t.is_contiguous():
            t = t.contiguous()  # one copy; strided reductions are ~10x slower
        mn, mx = torch.aminmax(t)
        lo, hi = mn.item(), mx.item()
        if math.isfinite(lo) and math.isfinite(hi):
            mean, std = _mean_std(t, n)
            return TensorStats(float(lo), float(hi), mean, std, 0, 0)
        # slow path: some element is NaN or +/-Inf
        finite = torch.isfinite(t)
        n_finite = int(finite.sum())
        n_nan = int(torch.isnan(t).sum())
        n_inf = n - n_finite - n_nan
        if n_finite == 0:
            return TensorStats(_NAN, _NAN, _NAN, _NAN, n_nan, n_inf)
        kept = t[finite]
        mn, mx = torch.aminmax(kept)
        mean, std = _mean_std(kept, n_finite)
        return TensorStats(float(mn.item()), float(mx.item()), mean, std, n_nan, n_inf)
