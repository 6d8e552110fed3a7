"""Saving a whole trace, and the plain safetensors writer both writers share.

``save`` writes to a temporary name in the same directory, then renames it over the
target, so an interrupted save never leaves a file that looks complete.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import torch

from tracing.errors import TraceFileError
from tracing.file.container import (
    CHECKSUM_ALGORITHM,
    CHECKSUM_KEY,
)
from tracing.file.crc32 import crc32
from tracing.file.layout import (
    FORMAT_NAME,
    GRAPH_TENSOR,
    MANIFEST_INLINE_LIMIT,
    MANIFEST_TENSOR,
    RESERVED_PREFIX,
    TORCH_DTYPES,
    Invalid,
)
from tracing.file.manifest import check_trace, encode_manifest, graph_data, json_default
from tracing.record import (
    SCHEMA_VERSION,
    Trace,
)

# --------------------------------------------------------------------------- save


def save(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` to ``path`` as one safetensors file and return the path.

    The trace's cross-references are checked first with the rules ``load`` applies, so a
    file this writes opens again. Raises ``TraceFileError`` when the trace is inconsistent
    or the file cannot be written.
    """
    path = Path(path)
    try:
        check_trace(trace)
    except Invalid as e:
        raise TraceFileError(f"cannot save trace to {path}: {e}") from None
    trace = _without_unstorable_values(trace)
    tensors = _values_to_write(trace, path)
    metadata, extra = header_metadata(trace, MANIFEST_INLINE_LIMIT)
    tensors.update(extra)
    tmp = partial_name(path)
    try:
        write_safetensors(tensors, tmp, metadata)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise TraceFileError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    return path


def header_metadata(
    trace: Trace, inline_limit: int
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The safetensors ``__metadata__`` of ``trace``, and the manifest or graph as
    ``uint8`` entries where they do not fit within ``inline_limit`` characters."""
    manifest = encode_manifest(trace)
    text = json.dumps(manifest, separators=(",", ":"), ensure_ascii=False, default=json_default)
    graph = graph_data(trace)
    metadata = {"format": FORMAT_NAME, "schema": str(SCHEMA_VERSION)}
    extra: dict[str, torch.Tensor] = {}
    parts = [("manifest", MANIFEST_TENSOR, text)]
    if graph is not None:
        graph_text = json.dumps(graph, separators=(",", ":"), default=json_default)
        parts.append(("graph", GRAPH_TENSOR, graph_text))
    for key, tensor_name, part in parts:
        if len(part) <= inline_limit:
            metadata[key] = part
            inline_limit -= len(part)
        else:
            data = bytearray(part.encode("utf-8"))
            extra[tensor_name] = torch.frombuffer(data, dtype=torch.uint8)
    return metadata, extra


def partial_name(path: Path) -> Path:
    """The temporary name a file is written under before it is renamed into place."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise TraceFileError(f"cannot write {path}: the folder {directory} does not exist")
    if os.path.lexists(path) and not path.is_file():
        # renaming over it would replace a device (/dev/null) or a FIFO with a plain file
        raise TraceFileError(f"cannot write {path}: it exists and is not a regular file")
    return directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial"


def _without_unstorable_values(trace: Trace) -> Trace:
    """``trace``, or a shallow copy of it without the values safetensors has no dtype for
    (complex128, quantized...): their records keep shape and stats, lose ``value_key``,
    and ``meta["notes"]`` says what was left out. A trace is never refused for them."""
    if not isinstance(trace.values, dict):  # read from a file: it stored them already
        return trace
    unstorable = {}
    for key in trace.values.keys():  # noqa: SIM118 - a lazy mapping: keys without values
        value = trace.values[key]
        if isinstance(value, torch.Tensor) and dtype_name(value) not in TORCH_DTYPES:
            unstorable[key] = dtype_name(value)
    if not unstorable:
        return trace
    from dataclasses import replace

    tensors = [
        replace(r, value_key=None) if r.value_key in unstorable else r for r in trace.tensors
    ]
    kinds = ", ".join(sorted(set(unstorable.values())))
    note = (
        f"values of {len(unstorable)} tensor(s) of dtype {kinds} were not saved (the file "
        "format has no such dtype); their shapes and stats are kept"
    )
    notes = trace.meta.get("notes")
    meta = {**trace.meta, "notes": [*(notes if isinstance(notes, list) else []), note]}
    values = {k: trace.values[k] for k in trace.values.keys() if k not in unstorable}  # noqa: SIM118
    return replace(trace, tensors=tensors, meta=meta, values=values)


def _values_to_write(trace: Trace, path: Path) -> dict[str, torch.Tensor]:
    """Every kept value as a dense CPU tensor (views and shared memory are fine here)."""
    out: dict[str, torch.Tensor] = {}
    referenced = {r.value_key for r in trace.tensors if r.value_key is not None}
    for key in list(trace.values.keys()):
        if not isinstance(key, str) or key.startswith(RESERVED_PREFIX):
            raise TraceFileError(f"cannot save trace to {path}: bad value key {key!r}")
        value = trace.values[key]
        if not isinstance(value, torch.Tensor):
            raise TraceFileError(
                f"cannot save trace to {path}: value {key!r} is a {type(value).__name__}, "
                "not a tensor"
            )
        t = value.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        if t.device.type != "cpu":
            t = t.cpu()
        if dtype_name(t) not in TORCH_DTYPES:
            raise TraceFileError(
                f"cannot save trace to {path}: value {key!r} has dtype {t.dtype}, which "
                "safetensors cannot store"
            )
        out[key] = t
    missing = sorted(referenced - out.keys())
    if missing:
        raise TraceFileError(
            f"cannot save trace to {path}: tensor records name values that the trace does "
            f"not hold: {', '.join(missing[:5])}"
        )
    return out


def tensors_to_store(trace: Trace, path: Path) -> dict[str, torch.Tensor]:
    """The kept values as ``safetensors.torch.save_file`` needs them: contiguous, unshared.

    ``save`` does not need this (its writer handles views and shared memory without
    copies); benchmarks use it to give a plain ``save_file`` the same tensors.
    """
    out: dict[str, torch.Tensor] = {}
    seen_storage: set[int] = set()
    for key, t in _values_to_write(trace, path).items():
        if not t.is_contiguous():
            t = t.contiguous()
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen_storage:
                t = t.clone()
                ptr = t.untyped_storage().data_ptr()
            seen_storage.add(ptr)
        out[key] = t
    return out


# ---- the safetensors writer

WRITE_CHUNK_BYTES = 16 * 2**20
"""A non-contiguous tensor is written through a reusable buffer of this size."""


def write_safetensors(
    tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str]
) -> None:
    """Write a standard safetensors file, straight from each tensor's memory.

    The layout is the format's own: an 8-byte little-endian header length, the JSON header
    (``__metadata__`` and, per entry, ``dtype``, ``shape`` and ``data_offsets``) padded
    with spaces to a multiple of 8, then the data. Entries are ordered by element size,
    largest first, so every entry starts aligned to its element size, as safetensors' own
    writer does.

    Unlike ``safetensors.torch.save_file`` it accepts views, tensors that share memory and
    non-contiguous tensors: a contiguous tensor's bytes are written where they lie, and a
    non-contiguous one is copied block by block through one reusable buffer, never as a
    whole. So saving a trace allocates almost nothing.

    Every entry's CRC-32 goes into the metadata (``checksums``, see
    ``tracing.container``), computed from the bytes as they are written: the header is
    first written with placeholders of the same width, then rewritten in place.
    """
    entries = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    offset = 0
    layout: dict[str, Any] = {}
    for name, t in entries:
        n = t.numel() * t.element_size()
        layout[name] = {
            "dtype": TORCH_DTYPES[dtype_name(t)],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n

    def header(sums: dict[str, str]) -> bytes:
        head = {"__metadata__": with_checksums(metadata, sums), **layout}
        head_bytes = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return head_bytes + b" " * (-len(head_bytes) % 8)

    placeholder = header({name: "0" * 8 for name, _ in entries})
    scratch: list[torch.Tensor] = []  # the reusable buffer, made on first need
    sums: dict[str, str] = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(placeholder)))
        f.write(placeholder)
        for name, t in entries:
            crc = [0]

            def sink(data: Any, crc: list[int] = crc) -> None:
                crc[0] = crc32(data, crc[0])
                f.write(data)

            _write_tensor(sink, t, scratch)
            sums[name] = f"{crc[0]:08x}"
        final = header(sums)
        assert len(final) == len(placeholder)  # same width: hex digits need no escaping
        f.seek(8)
        f.write(final)


def with_checksums(metadata: dict[str, str], sums: dict[str, str]) -> dict[str, str]:
    """``metadata`` with the ``checksums`` table (entry -> CRC-32 as 8 hex digits) that
    :class:`tracing.container.Container` checks on read."""
    checksums = {"algorithm": CHECKSUM_ALGORITHM, "entries": sums}
    return {**metadata, CHECKSUM_KEY: json.dumps(checksums, separators=(",", ":"))}


def _write_tensor(sink: Any, t: torch.Tensor, scratch: list[torch.Tensor]) -> None:
    """Hand ``t``'s bytes, in order, to ``sink`` (contiguous ones without a copy)."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return
    if t.is_contiguous():
        sink(_raw_bytes(t))
        return
    if nbytes <= WRITE_CHUNK_BYTES:
        if not scratch:
            scratch.append(torch.empty(WRITE_CHUNK_BYTES, dtype=torch.uint8))
        block = scratch[0][:nbytes].view(t.dtype).view(t.shape)
        block.copy_(t)
        sink(_raw_bytes(block))
        return
    # too big for the buffer: write it as blocks of whole rows along the first axis
    row_bytes = nbytes // t.shape[0]
    rows = max(1, WRITE_CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, t.shape[0], rows):
        part = t[start : start + rows]
        _write_tensor(sink, part if rows > 1 else part[0], scratch)


def _raw_bytes(t: torch.Tensor) -> Any:
    """The bytes of a contiguous CPU tensor, without a copy."""
    return t.reshape(-1).view(torch.uint8).numpy().data


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
