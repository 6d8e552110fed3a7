"""Trace files in tests: bit-equal tensors, an edited manifest, the error a bad file gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import tracing
from tracing.errors import TraceFileError


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal, NaNs included (torch.equal says NaN != NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bytes(a.contiguous().view(-1).view(torch.uint8).numpy()) == bytes(
        b.contiguous().view(-1).view(torch.uint8).numpy()
    )


def rewrite(path: Path, edit, *, schema: str | None = None, fmt: str | None = None) -> None:
    """Rewrite a trace file with an edited manifest (``edit(manifest)`` mutates it)."""
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        header = dict(f.metadata())
    manifest = json.loads(header["manifest"])
    edit(manifest)
    header["manifest"] = json.dumps(manifest)
    if schema is not None:
        header["schema"] = schema
    if fmt is not None:
        header["format"] = fmt
    save_file(tensors, str(path), metadata=header)


def expect_error(path: Path, *words: str) -> TraceFileError:
    with pytest.raises(TraceFileError) as info:
        tracing.load(path)
    message = str(info.value)
    assert str(path) in message
    for w in words:
        assert w in message, message
    # one clear error, not a chain leading into the reader's internals
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ or info.value.__context__ is None
    return info.value
