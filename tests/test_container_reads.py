"""Reading values from a trace file: large entries are read in pieces checksummed on a
helper thread, every entry's checksum is checked on its first read from an open file,
and a damaged byte anywhere in a large entry is still an error."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
import torch

from tracing import container as container_mod
from tracing.container import Container, ContainerError
from tracing.trace_file import write_safetensors


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "big": torch.randn(3 * container_mod.PIPELINE_MIN // 4 + 5, generator=g),  # 3 pieces+
        "small": torch.randn(7, 3, generator=g),
        "ints": torch.arange(10),
    }
    path = tmp_path / "values.sft"
    write_safetensors(tensors, path, {})
    return path, tensors


def _open(path: Path) -> Container:
    c = Container(path)
    c.attach_checksums()
    return c


def test_large_and_small_entries_read_back_exactly(stored):
    path, tensors = stored
    with _open(path) as c:
        assert c.entries["big"].end - c.entries["big"].start >= container_mod.PIPELINE_MIN
        for name, t in tensors.items():
            assert torch.equal(c.get_tensor(name), t)


@pytest.mark.parametrize("where", [0, 0.5, -1])  # first piece, a middle one, the last byte
def test_a_flipped_byte_in_a_large_entry_fails_its_checksum(stored, where):
    path, _ = stored
    with _open(path) as c:
        entry = c.entries["big"]
    at = entry.start + int((entry.end - entry.start - 1) * where) if where != -1 else entry.end - 1
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))
    with _open(path) as c:
        with pytest.raises(ContainerError, match="'big' fails its checksum"):
            c.get_tensor("big")
        assert c.get_tensor("small").shape == (7, 3)  # the others read fine


def test_each_entry_is_checksummed_once_per_open_file(stored, monkeypatch):
    path, tensors = stored
    calls = []
    crc32 = zlib.crc32

    def counting(data, value=0):
        calls.append(len(data))
        return crc32(data, value)

    monkeypatch.setattr(container_mod.zlib, "crc32", counting)
    with _open(path) as c:
        c.get_tensor("small")
        c.get_tensor("big")
        first = len(calls)
        assert first >= 4  # one for "small", one per piece of "big"
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
