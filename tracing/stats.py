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
        return _nonfinite_stats(_as_float(t), n, lo, hi)


def _nonfinite_stats(f: torch.Tensor, n: int, lo: float, hi: float) -> TensorStats:
    """Statistics when some element is NaN or +/-Inf (a causal mask filled with -inf).

    Built from ``nan_to_num`` (one fast pass each) and ``count_nonzero``; ``isfinite``,
    ``where`` and boolean indexing are 10-100x slower on the CPU. ``aminmax`` already
    told us whether any NaN is present: a NaN makes both ends NaN.
    """
    big = torch.finfo(f.dtype).max
    zeroed = torch.nan_to_num(f, nan=0.0, posinf=0.0, neginf=0.0)
    n_bad = int(torch.count_nonzero(zeroed != f))  # NaN != 0, +/-Inf != 0
    n_nan = int(torch.count_nonzero(f != f)) if math.isnan(lo) or math.isnan(hi) else 0
    n_inf = n_bad - n_nan
    n_finite = n - n_bad
    if n_finite == 0:
        return TensorStats(_NAN, _NAN, _NAN, _NAN, n_nan, n_inf)
    lo = torch.nan_to_num(f, nan=big, posinf=big, neginf=big).min().item()
    hi = torch.nan_to_num(f, nan=-big, posinf=-big, neginf=-big).max().item()
    mean = zeroed.sum() / n_finite
    centred = (zeroed - mean).view(-1)  # the n_bad zeroed slots each add mean**2
    var = (torch.dot(centred, centred) - n_bad * mean * mean) / n_finite
    std = math.sqrt(max(var.item(), 0.0))
    return TensorStats(float(lo), float(hi), mean.item(), std, n_nan, n_inf)
