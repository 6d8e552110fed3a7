"""Streaming capture (``out=PATH``) and the value arena: what is written, when, and what
an interruption or a failing forward leaves behind."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from helpers.tiny_models import tiny_model
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

import tracing
from tracing import stats as stats_mod
from tracing.capture import value_sinks as values
from tracing.file import writer as trace_file  # the streaming writer and its limits
from tracing.file.lazy_values import LazyValues

pytestmark = pytest.mark.usefixtures("one_thread")


def _model():

    return tiny_model(seed=None)


def _same(a, b) -> None:
    """Equal records and values (the root step's source line is the caller's, so apart)."""
    assert a.steps[1:] == b.steps[1:]
    assert replace(a.steps[0], source=None) == replace(b.steps[0], source=None)
    assert [(r.shape, r.dtype, r.stats, r.role) for r in a.tensors] == [
        (r.shape, r.dtype, r.stats, r.role) for r in b.tensors
    ]
    for ra, rb in zip(a.tensors, b.tensors):
        va, vb = a.value(ra.id), b.value(rb.id)
        assert (va is None) == (vb is None), ra
        if va is not None:
            assert torch.equal(va, vb), ra


def test_a_streamed_trace_equals_one_kept_in_memory(tmp_path):
    model, ids = _model(), torch.randint(0, 50, (2, 7))
    memory = tracing.trace(model, ids, capture="values")
    path = tmp_path / "t.sft"
    streamed = tracing.trace(model, ids, capture="values", out=path)
    assert isinstance(streamed.values, LazyValues)  # read from the file, not held
    _same(memory, streamed)
    _same(memory, tracing.load(path))
    plain = load_file(str(path))  # any safetensors reader opens it
    for key in memory.values:
        assert torch.equal(plain[key], memory.values[key].contiguous())
    assert sorted(os.listdir(tmp_path)) == ["t.sft"]  # no temporary left behind


def test_values_reach_the_file_while_the_forward_runs(tmp_path):
    """Each value is written as it is produced: the partial file grows layer by layer."""
    model, ids = _model(), torch.randint(0, 50, (1, 9))
    sizes = []

    def measure(module, args, output):
        partial = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
        sizes.append(partial[0].stat().st_size)

    handles = [block.register_forward_hook(measure) for block in model.blocks]
    try:
        tracing.trace(model, ids, capture="values", out=tmp_path / "t.sft")
    finally:
        for h in handles:
            h.remove()
    assert len(sizes) == 2 and sizes[1] > sizes[0] > trace_file.HEADER_RESERVE


class _Raises(nn.Module):
    def __init__(self, error: BaseException):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.error = error

    def forward(self, x):
        torch.relu(self.lin(x))
        raise self.error


def test_a_forward_that_raises_leaves_a_valid_partial_trace(tmp_path):
    path = tmp_path / "t.sft"
    with pytest.raises(tracing.TraceError) as info:
        tracing.trace(_Raises(ValueError("boom")), torch.randn(2, 4), capture="values", out=path)
    loaded = tracing.load(path)
    assert not loaded.complete and "boom" in loaded.error
    relu = next(s for s in loaded.steps if s.op == "relu")
    assert torch.equal(loaded.value(relu.outputs[0]), info.value.trace.value(relu.outputs[0]))


def test_an_interrupted_capture_leaves_a_file_that_says_so(tmp_path):
    path = tmp_path / "t.sft"
    with pytest.raises(KeyboardInterrupt):
        tracing.trace(_Raises(KeyboardInterrupt()), torch.randn(2, 4), capture="values", out=path)
    loaded = tracing.load(path)
    assert not loaded.complete and "KeyboardInterrupt" in loaded.error
    assert sorted(os.listdir(tmp_path)) == ["t.sft"]


def test_a_capture_stopped_by_sys_exit_keeps_the_partial_file(tmp_path):
    """SystemExit (or any BaseException) inside the forward goes on up as Ctrl-C does,
    with the partial trace attached and the streamed file closed as one that says so."""
    out = tmp_path / "t.sft"
    with pytest.raises(SystemExit) as info:
        tracing.trace(_Raises(SystemExit(3)), torch.randn(2, 4), capture="values", out=out)
    assert sorted(os.listdir(tmp_path)) == ["t.sft"]
    loaded = tracing.load(out)
    assert not loaded.complete and "SystemExit: 3" in loaded.error
    assert info.value.trace.error == loaded.error


def test_a_partial_file_never_looks_complete(tmp_path):
    """Killed mid-capture (nothing runs after): the file has a temporary name and its
    header is not written, so no reader takes it for a trace."""
    writer = trace_file.TraceWriter(tmp_path / "t.sft")
    writer.add("t0", torch.randn(100))
    writer._file.flush()
    (partial,) = tmp_path.iterdir()
    assert partial.name.endswith(".partial")
    with pytest.raises(tracing.TraceFileError):
        tracing.load(partial)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_value_cap_none_keeps_everything(tmp_path):
    model, ids = _model(), torch.randint(0, 50, (1, 8))
    capped = tracing.trace(model, ids, capture="values", value_cap=64)
    everything = tracing.trace(model, ids, capture="values", value_cap=None, out=tmp_path / "a")
    assert capped.meta["values_skipped"] > 0
    assert everything.meta["values_skipped"] == 0
    kept = [r for r in everything.tensors if r.role not in ("param", "buffer")]
    assert all(r.value_key is not None for r in kept)


@pytest.mark.parametrize("where", ["header outgrows its reserve", "manifest after the data"])
def test_large_headers(tmp_path, monkeypatch, where):
    if where == "header outgrows its reserve":
        monkeypatch.setattr(trace_file, "HEADER_RESERVE", 1024)
    else:
        monkeypatch.setattr(trace_file, "STREAM_INLINE_LIMIT", 100)
    model, ids = _model(), torch.randint(0, 50, (1, 5))
    path = tmp_path / "t.sft"
    streamed = tracing.trace(model, ids, capture="values", out=path)
    _same(tracing.trace(model, ids, capture="values"), streamed)
    with safe_open(str(path), framework="pt") as f:
        inline = "manifest" in (f.metadata() or {})
    assert inline == (where == "header outgrows its reserve")
    assert sorted(os.listdir(tmp_path)) == ["t.sft"]


def test_stats_level_with_out_writes_the_trace_and_its_attention_maps(tmp_path):
    model, ids = _model(), torch.randint(0, 50, (1, 6))
    trace = tracing.trace(model, ids, capture="stats", out=tmp_path / "s.sft")
    maps = trace.attention_maps()
    assert len(maps) == 2 and all(m.shape == (1, 4, 6, 6) for m in maps.values())
    assert tracing.load(tmp_path / "s.sft").attention_maps().keys() == maps.keys()


def test_the_arena_reuses_memory_once_a_trace_is_gone(monkeypatch):
    monkeypatch.setattr(values, "SMALL_COPY_BYTES", 0)  # this model's tensors are all small:
    monkeypatch.setattr(stats_mod, "BATCH", 0)  # no stats copy for the value to share
    model, ids = _model(), torch.randint(0, 50, (1, 8))
    values.release_pool()
    first = tracing.trace(model, ids, capture="values")
    pointers = {v.untyped_storage().data_ptr() for v in first.values.values()}
    assert len(pointers) == 1  # every copy in one chunk, none on its own pages
    second = tracing.trace(model, ids, capture="values")  # first is alive: a new chunk
    assert {v.untyped_storage().data_ptr() for v in second.values.values()} != pointers
    kept = {k: v.clone() for k, v in second.values.items()}
    del first  # freed at once: no reference cycle holds a finished trace
    third = tracing.trace(model, ids, capture="values")
    assert {v.untyped_storage().data_ptr() for v in third.values.values()} == pointers
    assert all(torch.equal(second.values[k], v) for k, v in kept.items())  # untouched
    values.release_pool()


def test_small_values_are_plain_clones_and_large_ones_share_a_chunk():
    model, ids = _model(), torch.randint(0, 50, (1, 8))
    trace = tracing.trace(model, ids, capture="values", value_dtype=torch.float16)
    for key, v in trace.values.items():  # (a view's value views its source's copy)
        assert v.untyped_storage().nbytes() <= values.SMALL_COPY_BYTES  # not in a chunk
        record = next(r for r in trace.tensors if r.value_key == key)
        assert v.dtype == (torch.float16 if record.dtype == "float32" else v.dtype)
        assert str(v.dtype)[6:] == record.dtype or record.dtype == "float32"
    big = nn.Linear(512, 512)
    x = torch.randn(2, 40, 512)  # 160 KB per activation: over SMALL_COPY_BYTES
    kept = tracing.trace(nn.Sequential(big, nn.ReLU()), x, capture="values").values
    big_ones = [v for v in kept.values() if v.numel() * 4 > values.SMALL_COPY_BYTES]
    assert len(big_ones) >= 2
    assert len({v.untyped_storage().data_ptr() for v in big_ones}) == 1


def test_a_streamed_trace_with_no_values_at_all(tmp_path):
    trace = tracing.trace(nn.Linear(3, 2), torch.randn(1, 3), capture="shapes", out=tmp_path / "e")
    assert len(trace.values) == 0 and tracing.load(tmp_path / "e").steps == trace.steps
    assert load_file(str(tmp_path / "e")).keys() <= {"__scratchformer_pad__"}


@pytest.mark.parametrize("where", ["header in its reserve", "header outgrows its reserve"])
def test_a_streamed_file_carries_checksums_and_a_flipped_byte_is_an_error(
    tmp_path, monkeypatch, where
):
    """Values written while the forward runs are checked on read like saved ones."""
    from tracing.errors import TraceFileError
    from tracing.file.container import Container

    if where == "header outgrows its reserve":
        monkeypatch.setattr(trace_file, "HEADER_RESERVE", 1024)
    model, ids = _model(), torch.randint(0, 50, (1, 6))
    path = tmp_path / "t.sft"
    streamed = tracing.trace(model, ids, capture="values", out=path)
    keys = list(streamed.values)
    expected = {key: streamed.values[key].clone() for key in keys}  # read before the flip
    streamed.values.close()
    with Container(path) as c:
        c.attach_checksums()
        unchecked = [n for n, e in c.entries.items() if e.checksum is None]
        assert all(n.startswith(trace_file.RESERVED_PREFIX) for n in unchecked)
        entry = c.entries[keys[len(keys) // 2]]
    assert entry.checksum is not None and entry.end > entry.start
    with open(path, "r+b") as f:  # flip one byte in the middle of that value
        f.seek((entry.start + entry.end) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    loaded = tracing.load(path)
    for key in keys:
        if key == keys[len(keys) // 2]:
            with pytest.raises(TraceFileError, match="fails its checksum"):
                loaded.values[key]
        else:  # every other value still reads, and reads what was written
            assert torch.equal(loaded.values[key], expected[key])
