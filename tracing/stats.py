"""Summary statistics of a tensor in as few passes over its memory as possible.

Two ways to compute them, chosen by the tensor's device:

- **On the CPU, at once** (:func:`tensor_stats`). ``torch.aminmax`` is one pass; a sum is a
  second; the sum of squares is a third, a BLAS dot product per block of ``BLOCK``
  elements added up in float64 (a dot product over millions of float32 elements loses
  five digits; a block loses less than one). No copy of the tensor is made. When the
  mean is large against the spread the one-pass ``E[x^2] - mean^2`` would cancel, so a
  second, centred pass over the blocks gives the variance instead. Only when the minimum
  or the maximum is not finite (a NaN propagates into both; an attention score masked
  with ``-inf`` shows in the minimum) do we count NaN and Inf and compute the statistics
  of the finite elements, block by block through one small scratch buffer rather than
  through full-size masks and copies.
- **On an accelerator, later** (:class:`StatsCollector` with ``deferred``). Reading a
  number back from a GPU stalls it until all queued work is done: doing that per tensor
  would serialise the whole forward. So every statistic stays on the device as one small
  row, computed without any branch on a value (non-finite elements are always masked,
  which costs a few more kernels and no wait); all rows are stacked and moved to the host
  once, when the trace finishes. A breakpoint that needs a value mid-run resolves that
  one row and pays alone.

``std`` is the population standard deviation (``correction=0``), so a one-element tensor
has std 0 rather than a warning and a NaN.
"""

from __future__ import annotations

import math
import threading

import torch

from tracing.record import TensorStats

BLOCK = 1 << 18
"""Elements per block of the scratch buffer (1 MB of float32: stays in a core's cache)."""

SMALL = 1 << 13
"""Up to this many elements, the sum of squares is one dot product (its error grows with
the length: 5e-7 relative here, 5e-5 over a few million elements)."""

CANCELLATION = 4.0
"""Above this ratio of ``mean^2`` to the one-pass variance, the variance is recomputed
from centred blocks: ``E[x^2] - mean^2`` would keep too few correct digits."""

_NAN = float("nan")


def _as_float(t: torch.Tensor) -> torch.Tensor:
    """A floating view to reduce over: integers become float64 (exact up to 2**53), half
    types float32 (CPU reductions in half precision round every partial sum)."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    if t.is_floating_point():
        return t.to(torch.float32)
    return t.to(torch.float64)


def _prepare(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` flattened, contiguous and floating; None if it has no statistics."""
    if t.numel() == 0 or t.is_complex() or t.device.type == "meta":
        return None
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if not t.is_contiguous():
        t = t.contiguous()  # one copy; strided reductions are ~10x slower
    return t.view(-1)


# --------------------------------------------------------------------------- CPU, at once


def tensor_stats(t: torch.Tensor) -> TensorStats | None:
    """min/max/mean/std over the finite elements, and the NaN and Inf counts, now.

    Returns ``None`` for tensors that have no meaningful statistics (empty, complex, or
    on the ``meta`` device). Works on any device, but reads each figure back at once: on
    an accelerator, :class:`StatsCollector` avoids those waits.
    """
    with torch.no_grad():
        flat = _prepare(t)
        if flat is None:
            return None
        mn, mx = torch.aminmax(flat)
        lo, hi = mn.item(), mx.item()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return _nonfinite_stats(_as_float(flat), lo, hi)
        if lo == hi:  # a constant: exactly, not up to rounding
            return TensorStats(float(lo), float(hi), float(lo), 0.0, 0, 0)
        f = _widened(_as_float(flat), max(-lo, hi))
        mean, var = _mean_var(f, f.numel())
        return TensorStats(float(lo), float(hi), mean, math.sqrt(var), 0, 0)


def _widened(f: torch.Tensor, largest: float) -> torch.Tensor:
    """``f`` in float64 when its sum of squares could overflow its own dtype (a mask
    filled with ``finfo.min``, as Hugging Face models make); otherwise ``f`` itself."""
    if f.dtype != torch.float64 and largest * largest * f.numel() > _OVERFLOW:
        return f.to(torch.float64)
    return f


_OVERFLOW = 1e36  # float32 holds up to 3.4e38

_SCRATCH = threading.local()


def _scratch(dtype: torch.dtype, n: int) -> torch.Tensor:
    """A reusable buffer of ``min(n, BLOCK)`` elements for this thread (no page faults
    after the first use, and small enough to stay in cache between its write and read)."""
    buffers = _SCRATCH.__dict__
    buf = buffers.get(dtype)
    if buf is None:
        buf = buffers[dtype] = torch.empty(BLOCK, dtype=dtype)
    return buf[: min(n, BLOCK)]


def _block_sums(f: torch.Tensor, shift: float = 0.0, fill: float | None = None):
    """``sum(x - shift)`` and ``sum((x - shift)^2)`` in float64, block by block.

    Each block is squared into the scratch buffer and summed there (``torch.sum`` adds
    pairwise, so a block loses almost nothing; a BLAS dot product would lose five
    digits over a large tensor). With ``fill``, non-finite elements count as ``fill``
    (a ``fill`` equal to ``shift`` makes them add nothing).
    """
    scratch = _scratch(f.dtype, f.numel())
    sums, squares = [], []
    for b in f.split(BLOCK):
        z = scratch[: b.numel()]
        src = b
        if fill is not None:
            src = torch.nan_to_num(b, nan=fill, posinf=fill, neginf=fill, out=z)
        if shift:
            src = torch.sub(src, shift, out=z)
        sums.append(src.sum().item())
        squares.append(torch.square(src, out=z).sum().item())
    return math.fsum(sums), math.fsum(squares)


def _mean_var(f: torch.Tensor, n: int, fill: float | None = None) -> tuple[float, float]:
    """Mean and population variance of ``n`` (finite) elements of ``f`` in one pass,
    and a second, centred one only when the first would cancel."""
    if n <= SMALL and fill is None:  # few elements: a dot product loses little
        total, squares = f.sum().item(), torch.dot(f, f).item()
    else:
        total, squares = _block_sums(f, fill=fill)
    mean = total / n
    var = squares / n - mean * mean
    if mean * mean > CANCELLATION * var:  # shift by the mean: accurate whatever it is
        shifted, squares = _block_sums(f, shift=mean, fill=None if fill is None else mean)
        var = squares / n - (shifted / n) ** 2
        mean += shifted / n
    return mean, max(var, 0.0)


def _nonfinite_stats(f: torch.Tensor, lo: float, hi: float) -> TensorStats:
    """Statistics when some element is NaN or +/-Inf (a causal mask filled with -inf).

    Block by block through the scratch buffer, with no mask: ``x - x`` is 0 where ``x``
    is finite and NaN elsewhere, so ``nan_to_num(x - x, nan=1)`` sums to the count of
    non-finite elements; ``nan_to_num`` with the dtype's extremes gives the finite
    minimum (or maximum) when ``aminmax`` could not. Comparisons that make boolean masks
    are 5-10x slower than these on the CPU; one is used only to count NaN, when
    ``aminmax`` says there is one (a NaN makes both ends NaN).
    """
    n = f.numel()
    has_nan = math.isnan(lo) or math.isnan(hi)
    big = torch.finfo(f.dtype).max
    scratch = _scratch(f.dtype, n)
    n_bad = n_nan = 0
    lows, highs = [lo], [hi]
    if not math.isfinite(lo):
        lows = []
    if not math.isfinite(hi):
        highs = []
    for b in f.split(BLOCK):
        z = scratch[: b.numel()]
        torch.sub(b, b, out=z)
        n_bad += int(torch.nan_to_num(z, nan=1.0, out=z).sum().item())
        if has_nan:
            n_nan += int(torch.count_nonzero(torch.ne(b, b)))
        if not math.isfinite(lo):
            lows.append(torch.nan_to_num(b, nan=big, posinf=big, neginf=big, out=z).min().item())
        if not math.isfinite(hi):
            highs.append(
                torch.nan_to_num(b, nan=-big, posinf=-big, neginf=-big, out=z).max().item()
            )
    n_finite = n - n_bad
    if n_finite == 0:
        return TensorStats(_NAN, _NAN, _NAN, _NAN, n_nan, n_bad - n_nan)
    lo, hi = min(lows), max(highs)
    mean, var = _mean_var(_widened(f, max(-lo, hi)), n_finite, fill=0.0)
    std = math.sqrt(var)
    return TensorStats(float(lo), float(hi), mean, std, n_nan, n_bad - n_nan)


# --------------------------------------------------------------------------- on the device


def device_row(t: torch.Tensor) -> torch.Tensor | None:
    """``[min, max, mean, var, nan, inf]`` of ``t`` as a float64 tensor on its device.

    Never reads a value back, so queuing it does not wait for the device. Non-finite
    elements are always masked (there is no branch on whether any exist): they are
    replaced by the finite mean, which leaves the minimum, maximum and sum of squared
    deviations of the finite elements unchanged, so one ``aminmax`` and one Welford
    ``var_mean`` (accurate in one pass on a GPU) over the filled tensor give them all.
    """
    with torch.no_grad():
        flat = _prepare(t)
        if flat is None:
            return None
        f = _as_float(flat)
        n = f.numel()
        finite = torch.isfinite(f)
        n_finite = finite.sum()
        n_nan = torch.isnan(f).sum()
        zero = torch.zeros((), dtype=f.dtype, device=f.device)
        mean = torch.where(finite, f, zero).sum(dtype=torch.float64) / n_finite.clamp(min=1)
        filled = torch.where(finite, f, mean.to(f.dtype))
        lo, hi = torch.aminmax(filled)
        # scaled to at most 1 first, so squares of values near the dtype's limit do not overflow
        scale = torch.maximum(lo.abs(), hi.abs()).clamp(min=torch.finfo(f.dtype).tiny)
        var = torch.var_mean(filled / scale, correction=0)[0].double() * scale.double() ** 2
        var = var * (n / n_finite.clamp(min=1))
        n_inf = n - n_finite - n_nan
        parts = (lo, hi, mean, var, n_nan, n_inf)
        return torch.stack([p.to(torch.float64) for p in parts])


def stats_from_row(row: list[float], n: int) -> TensorStats:
    """The :class:`TensorStats` of a ``device_row`` read back to the host."""
    lo, hi, mean, var, n_nan, n_inf = row
    n_nan, n_inf = int(n_nan), int(n_inf)
    if n_nan + n_inf >= n:
        return TensorStats(_NAN, _NAN, _NAN, _NAN, n_nan, n_inf)
    std = 0.0 if lo == hi else math.sqrt(max(var, 0.0))
    return TensorStats(lo, hi, mean, std, n_nan, n_inf)


class PendingStats:
    """Statistics still on the device: a row queued by :class:`StatsCollector`."""

    __slots__ = ("n", "row", "stats")

    def __init__(self, row: torch.Tensor, n: int):
        self.row: torch.Tensor | None = row
        self.n = n
        self.stats: TensorStats | None = None


class StatsCollector:
    """The statistics of every tensor one trace sees, with no host sync while it runs.

    ``add(t)`` returns a :class:`TensorStats` (CPU tensors, computed at once: reading a
    CPU result back costs nothing) or a :class:`PendingStats` (accelerator tensors, or
    every tensor with ``deferred=True``): a row left on the device. ``finish()`` stacks
    all pending rows and moves them to the host in one transfer per device; ``resolve``
    turns either kind into ``TensorStats`` (a pending row read before ``finish`` is read
    alone, a sync only that caller pays for).
    """

    def __init__(self, deferred: bool | None = None):
        self.deferred = deferred  # None: by device, True/False: always / never
        self._pending: list[PendingStats] = []

    def add(self, t: torch.Tensor) -> TensorStats | PendingStats | None:
        deferred = self.deferred
        if deferred is None:
            deferred = t.device.type not in ("cpu", "meta")
        if not deferred:
            return tensor_stats(t)
        row = device_row(t)
        if row is None:
            return None
        pending = PendingStats(row, t.numel())
        self._pending.append(pending)
        return pending

    def finish(self) -> None:
        """Move every pending row to the host: one stack and one copy per device."""
        by_device: dict[torch.device, list[PendingStats]] = {}
        for p in self._pending:
            if p.row is not None:
                by_device.setdefault(p.row.device, []).append(p)
        self._pending = []
        for group in by_device.values():
            rows = torch.stack([p.row for p in group]).cpu().tolist()
            for p, row in zip(group, rows):
                p.stats = stats_from_row(row, p.n)
                p.row = None

    @staticmethod
    def resolve(stats: TensorStats | PendingStats | None) -> TensorStats | None:
        """``TensorStats`` for what ``add`` returned (see :func:`resolve_stats`)."""
        return resolve_stats(stats)


def resolve_stats(stats: TensorStats | PendingStats | None) -> TensorStats | None:
    """``TensorStats`` for what :meth:`StatsCollector.add` returned; a row still pending
    (read before ``finish``, by a breakpoint mid-run) is read back alone."""
    if type(stats) is not PendingStats:
        return stats
    if stats.row is not None:
        stats.stats = stats_from_row(stats.row.cpu().tolist(), stats.n)
        stats.row = None
    return stats.stats
