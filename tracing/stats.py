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
- **Small CPU tensors, in one batch at the end** (:class:`StatsCollector`). On a tensor
  of a few thousand elements each reduction costs far more in its call than in its work
  (``benchmarks/bench_capture.py`` has the figures), so such a tensor is only copied when
  seen (one ``clone``; the kept value itself when one is kept) and the statistics of all
  of them are computed together when the trace finishes: one buffer per dtype and a few
  segment reductions over it.
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

import numpy as np
import torch

from tracing.record import TensorStats, built

BLOCK = 1 << 18
"""Elements per block of the scratch buffer (1 MB of float32: stays in a core's cache)."""

SMALL = 1 << 13
"""Up to this many elements, the sum of squares is one dot product (its error grows with
the length: 5e-7 relative here, 5e-5 over a few million elements)."""

BATCH = 1 << 14
"""Up to this many elements, a CPU tensor's statistics wait for the batch at the end
(its copy costs less than its own reductions would). The batch is joined and reduced in
NumPy, on one thread: a torch op on the joined buffer would be large enough to start
torch's thread pool, and on a busy machine waking those threads costs milliseconds."""

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
    """Statistics not computed yet: a row queued on a device by :class:`StatsCollector`
    (``row``), or a private copy of a small CPU tensor waiting for the batch (``copy``)."""

    __slots__ = ("copy", "n", "row", "stats")

    def __init__(self, row: torch.Tensor | None, n: int, copy: torch.Tensor | None = None):
        self.row: torch.Tensor | None = row
        self.copy: torch.Tensor | None = copy
        self.n = n
        self.stats: TensorStats | None = None


_BATCHED = frozenset(
    {
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
        torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    }
)  # fmt: skip


class StatsCollector:
    """The statistics of every tensor one trace sees, with no host sync while it runs.

    ``add(t)`` returns a :class:`TensorStats` (large CPU tensors, computed at once:
    reading a CPU result back costs nothing) or a :class:`PendingStats`: a copy of a small
    CPU tensor waiting for the batch, or a row left on an accelerator (every tensor with
    ``deferred=True``). ``finish()`` computes the batch and moves all pending rows to the
    host in one transfer per device; ``resolve`` turns either kind into ``TensorStats`` (a
    pending one read before ``finish`` is computed alone, a cost only that caller pays).
    """

    def __init__(self, deferred: bool | None = None):
        self.deferred = deferred  # None: by device, True/False: always / never
        self._pending: list[PendingStats] = []
        self._small: list[PendingStats] = []

    def add(self, t: torch.Tensor, private: bool = False) -> TensorStats | PendingStats | None:
        """Statistics of ``t`` as it is now. ``private``: ``t`` is a copy nobody else
        writes to, so a small one is batched without another copy. (A small CPU tensor's
        copy, ``PendingStats.copy``, is contiguous: a tracer may keep it as the value.)"""
        deferred = self.deferred
        if deferred is None:
            if t.is_cpu:  # (a flag: ``t.device.type`` builds a device object each time)
                n = t.numel()
                if 0 < n <= BATCH and t.dtype in _BATCHED and type(t) is torch.Tensor:
                    if not private:
                        _require_data(t, n)
                        if t.requires_grad:
                            t = t.detach()
                        t = t.clone(memory_format=_CONTIGUOUS)
                    pending = PendingStats(None, n, t)
                    self._small.append(pending)
                    return pending
                return tensor_stats(t)
            deferred = not t.is_meta
        if not deferred:
            return tensor_stats(t)
        row = device_row(t)
        if row is None:
            return None
        pending = PendingStats(row, t.numel())
        self._pending.append(pending)
        return pending

    def finish(self) -> None:
        """Compute the batch of small tensors, and move every pending row to the host: one
        stack and one copy per device."""
        small, self._small = [p for p in self._small if p.copy is not None], []
        if small:
            for p, stats in zip(small, batch_stats([p.copy for p in small])):
                p.stats = stats
                p.copy = None
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


_CONTIGUOUS = torch.contiguous_format


def _require_data(t: torch.Tensor, n: int) -> None:
    """Raise ``RuntimeError`` if ``t``'s memory is not all there (FSDP frees a gathered
    parameter's storage between uses, and resizes it before the next gather): a
    reduction says so itself, but a copy would read past the end and crash."""
    if t.is_contiguous():
        end = t.storage_offset() + n
    else:
        end = t.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    if end * t.itemsize > t.untyped_storage().nbytes():
        raise RuntimeError("the tensor's data is not allocated (its storage is smaller)")


def batch_stats(tensors: list[torch.Tensor]) -> list[TensorStats]:
    """:func:`tensor_stats` of many small CPU tensors at once.

    The tensors are laid end to end in one float64 buffer, and NumPy's
    ``reduceat`` reduces every segment in one pass per figure: minimum, maximum, the sum
    and the sum of squares in float64 (a float64 sum of squares keeps ~8 more digits than
    the float32 data needs; a segment whose mean is over 10^4 times its spread is summed
    again, centred). torch has no cheap segment reduction on the CPU (``segment_reduce``
    and row-wise ``aminmax`` cost many times these). Segments whose minimum or maximum is not
    finite go through :func:`_masked_segments`, together.
    """
    out: list[TensorStats | None] = [None] * len(tensors)
    group, indices = [], []
    with torch.no_grad(), np.errstate(invalid="ignore", over="ignore"):
        for i, t in enumerate(tensors):
            try:
                if t.dtype in _HALF:  # NumPy has no such dtype
                    group.append(t.reshape(-1).float().numpy())
                else:
                    group.append(t.numpy().reshape(-1))
                indices.append(i)
            except (RuntimeError, TypeError):  # a lazy negation or conjugation bit: alone
                out[i] = tensor_stats(t)
        if group:
            # one float64 buffer for every dtype (exact for float32, half types, bool and
            # integers up to 2**53): one set of reductions, however many dtypes
            x = np.concatenate(group, dtype=_F64, casting="unsafe")
            _segment_stats(x, [a.size for a in group], indices, out)
    return out  # type: ignore[return-value]


_HALF = frozenset({torch.float16, torch.bfloat16})


_F64 = np.float64


def _stats(mn: float, mx: float, mean: float, std: float, nan: int, inf: int) -> TensorStats:
    """``TensorStats(...)``, made faster (:func:`tracing.record.built`)."""
    fields = {"min": mn, "max": mx, "mean": mean, "std": std, "nan": nan, "inf": inf}
    return built(TensorStats, fields)


def _segment_stats(x: np.ndarray, counts: list[int], indices: list[int], out: list) -> None:
    """Fill ``out[indices[j]]`` with the statistics of segment ``j`` of the float64 ``x``."""
    n = np.array(counts)
    starts = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(n[:-1], out=starts[1:])
    lo = np.minimum.reduceat(x, starts).tolist()
    hi = np.maximum.reduceat(x, starts).tolist()
    total = np.add.reduceat(x, starts)
    squares = np.add.reduceat(np.square(x), starts)
    mean = total / n
    var = (squares / n - mean * mean).tolist()
    mean = mean.tolist()
    bad = []
    for j, i in enumerate(indices):
        mn, mx = lo[j], hi[j]
        if not (math.isfinite(mn) and math.isfinite(mx)):
            bad.append(j)
            continue
        mu, v = mean[j], var[j]
        if mn == mx:  # a constant: exactly, not up to rounding
            out[i] = _stats(mn, mx, mn, 0.0, 0, 0)
            continue
        if mu * mu > 1e8 * v:  # float64 E[x^2] - mean^2 would keep too few digits
            seg = x[starts[j] : starts[j] + counts[j]] - mu
            v = float(np.dot(seg, seg)) / counts[j] - (float(seg.sum()) / counts[j]) ** 2
        out[i] = _stats(mn, mx, mu, math.sqrt(max(v, 0.0)), 0, 0)
    if bad:
        parts = [x[starts[j] : starts[j] + counts[j]] for j in bad]
        stats = _masked_segments(np.concatenate(parts), [counts[j] for j in bad])
        for j, st in zip(bad, stats):
            out[indices[j]] = st


def _masked_segments(x: np.ndarray, counts: list[int]) -> list[TensorStats]:
    """Statistics of the finite elements of each segment of the float64 ``x``, with
    NaN/Inf counts."""
    n = np.array(counts)
    starts = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(n[:-1], out=starts[1:])
    finite = np.isfinite(x)
    n_finite = np.add.reduceat(finite, starts, dtype=np.int64)
    n_nan = np.add.reduceat(np.isnan(x), starts, dtype=np.int64).tolist()
    lo = np.minimum.reduceat(np.where(finite, x, np.inf), starts).tolist()
    hi = np.maximum.reduceat(np.where(finite, x, -np.inf), starts).tolist()
    zero = np.where(finite, x, 0.0)
    count = np.maximum(n_finite, 1)
    mean = np.add.reduceat(zero, starts) / count
    centred = np.where(finite, zero - np.repeat(mean, n), 0.0)
    var = (np.add.reduceat(centred * centred, starts) / count).tolist()
    out = []
    for j, (fin, nan) in enumerate(zip(n_finite.tolist(), n_nan)):
        inf = counts[j] - fin - nan
        if fin == 0:
            out.append(_stats(_NAN, _NAN, _NAN, _NAN, nan, inf))
        elif lo[j] == hi[j]:
            out.append(_stats(lo[j], hi[j], lo[j], 0.0, nan, inf))
        else:
            out.append(_stats(lo[j], hi[j], float(mean[j]), math.sqrt(var[j]), nan, inf))
    return out


def resolve_stats(stats: TensorStats | PendingStats | None) -> TensorStats | None:
    """``TensorStats`` for what :meth:`StatsCollector.add` returned; a row still pending
    (read before ``finish``, by a breakpoint mid-run) is read back alone."""
    if type(stats) is not PendingStats:
        return stats
    if stats.row is not None:
        stats.stats = stats_from_row(stats.row.cpu().tolist(), stats.n)
        stats.row = None
    elif stats.copy is not None:
        stats.stats = tensor_stats(stats.copy)
        stats.copy = None
    return stats.stats
