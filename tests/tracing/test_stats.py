"""Tensor statistics: accuracy against float64 ``torch.std_mean``, and no host sync when
deferred (the accelerator path, exercised here on the CPU)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import tracing
from tracing import stats as stats_mod
from tracing.stats import BLOCK, PendingStats, StatsCollector, batch_stats, tensor_stats

pytestmark = pytest.mark.usefixtures("one_thread")

NEG_INF, POS_INF, NAN = float("-inf"), float("inf"), float("nan")


def _causal_scores() -> torch.Tensor:
    mask = torch.ones(128, 128).triu(1).bool()
    return torch.randn(4, 128, 128).masked_fill(mask, NEG_INF)


def _cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    big = BLOCK * 3 + 17  # several blocks and a ragged tail
    offset = torch.randn(big, generator=g) * 1e-3 + 1.0  # mean 1000 std: cancels in one pass
    with_nan = torch.randn(big, generator=g)
    with_nan[[3, BLOCK + 5]] = NAN
    with_nan[[7]] = POS_INF
    masked_offset = torch.randn(300, 1000, generator=g) * 1e-2 + 5.0
    masked_offset[torch.rand(300, 1000, generator=g) < 0.3] = POS_INF
    return {
        "randn": torch.randn(big, generator=g),
        "offset": offset,
        "exponential": torch.empty(big).exponential_(generator=g),
        "softmax": torch.softmax(torch.randn(8, 256, 256, generator=g) * 3, -1),
        "small": torch.randn(100, generator=g) + 3,
        "integers": torch.arange(5000),
        "bfloat16": torch.randn(4000, generator=g).bfloat16(),
        "transposed": torch.randn(300, 700, generator=g).t(),
        "causal mask": _causal_scores(),
        "nan and inf": with_nan,
        "inf, mean far from 0": masked_offset,
    }


def _reference(t: torch.Tensor):
    d = t.double().reshape(-1)
    finite = d[torch.isfinite(d)]
    std, mean = torch.std_mean(finite, correction=0)
    counts = int(torch.isnan(d).sum()), int(torch.isinf(d).sum())
    return finite.min().item(), finite.max().item(), mean.item(), std.item(), counts


def _deferred(t: torch.Tensor):
    collector = StatsCollector(deferred=True)
    pending = collector.add(t)
    assert isinstance(pending, PendingStats)
    collector.finish()
    return collector.resolve(pending)


def _batched(t: torch.Tensor):
    """``t``'s statistics from a batch that also holds other dtypes and sizes."""
    others = [torch.arange(3), torch.randn(7), torch.tensor([True, False]), torch.randn(7)]
    return batch_stats([others[0], others[1], t, others[2], others[3]])[2]


_HOW = {"at once": tensor_stats, "deferred": lambda t: _deferred(t), "batched": _batched}


@pytest.mark.parametrize("how", list(_HOW))
@pytest.mark.parametrize("name", list(_cases()))
def test_std_accurate_to_1e5_relative_against_float64_std_mean(name, how):
    t = _cases()[name]
    st = _HOW[how](t)
    lo, hi, mean, std, (nan, inf) = _reference(t)
    assert (st.nan, st.inf) == (nan, inf)
    assert (st.min, st.max) == (lo, hi)
    assert abs(st.std - std) <= 1e-5 * std
    assert abs(st.mean - mean) <= 1e-6 * (abs(mean) + std)


def test_constant_and_all_nonfinite():
    st = tensor_stats(torch.full((3, 5), 0.1))
    assert st.std == 0.0 and st.mean == st.min == pytest.approx(0.1)
    for collect in (tensor_stats, _deferred, _batched):
        st = collect(torch.tensor([NAN, POS_INF, NEG_INF]))
        assert (st.nan, st.inf) == (1, 2) and math.isnan(st.mean) and math.isnan(st.std)
    assert _deferred(torch.full((4,), 2.5)).std == 0.0
    assert _batched(torch.full((3, 5), 0.1)) == tensor_stats(torch.full((3, 5), 0.1))


def test_small_cpu_tensors_wait_for_one_batch_from_their_own_copy():
    """A small CPU tensor is copied when added (an in-place change afterwards does not
    reach its statistics) and computed with the others in ``finish``; a kept value
    (``private``) is not copied again; one read before ``finish`` is computed alone."""
    collector = StatsCollector()
    x = torch.randn(4, 8)
    expected = tensor_stats(x)
    pending = collector.add(x)
    assert isinstance(pending, PendingStats)
    kept_copy = pending.copy  # the private copy, as the tracer keeps it for `values`
    assert kept_copy is not x and torch.equal(kept_copy, x) and kept_copy.is_contiguous()
    x.mul_(100)  # the model goes on and changes it in place
    assert not torch.equal(kept_copy, x)
    kept = torch.arange(6.0)
    assert collector.add(kept, private=True).copy is kept
    early = collector.add(torch.tensor([1.0, NAN]))
    assert collector.resolve(early).nan == 1  # read alone, mid-run
    large = collector.add(torch.randn(stats_mod.BATCH + 1))
    assert not isinstance(large, PendingStats)  # large ones at once
    collector.finish()
    st = collector.resolve(pending)
    assert (st.min, st.max, st.nan, st.inf) == (expected.min, expected.max, 0, 0)
    assert st.mean == pytest.approx(expected.mean, rel=1e-6, abs=1e-7)
    assert st.std == pytest.approx(expected.std, rel=1e-6)
    assert collector.resolve(early).nan == 1


def test_deferred_stats_never_read_a_value_back(monkeypatch):
    """The accelerator path queues work only: no ``.item()``, ``.tolist()`` or ``.cpu()``
    per tensor; one stack and one transfer when the trace finishes."""
    reads = []
    for name in ("item", "tolist", "cpu"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _name=name, _original=original, **k):
            reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    collector = StatsCollector(deferred=True)
    cases = list(_cases().values())
    pending = [collector.add(t) for t in cases]
    assert reads == []  # nothing came back while "the forward ran"
    collector.finish()
    assert reads == ["cpu", "tolist"]  # one device, one transfer
    for t, p in zip(cases, pending):
        assert _close(collector.resolve(p), t)


def _close(st, t) -> bool:
    lo, hi, _, std, counts = _reference(t)
    return (st.min, st.max, (st.nan, st.inf)) == (lo, hi, counts) and st.std == pytest.approx(
        std, rel=1e-5
    )


def test_a_breakpoint_resolves_one_pending_row_before_finish():
    collector = StatsCollector(deferred=True)
    a, b = collector.add(torch.tensor([1.0, NAN])), collector.add(torch.arange(4.0))
    assert collector.resolve(a).nan == 1  # read alone, mid-run
    collector.finish()
    assert collector.resolve(b).mean == 1.5 and collector.resolve(a).nan == 1


def test_a_deferred_trace_records_the_same_stats(monkeypatch):
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    model = DecoderOnlyTransformer(ModelConfig.preset("demo")).eval()
    ids = torch.randint(0, 256, (1, 12))
    now = tracing.trace(model, ids, capture="stats")
    monkeypatch.setattr(
        "tracing.capture.tracer.StatsCollector", functools.partial(StatsCollector, deferred=True)
    )
    later = tracing.trace(model, ids, capture="stats")
    assert len(now.tensors) == len(later.tensors)
    for a, b in zip(now.tensors, later.tensors):
        assert (a.stats is None) == (b.stats is None)
        if a.stats is not None:
            assert (a.stats.min, a.stats.max, a.stats.nan, a.stats.inf) == (
                b.stats.min,
                b.stats.max,
                b.stats.nan,
                b.stats.inf,
            )
            assert b.stats.mean == pytest.approx(a.stats.mean, rel=1e-5, abs=1e-6)
            assert b.stats.std == pytest.approx(a.stats.std, rel=1e-5, abs=1e-6)


def test_no_full_size_temporary_on_the_nonfinite_path(monkeypatch):
    """Masked scores (-inf above the diagonal) go through the block scratch buffer: no
    tensor as large as the input is allocated (``torch.empty``/``nan_to_num`` without
    ``out``/``isfinite``/``where`` would)."""
    t = torch.randn(4 * BLOCK).masked_fill(torch.rand(4 * BLOCK) < 0.5, NEG_INF)
    expected = int(torch.isinf(t).sum())
    stats_mod._SCRATCH.__dict__.clear()
    sizes = []
    for name in ("isfinite", "isinf", "isnan", "where", "empty", "zeros_like", "empty_like"):
        original = getattr(torch, name)

        def spy(*a, _original=original, **k):
            out = _original(*a, **k)
            sizes.append(out.numel())
            return out

        monkeypatch.setattr(torch, name, spy)
    st = tensor_stats(t)
    assert st.inf == expected
    assert max(sizes, default=0) <= BLOCK


@pytest.mark.parametrize("collect", [tensor_stats, _deferred, _batched])
def test_values_near_the_float32_limit_do_not_overflow(collect):
    """Hugging Face masks hold ``finfo.min``: their sum and squares overflow float32."""
    low = torch.finfo(torch.float32).min
    t = torch.zeros(2, 1, 9, 9).masked_fill(torch.ones(9, 9).triu(1).bool(), low)
    st = collect(t)
    lo, hi, mean, std, _ = _reference(t)
    assert (st.min, st.max) == (lo, hi)
    assert st.mean == pytest.approx(mean, rel=1e-6) and st.std == pytest.approx(std, rel=1e-5)
