"""Reading values from a trace file: pieces checksummed as they are read, large entries
read by the caller and a helper thread together with their CRC-32 combined, every
entry's checksum checked on its first read from an open file, a damaged byte anywhere
still an error; the CRC-32 module (zlib-ng or zlib) against ``zlib.crc32``; and the
loaded trace's reuse of memory that nobody holds any more."""

from __future__ import annotations

import os
import random
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from tracing.errors import TraceFileError
from tracing.file import container as container_mod
from tracing.file import crc32 as crc32_mod
from tracing.file.container import Container, ContainerError
from tracing.file.lazy_values import LazyValues
from tracing.file.saving import write_safetensors

BIG_BYTES = 6 * container_mod.PIECE + 12  # several pieces for each thread, a short last


@pytest.fixture(params=["zlib-ng", "zlib"])
def implementation(request, monkeypatch) -> str:
    """Run a test with the accelerated CRC-32 (the zlib-ng wheel, a dependency) and with
    the zlib fallback."""
    if request.param == "zlib":
        monkeypatch.setattr(crc32_mod, "_native", lambda: None)
    assert crc32_mod.implementation() == request.param
    return request.param


@pytest.fixture(params=[2, 1])
def threads(request) -> int:
    """Run a test with torch allowed two threads (halves read at once) and one."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "big": torch.randn(BIG_BYTES // 4, generator=g),
        "odd": torch.randint(0, 256, (container_mod.SPLIT_MIN + 4097,), dtype=torch.uint8),
        "small": torch.randn(7, 3, generator=g),
        "ints": torch.arange(10),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "values.sft"
    write_safetensors(tensors, path, {})
    return path, tensors


def _open(path: Path) -> Container:
    c = Container(path)
    c.attach_checksums()
    return c


# ---- the CRC-32 module


def test_crc32_equals_zlib_on_buffers_of_odd_sizes_chained_or_not(implementation):
    rng = random.Random(1)
    for size in [0, 1, 3, 7, 15, 16, 17, 63, 255, 4095, 4097, 65_537, 1_000_003]:
        data = os.urandom(size)
        start = rng.randrange(2**32)
        array = np.frombuffer(data, dtype=np.uint8).copy()
        assert crc32_mod.crc32(data) == zlib.crc32(data)
        assert crc32_mod.crc32(data, start) == zlib.crc32(data, start)
        assert crc32_mod.crc32(array) == zlib.crc32(data)  # a writable buffer
        assert crc32_mod.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])  # read-only
        if size:
            assert crc32_mod.crc32_at(array.ctypes.data, size, start) == zlib.crc32(data, start)
        # chained piece by piece, at random cuts, equals the whole
        value, at = 0, 0
        while at < size:
            step = rng.randint(1, max(1, size // 3))
            value = crc32_mod.crc32_at(array.ctypes.data + at, min(step, size - at), value)
            at += step
        assert value == zlib.crc32(data)


def test_crc32_of_a_tensor_of_another_dtype(implementation):
    t = torch.randn(1001, dtype=torch.float64)
    data = t.numpy().tobytes()
    assert crc32_mod.crc32(t.numpy()) == zlib.crc32(data)
    assert crc32_mod.crc32(memoryview(t.numpy())) == zlib.crc32(data)


def test_combine_equals_zlib_on_random_splits():
    rng = random.Random(2)
    for _ in range(200):
        data = os.urandom(rng.randint(0, 20_000))
        cut = rng.randint(0, len(data))
        a, b = data[:cut], data[cut:]
        assert crc32_mod.combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data)
    # many pieces, combined left to right
    data = os.urandom(3_000_000)
    cuts = sorted(rng.sample(range(1, len(data)), 9))
    value = 0
    for start, end in zip([0, *cuts], [*cuts, len(data)]):
        value = crc32_mod.combine(value, zlib.crc32(data[start:end]), end - start)
    assert value == zlib.crc32(data)


def test_crc32_comes_from_the_zlib_ng_wheel_else_zlib(monkeypatch):
    assert crc32_mod.implementation() == "zlib-ng"  # a dependency: installed everywhere
    crc32_mod._native.cache_clear()
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # as if it were missing
    try:
        assert crc32_mod.implementation() == "zlib"
        assert crc32_mod.crc32(b"123456789") == 0xCBF43926  # the check value of CRC-32
    finally:
        crc32_mod._native.cache_clear()


# ---- reading entries


def test_large_and_small_entries_read_back_exactly(stored, implementation, threads):
    path, tensors = stored
    with _open(path) as c:
        assert c.entries["big"].end - c.entries["big"].start >= 2 * container_mod.SPLIT_MIN
        for name, t in tensors.items():
            back = c.get_tensor(name)
            assert back.dtype == t.dtype and torch.equal(back, t)
        # unverified re-reads (already checked) take the same paths without the CRC
        for name, t in tensors.items():
            assert torch.equal(c.get_tensor(name), t)


def test_a_read_into_given_memory(stored):
    path, tensors = stored
    with _open(path) as c:
        n = BIG_BYTES
        out = torch.full((n,), 7, dtype=torch.uint8)
        back = c.get_tensor("big", out)
        assert back.data_ptr() == out.data_ptr() and torch.equal(back, tensors["big"])
        with pytest.raises(ValueError, match="contiguous uint8"):
            c.get_tensor("big", torch.empty(n - 1, dtype=torch.uint8))


@pytest.mark.parametrize(
    "where", ["first", "second piece", "before half", "at half", "three quarters", "last"]
)
@pytest.mark.parametrize("name", ["big", "odd"])
def test_a_flipped_byte_in_a_large_entry_fails_its_checksum(
    stored, implementation, threads, name, where
):
    path, _ = stored
    with _open(path) as c:
        entry = c.entries[name]
    n = entry.end - entry.start
    half = n // 2 & ~4095
    offset = {
        "first": 0,
        "second piece": container_mod.PIECE,
        "before half": half - 1,
        "at half": half,
        "three quarters": 3 * n // 4,
        "last": n - 1,
    }[where]
    raw = bytearray(path.read_bytes())
    raw[entry.start + offset] ^= 0x10
    path.write_bytes(bytes(raw))
    with _open(path) as c:
        with pytest.raises(ContainerError, match=f"'{name}' fails its checksum"):
            c.get_tensor(name)
        assert c.get_tensor("small").shape == (7, 3)  # the others read fine


def test_each_entry_is_checksummed_once_per_open_file(stored, monkeypatch):
    path, tensors = stored
    calls = []
    crc32_at = crc32_mod.crc32_at

    def counting(address, nbytes, value=0):
        calls.append(nbytes)
        return crc32_at(address, nbytes, value)

    monkeypatch.setattr(crc32_mod, "crc32_at", counting)
    with _open(path) as c:
        c.get_tensor("small")
        c.get_tensor("big")
        first = len(calls)
        assert first >= 4  # one for "small", one per piece of "big"
        assert sum(calls) == 7 * 3 * 4 + BIG_BYTES // 4 * 4  # every byte once
        assert torch.equal(c.get_tensor("big"), tensors["big"])  # read again (evicted)
        assert torch.equal(c.get_tensor("small"), tensors["small"])
        assert len(calls) == first  # not checked again
    with _open(path) as c:  # a new open checks again
        c.get_tensor("small")
        assert len(calls) == first + 1


def test_a_read_after_the_file_changed_is_an_error_even_when_verified(stored):
    path, _ = stored
    with _open(path) as c:
        c.get_tensor("big")
        with open(path, "r+b") as f:  # same size, new modification time
            f.seek(c.entries["big"].start)
            f.write(b"\0" * 16)
        with pytest.raises(ContainerError, match="changed on disk"):
            c.get_tensor("big")


@pytest.mark.parametrize("cut", [0.25, 0.75])  # in the first half, in the second
def test_a_file_cut_short_under_a_split_read_is_a_clean_error(stored, threads, cut):
    path, _ = stored
    c = _open(path)
    entry = c.entries["big"]
    os.truncate(path, entry.start + int(BIG_BYTES * cut))
    c._identity = container_mod._identity(os.stat(path))  # cut after the size check
    try:
        with pytest.raises(ContainerError, match="shorter now"):
            c.get_tensor("big")
    finally:
        c.close()


# ---- the loaded trace reuses memory nobody holds any more


def _values(path: Path, keys: list[str], cache_size: int) -> LazyValues:
    return LazyValues(path, _open(path), keys, cache_size=cache_size)


@pytest.fixture
def many(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    tensors = {f"v{i:02d}": torch.randn(4096 + 1024 * (i % 3), generator=g) for i in range(24)}
    path = tmp_path / "many.sft"
    write_safetensors(tensors, path, {})
    return path, tensors


def test_values_let_go_by_the_cache_lend_their_memory_to_later_reads(many):
    path, tensors = many
    same_size = [k for i, k in enumerate(tensors) if i % 3 == 0]
    values = _values(path, same_size, cache_size=1)
    pointers = []
    for key in same_size:
        t = values[key]
        assert torch.equal(t, tensors[key])
        pointers.append(t.data_ptr())
        del t
    # each read lets the one before the last go; the next one reads into its memory
    assert pointers[2:] == (pointers[:2] * len(pointers))[: len(pointers) - 2]
    assert len(values._spares._kept) == 1
    values.close()


def test_memory_still_held_anywhere_is_never_reused(many):
    path, tensors = many
    values = _values(path, list(tensors), cache_size=2)
    held = {}
    for i, key in enumerate(tensors):
        t = values[key]
        kind = i % 4
        if kind == 0:
            held[key] = t  # the tensor itself
        elif kind == 1:
            held[key] = t[1:]  # a view of it
        elif kind == 2:
            held[key] = t.numpy()  # a NumPy array over it
        else:
            held[key] = t.untyped_storage()  # its storage
        del t
    assert not values._spares._kept
    for i, (key, h) in enumerate(held.items()):
        want = tensors[key]
        kind = i % 4
        if kind == 0:
            assert torch.equal(h, want)
        elif kind == 1:
            assert torch.equal(h, want[1:])
        elif kind == 2:
            assert np.array_equal(h, want.numpy())
        else:
            assert torch.equal(torch.empty(0, dtype=want.dtype).set_(h), want)
    values.close()


def test_a_full_load_of_a_saved_trace_reads_every_value_exactly(tmp_path, threads):
    big = torch.randn(3, container_mod.SPLIT_MIN // 4 + 11)
    path = tmp_path / "v.sft"
    tensors = {f"k{i}": big[i] * (i + 1) for i in range(3)}
    write_safetensors(tensors, path, {})
    values = _values(path, list(tensors), cache_size=1)
    for _ in range(2):
        for key, t in tensors.items():
            assert torch.equal(values[key], t)
    values.close()
    with pytest.raises(TraceFileError, match="closed"):
        values["k0"]


def test_a_value_still_held_is_returned_again_not_read_twice(many, monkeypatch):
    path, tensors = many
    values = _values(path, list(tensors), cache_size=1)
    reads = []
    get_tensor = Container.get_tensor

    def counting(self, name, out=None):
        reads.append(name)
        return get_tensor(self, name, out)

    monkeypatch.setattr(Container, "get_tensor", counting)
    held = values["v00"]
    for key in list(tensors)[1:6]:
        values[key]  # the cache lets "v00" go; the caller still holds it
    assert values["v00"] is held and reads.count("v00") == 1
    del held
    values["v07"]
    values["v08"]
    values["v00"]  # nobody held it any more: read again
    assert reads.count("v00") == 2
    values.close()


@pytest.mark.parametrize("helper_starts", ["before", "after one piece", "never"])
def test_pieces_read_by_either_thread_give_the_entry_and_its_checksum(
    stored, implementation, helper_starts
):
    """The helper's timing decided by hand: it takes every piece, all but the caller's
    first one, or none; the bytes and the combined CRC-32 come out the same."""
    path, tensors = stored
    with _open(path) as c:
        entry = c.entries["big"]
        out = torch.empty(entry.end - entry.start, dtype=torch.uint8)
        starts = []

        def fill_part(*args):
            starts.append(args[3])
            crc = c._fill_part(*args)
            if helper_starts == "after one piece" and len(starts) == 1:
                job.help()  # (on this thread: it takes the rest from the back)
            return crc

        job = container_mod._SharedRead(
            fill_part, memoryview(out.numpy()), out.data_ptr(), entry.start, True
        )
        if helper_starts == "before":
            job.help()
        assert job.read() == entry.checksum
        assert torch.equal(out.view(torch.float32), tensors["big"])
        pieces = -(-out.numel() // container_mod.PIECE)
        assert sorted(starts) == [i * container_mod.PIECE for i in range(pieces)]
        if helper_starts == "after one piece":
            assert starts[1:] == sorted(starts[1:], reverse=True)  # from the back


def test_an_empty_value_is_made_without_a_read_and_still_checked(stored, monkeypatch):
    """A value of no bytes (a 0-sized axis) is a fresh tensor of its dtype and shape, made
    without reading or stat-ing the file (249,000 of them load in seconds); a checksum
    that is not that of no bytes is still an error, and so is a closed file."""
    path, tensors = stored
    values = _values(path, list(tensors), cache_size=4)
    monkeypatch.setattr(os, "fstat", lambda fd: pytest.fail("an empty value stat-ed the file"))
    empty = values["empty"]
    assert empty.shape == (0, 4) and empty.dtype == torch.float32
    monkeypatch.undo()
    container = values._handle
    entry = container.entries["empty"]
    container.entries["empty"] = entry._replace(checksum=0x1234)
    with pytest.raises(TraceFileError, match="fails its checksum"):
        values["empty"]
    container.entries["empty"] = entry
    values.close()
    with pytest.raises(TraceFileError, match="closed"):
        values["empty"]
