"""The trace file: one safetensors container holding a whole ``Trace``.

Layout
------
A trace file is an ordinary `safetensors <https://github.com/huggingface/safetensors>`_
file, so any safetensors reader can list and read its tensors, and opening one runs no
code (there is no pickle anywhere):

- every kept tensor value is a named entry; the name is the ``TensorRecord.value_key``;
- the safetensors header's ``__metadata__`` (a string -> string map) carries::

      "format":   "scratchformer-trace"     # marks the file as ours
      "schema":   "1"                       # SCHEMA_VERSION of the manifest
      "manifest": "{...}"                   # the JSON manifest (compact)
      "graph":    "{...}"                   # node_link_data of Trace.graph (JSON)

  A manifest or graph too big for the header (safetensors caps the header at ~100 MB) is
  stored as a ``uint8`` entry named ``__scratchformer_manifest__`` /
  ``__scratchformer_graph__`` instead, and its key is absent.

The manifest
------------
``meta``, ``error``, then ``steps``, ``tensors`` and ``modules`` as small tables
(``{"fields": [...], "rows": [[...], ...]}``: one list per record, field names once).
Source locations are de-duplicated into ``sources`` and steps point at them by index.

The graph
---------
``graph`` is ``networkx.node_link_data(trace.graph, edges="edges")`` (networkx 3.6
renamed the edge key, so it is given explicitly), for readers outside ``tracing``:
``networkx.node_link_graph(json.loads(...), edges="edges")`` or ``read_graph_data``. It
sits beside the manifest rather than inside it because it repeats what the steps say:
``tracing.load`` never parses it (that would double the work of opening a file) and
rebuilds ``Trace.graph`` from the steps on first use.

Reading
-------
``load`` reads the header only and validates every field and cross-reference against it,
so opening takes the same time whatever the size of the tensors. ``Trace.values`` is then
a read-only mapping that reads a tensor from disk the first time it is asked for (and
keeps the last few in a small cache). Every problem raises one ``TraceFileError`` naming
the file and the problem.

Writing
-------
``save`` writes to a temporary name in the same directory, then renames it over the
target, so an interrupted save never leaves a file that looks complete.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import shutil
import struct
import sys
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from dataclasses import MISSING as MISSING_FIELD
from dataclasses import fields
from functools import partial
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tracing.container import (
    CHECKSUM_ALGORITHM,
    CHECKSUM_KEY,
    DTYPES,
    Container,
    ContainerError,
)
from tracing.crc32 import crc32
from tracing.errors import TraceFileError
from tracing.meta_checks import MetaProblem, check_meta
from tracing.postmortem import failure_from_json, failure_to_json, sources_from_json
from tracing.record import (
    SCHEMA_VERSION,
    ModuleInfo,
    SourceLocation,
    Step,
    TensorRecord,
    TensorStats,
    Trace,
)

FORMAT_NAME = "scratchformer-trace"
"""Value of the ``format`` metadata key: tells our files from other safetensors files."""

MANIFEST_TENSOR = "__scratchformer_manifest__"
"""Entry that holds the manifest when it is too big for the safetensors header."""

GRAPH_TENSOR = "__scratchformer_graph__"
"""Entry that holds the graph JSON when it is too big for the safetensors header."""

RESERVED_PREFIX = "__scratchformer"

MANIFEST_INLINE_LIMIT = 2**20
"""Most characters of manifest + graph kept in the header; larger ones are stored as
``uint8`` entries. A header is parsed whole on every open, each string in it unescaped:
a 50,000-step trace's manifest and graph (28 MB) cost 0.1 s there, and the graph is not
needed to open a trace; as entries, the manifest is one read and the graph is read only
when asked for. (Files with larger inline manifests, written before, open as ever.)"""

VALUE_CACHE_SIZE = 16
"""How many tensors a loaded trace keeps in memory after reading them (least recent out),
besides those still held by the caller (see ``LazyValues``)."""

VALUE_CACHE_BYTES = 4 * 2**20
"""...and at most this many bytes of them (the last one read is always kept). Small on
purpose: a value in use stays reachable anyway, and reading every value of a trace once
runs ~20% faster when the memory of the values let go is reused while it is still in the
CPU's cache (with 256 MB here, a full load of a 471 MB trace took 104 ms instead of 89)."""

MAX_MANIFEST_BYTES = 64 * 2**20
"""Largest manifest ``load`` decodes; decoding costs ~40x its size in memory, and a trace
of 50,000 steps needs ~15 MB."""

MAX_RECORDS = 2_000_000
"""Most rows a manifest table (steps, tensors, modules, sources) may hold."""

MAX_DEPTH = 256
"""Deepest module nesting a step may have (real models nest a dozen levels)."""

MAX_META_NESTING = 64
"""Deepest nesting of lists and objects accepted in ``meta``."""

MAX_INT = 2**63 - 1
"""Whole numbers in the manifest (ids, sizes, counts) must fit in 64 bits."""

# safetensors dtype codes -> torch dtype names (as TensorRecord.dtype spells them)
_ST_DTYPES = {code: name for code, (name, _) in DTYPES.items()}

_TORCH_DTYPES = {name: code for code, name in _ST_DTYPES.items()}

_STEP_KINDS = ("module", "op", "backward")
_STATS_FIELDS = tuple(f.name for f in fields(TensorStats))


class _Invalid(Exception):
    """A problem found while decoding; ``load`` turns it into one TraceFileError."""


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
    except _Invalid as e:
        raise TraceFileError(f"cannot save trace to {path}: {e}") from None
    trace = _without_unstorable_values(trace)
    tensors = _values_to_write(trace, path)
    metadata, extra = _metadata(trace, MANIFEST_INLINE_LIMIT)
    tensors.update(extra)
    tmp = _partial_name(path)
    try:
        write_safetensors(tensors, tmp, metadata)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise TraceFileError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    return path


def _metadata(trace: Trace, inline_limit: int) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The safetensors ``__metadata__`` of ``trace``, and the manifest or graph as
    ``uint8`` entries where they do not fit within ``inline_limit`` characters."""
    manifest = encode_manifest(trace)
    text = json.dumps(manifest, separators=(",", ":"), ensure_ascii=False, default=_json_default)
    graph = _graph_data(trace)
    metadata = {"format": FORMAT_NAME, "schema": str(SCHEMA_VERSION)}
    extra: dict[str, torch.Tensor] = {}
    parts = [("manifest", MANIFEST_TENSOR, text)]
    if graph is not None:
        graph_text = json.dumps(graph, separators=(",", ":"), default=_json_default)
        parts.append(("graph", GRAPH_TENSOR, graph_text))
    for key, tensor_name, part in parts:
        if len(part) <= inline_limit:
            metadata[key] = part
            inline_limit -= len(part)
        else:
            data = bytearray(part.encode("utf-8"))
            extra[tensor_name] = torch.frombuffer(data, dtype=torch.uint8)
    return metadata, extra


def _partial_name(path: Path) -> Path:
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
        if isinstance(value, torch.Tensor) and _dtype_name(value) not in _TORCH_DTYPES:
            unstorable[key] = _dtype_name(value)
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
        if _dtype_name(t) not in _TORCH_DTYPES:
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
            "dtype": _TORCH_DTYPES[_dtype_name(t)],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n

    def header(sums: dict[str, str]) -> bytes:
        head = {"__metadata__": _with_checksums(metadata, sums), **layout}
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


def _with_checksums(metadata: dict[str, str], sums: dict[str, str]) -> dict[str, str]:
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


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


# --------------------------------------------------------------------------- streaming writer

HEADER_RESERVE = 2 * 2**20
"""Bytes a streamed file keeps free at its start for the header. The unused part is a
hole (no disk space on the usual file systems) covered by a padding entry."""

STREAM_INLINE_LIMIT = 2**20
"""A streamed file keeps a manifest or graph up to this many characters in its header;
larger ones become entries after the data (the header must fit ``HEADER_RESERVE``)."""

PAD_PREFIX = f"{RESERVED_PREFIX}_pad"


def can_store(dtype: torch.dtype) -> bool:
    """Whether a trace file can hold values of ``dtype`` (safetensors has no complex128,
    no quantized types...)."""
    return str(dtype).removeprefix("torch.") in _TORCH_DTYPES


def _memory_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy and without numpy: a numpy
    view marks the storage as never to be resized again, and a live tensor may need that
    (FSDP frees a gathered parameter by resizing its storage to 0)."""
    nbytes = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


class TraceWriter:
    """Writes a trace file while the trace is recorded: values first, the header last.

    A safetensors file starts with its header, which lists every entry, so it cannot be
    written before the last value is known. This writer leaves ``HEADER_RESERVE`` bytes
    free, appends each value behind them as it comes (``add``), and on ``close`` writes
    the header into the reserved space; the space the header does not use is covered by a
    ``uint8`` padding entry (safetensors wants the data region tiled by entries), as is
    any gap that keeps a value aligned to its element size. So the result is one ordinary
    safetensors file, written once, with no copy of the data; ``tracing.load`` ignores
    the padding entries, other readers see them as ``uint8`` arrays.

    Every value's CRC-32 is taken from its bytes as they are written and listed in the
    header (``checksums``, as :func:`write_safetensors` does), so a streamed file is
    checked on read like a saved one.

    The file is written under a temporary name and renamed into place by ``close``: a
    capture that is interrupted (or ``abort``-ed) never leaves a complete-looking file.
    If the header outgrows its reserve, ``close`` rewrites the file once, with room.
    """

    def __init__(self, path: str | os.PathLike, reserve: int = HEADER_RESERVE):
        self.path = Path(path)
        self._tmp = _partial_name(self.path)
        self._reserve = reserve + (-reserve % 8)
        self._entries: dict[str, tuple[str, list[int], int, int]] = {}  # offsets from data
        self._offset = 0  # bytes of data written so far
        self._pads = 0
        self._sums: dict[str, str] = {}  # entry -> CRC-32 of its bytes as written (8 hex)
        try:
            self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
            self._file.seek(self._reserve)
        except OSError as e:
            raise TraceFileError(f"cannot write {self.path}: {e.strerror or e}") from None

    @property
    def bytes_written(self) -> int:
        return self._offset

    def add(self, name: str, t: torch.Tensor) -> None:
        """Append one CPU tensor's bytes (a non-contiguous one, or a tensor subclass,
        through a contiguous copy)."""
        if name in self._entries or name.startswith(RESERVED_PREFIX):
            raise ValueError(f"cannot stream value {name!r}: the name is taken or reserved")
        self._append(name, t)

    def _append(self, name: str, t: torch.Tensor) -> None:
        code = _TORCH_DTYPES.get(_dtype_name(t))
        if code is None:
            self.abort()
            raise TraceFileError(
                f"cannot write {self.path}: value {name!r} has dtype {t.dtype}, which "
                "safetensors cannot store"
            )
        gap = -self._offset % t.element_size()
        if gap:
            self._pad(gap)
        if type(t) is not torch.Tensor or not t.is_contiguous():
            # a subclass (an async collective's output) only has its data after a torch
            # op waits for it: copy through one
            plain = torch.empty(t.shape, dtype=t.dtype)
            plain.copy_(t)
            t = plain
        nbytes = t.numel() * t.element_size()
        try:
            if nbytes:
                data = _memory_of(t)
                self._sums[name] = f"{crc32(data):08x}"
                self._file.write(data)
            else:
                self._sums[name] = "00000000"
        except OSError as e:  # a full disk, a size limit: keep what is complete, say why
            self._sums.pop(name, None)
            with contextlib.suppress(OSError):
                self._file.truncate(self._reserve + self._offset)
            raise TraceFileError(
                f"cannot write {self.path}: {e.strerror or e}; the trace is kept up to the "
                "last complete value"
            ) from None
        self._entries[name] = (code, list(t.shape), self._offset, self._offset + nbytes)
        self._offset += nbytes

    def _pad(self, nbytes: int, at: int | None = None) -> None:
        """A ``uint8`` entry over ``nbytes`` of the data region (written as zeros)."""
        start = self._offset if at is None else at
        self._entries[f"{PAD_PREFIX}{self._pads}__"] = ("U8", [nbytes], start, start + nbytes)
        self._pads += 1
        if at is None:
            self._file.write(bytes(nbytes))
            self._offset += nbytes

    def close(self, trace: Trace) -> Path:
        """Write the manifest of ``trace`` and the header; rename the file into place."""
        try:
            metadata, extra = _metadata(trace, STREAM_INLINE_LIMIT)
            for name, t in extra.items():
                self._append(name, t)
            head = self._header(metadata)
            if head is None:
                return self._rewrite(metadata)
            self._file.truncate(self._reserve + self._offset)  # a hole if nothing came
            self._file.seek(0)
            self._file.write(struct.pack("<Q", len(head)))
            self._file.write(head)
            self._file.close()
            os.replace(self._tmp, self.path)
        except OSError as e:
            self.abort()
            raise TraceFileError(f"cannot write {self.path}: {e.strerror or e}") from None
        except BaseException:
            self.abort()
            raise
        return self.path

    def _header(self, metadata: dict[str, str]) -> bytes | None:
        """Header bytes that end exactly where the reserve does (None: it does not fit).

        Data offsets count from the end of the header, and the values lie at the end of
        the reserve, so a padding entry covers the gap between the two; the header is
        then filled up with spaces (which JSON and safetensors allow) to the last byte.
        """
        limit = self._reserve - 8
        head = self._header_bytes(metadata, 0)
        if len(head) > limit:
            return None
        # moving every offset by the gap lengthens each entry by at most 16 digits
        slack = 256 + 16 * len(self._entries)
        gap = limit - len(head) - slack
        if gap > 0:
            gap -= gap % 8
            head = self._header_bytes(metadata, gap)
        else:
            gap = 0
        return head + b" " * (limit - gap - len(head))

    def _header_bytes(self, metadata: dict[str, str], gap: int) -> bytes:
        header: dict[str, Any] = {"__metadata__": _with_checksums(metadata, self._sums)}
        if gap:
            header[f"{PAD_PREFIX}__"] = {"dtype": "U8", "shape": [gap], "data_offsets": [0, gap]}
        for name, (code, shape, start, end) in self._entries.items():
            header[name] = {"dtype": code, "shape": shape, "data_offsets": [start + gap, end + gap]}
        head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return head + b" " * (-len(head) % 8)

    def _rewrite(self, metadata: dict[str, str]) -> Path:
        """The header outgrew the reserve: copy the data into a file with a larger one."""
        head = self._header_bytes(metadata, 0)
        self._file.close()
        final = _partial_name(self.path).with_suffix(".rewrite")
        try:
            with open(self._tmp, "rb") as src, open(final, "wb") as dst:
                dst.write(struct.pack("<Q", len(head)))
                dst.write(head)
                src.seek(self._reserve)
                shutil.copyfileobj(src, dst, 16 * 2**20)
            os.replace(final, self.path)
        except BaseException:
            final.unlink(missing_ok=True)
            raise
        finally:
            self._tmp.unlink(missing_ok=True)
        return self.path

    def abort(self) -> None:
        """Stop writing and remove the partial file."""
        with contextlib.suppress(OSError):
            self._file.close()
        self._tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- encode


def encode_manifest(trace: Trace) -> dict[str, Any]:
    """The manifest of ``trace`` (everything but the tensor values), ready for ``json``.

    Rows are tuples of field values (``json`` writes tuples as lists); only the nested
    records (source locations, stats) are flattened here.
    """
    sources: list[tuple[Any, ...]] = []
    source_index: dict[SourceLocation, int] = {}

    step_fields = [f.name for f in fields(Step)]
    source_at = step_fields.index("source")
    get_step = attrgetter(*step_fields)
    step_rows = []
    for s in trace.steps:
        row = list(get_step(s))
        src = row[source_at]
        if src is not None:
            i = source_index.get(src)
            if i is None:
                i = source_index[src] = len(sources)
                sources.append((src.file, src.line, src.text, src.function))
            row[source_at] = i
        step_rows.append(row)

    tensor_fields = [f.name for f in fields(TensorRecord)]
    stats_at = tensor_fields.index("stats")
    get_tensor = attrgetter(*tensor_fields)
    get_stats = attrgetter(*_STATS_FIELDS)
    tensor_rows = []
    for r in trace.tensors:
        row = list(get_tensor(r))
        if row[stats_at] is not None:
            row[stats_at] = get_stats(row[stats_at])
        tensor_rows.append(row)

    module_fields = [f.name for f in fields(ModuleInfo)]
    get_module = attrgetter(*module_fields)
    module_rows = [get_module(m) for m in trace.modules.values()]

    return {
        "format": FORMAT_NAME,
        "schema": SCHEMA_VERSION,
        "meta": _encode_value(trace.meta),
        "error": trace.error,
        "sources": sources,
        "steps": {"fields": step_fields, "rows": step_rows},
        "tensors": {"fields": tensor_fields, "rows": tensor_rows},
        "modules": {"fields": module_fields, "rows": module_rows},
        "stats_fields": list(_STATS_FIELDS),
        "failure": failure_to_json(trace.failure),
        "source_files": trace.sources,
    }


def check_trace(trace: Trace) -> None:
    """The cross-reference checks of ``load``, on the objects (cheap; run by ``save``)."""
    n_steps, n_tensors, modules = len(trace.steps), len(trace.tensors), trace.modules
    for i, r in enumerate(trace.tensors):
        if r.id != i:
            raise _Invalid(f"tensor record {i} has id {r.id}, expected {i}")
        if r.producer is not None and not 0 <= r.producer < n_steps:
            raise _Invalid(
                f"tensor record {i}: producer step {r.producer} is out of range "
                f"(the trace has {n_steps} steps)"
            )
        if r.grad_of is not None and not 0 <= r.grad_of < n_tensors:
            raise _Invalid(f"tensor record {i}: grad_of {r.grad_of} is out of range")
        if r.dims is not None and len(r.dims) != len(r.shape):
            raise _Invalid(
                f"tensor record {i} has {len(r.dims)} axis names for {len(r.shape)} axes"
            )
    for i, s in enumerate(trace.steps):
        if s.index != i:
            raise _Invalid(f"step {i} has index {s.index}, expected {i}")
        for name, ids in (("input", s.inputs), ("output", s.outputs)):
            for t in ids:
                if not 0 <= t < n_tensors:
                    raise _Invalid(
                        f"step {i}: {name} tensor id {t} is out of range "
                        f"(the trace has {n_tensors} tensors)"
                    )
        for name, ref in (("parent", s.parent), ("end", s.end), ("forward", s.forward)):
            if ref is not None and not 0 <= ref < n_steps:
                raise _Invalid(
                    f"step {i}: {name} step {ref} is out of range (the trace has {n_steps} steps)"
                )
        _check_nesting(trace.steps, s)
        if s.module not in modules:
            raise _Invalid(f"step {i}: module path {s.module!r} is not a module of the trace")
        if s.kind not in _STEP_KINDS:
            raise _Invalid(f"step {i}: kind {s.kind!r} is not one of {', '.join(_STEP_KINDS)}")
    for m in modules.values():
        if m.parent is not None and m.parent not in modules:
            raise _Invalid(f"module {m.path!r} names an unknown parent {m.parent!r}")
        for c in m.children:
            if c not in modules:
                raise _Invalid(f"module {m.path!r} names an unknown child {c!r}")


def _consistent(steps: dict[str, Any], tensors: dict[str, Any], modules: dict) -> bool:
    """Whether :func:`check_trace` would pass, decided on whole columns at once (numpy).

    ``steps`` and ``tensors`` map field names to decoded columns. The same rules, a
    few array operations each instead of a Python loop over 50,000 records; when this
    says False, ``check_trace`` runs to name the first record that breaks one.
    """
    n_steps, n_tensors = len(steps["index"]), len(tensors["id"])
    if not (_is_arange(tensors["id"]) and _is_arange(steps["index"])):
        return False
    for column, n in ((tensors["producer"], n_steps), (tensors["grad_of"], n_tensors)):
        if not _refs_in_range(column, n):
            return False
    if any(d is not None and len(d) != len(s) for d, s in zip(tensors["dims"], tensors["shape"])):
        return False
    for name in ("inputs", "outputs"):
        flat = list(chain.from_iterable(steps[name]))
        if flat and not (min(flat) >= 0 and max(flat) < n_tensors):
            return False
    if not set(steps["module"]) <= modules.keys() or not set(steps["kind"]) <= set(_STEP_KINDS):
        return False
    if not all(_refs_in_range(steps[name], n_steps) for name in ("parent", "end", "forward")):
        return False
    parent, end = _optional_ints(steps["parent"]), _optional_ints(steps["end"])
    index = np.arange(n_steps)
    depth = np.asarray(steps["depth"], dtype=np.int64)
    kind = np.asarray(steps["kind"], dtype=object)
    if n_steps and not (depth.min() >= 0 and depth.max() <= MAX_DEPTH):
        return False
    if ((end >= 0) & (end < index)).any():  # a call that ends before it starts
        return False
    root = parent < 0
    if (depth[root] != 0).any():
        return False
    child = np.flatnonzero(~root)
    up = parent[child]
    if (up >= child).any() or (kind[up] != "module").any():
        return False
    forward = kind[child] != "backward"
    child, up = child[forward], up[forward]
    if (depth[child] != depth[up] + 1).any():
        return False
    up_end = end[up]
    if ((up_end >= 0) & (child > up_end)).any():
        return False
    return all(
        (m.parent is None or m.parent in modules) and all(c in modules for c in m.children)
        for m in modules.values()
    )


def _is_arange(column: Any) -> bool:
    """``column`` is ``0, 1, 2, ...``."""
    return len(column) == 0 or np.array_equal(np.asarray(column), np.arange(len(column)))


def _optional_ints(column: Any) -> np.ndarray:
    """Whole numbers or None (-1), as an int64 array (values checked below 2**63 already)."""
    return np.array([-1 if v is None else v for v in column], dtype=np.int64)


def _refs_in_range(column: Any, n: int) -> bool:
    """Every value of ``column`` is None or in ``[0, n)``."""
    refs = [v for v in column if v is not None]
    return not refs or (min(refs) >= 0 and max(refs) < n)


def _check_nesting(steps: list[Step], s: Step) -> None:
    """A step's place in the call tree: its parent is an earlier module step whose call
    contains it, one level up; a module call ends at or after itself. (These make the
    tree a tree: no cycles, no unbounded chains, so every walk up it ends.) A backward
    step borrows its forward step's parent and depth, after that call has ended."""
    i = s.index
    if s.depth < 0 or s.depth > MAX_DEPTH:
        raise _Invalid(f"step {i} has depth {s.depth}, not between 0 and {MAX_DEPTH}")
    if s.end is not None and s.end < i:
        raise _Invalid(f"step {i} ends at step {s.end}, before it starts")
    if s.parent is None:
        if s.depth != 0:
            raise _Invalid(f"step {i} has depth {s.depth} but no parent (expected 0)")
        return
    if s.parent >= i:
        raise _Invalid(f"step {i}: parent step {s.parent} does not come before it")
    parent = steps[s.parent]
    if parent.kind != "module":
        raise _Invalid(f"step {i}: parent step {s.parent} is not a module call")
    if s.kind == "backward":
        return
    if s.depth != parent.depth + 1:
        raise _Invalid(
            f"step {i} has depth {s.depth} but its parent step {s.parent} has depth {parent.depth}"
        )
    if parent.end is not None and i > parent.end:
        raise _Invalid(f"step {i} lies after the end ({parent.end}) of its parent step {s.parent}")


def _json_default(v: Any) -> Any:
    """For ``json.dumps``: what JSON has no type for (graph attributes, numpy numbers)."""
    if hasattr(v, "__dataclass_fields__"):
        return {f: getattr(v, f) for f in v.__dataclass_fields__}
    if isinstance(v, (set, frozenset)):
        return sorted(v, key=str)
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (TypeError, ValueError):
            pass
    return str(v)


def _encode_value(v: Any) -> Any:
    """``meta`` to JSON, losslessly for tuples and non-string dict keys.

    A tuple becomes ``{"__tuple__": [...]}`` and a dict with a non-string key
    ``{"__items__": [[k, v], ...]}``, so ``load`` gives back an equal ``meta``. Anything
    that is not JSON data (a dtype, a device) is stored as its ``str``.
    """
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, tuple):
        return {"__tuple__": [_encode_value(x) for x in v]}
    if isinstance(v, list):
        return [_encode_value(x) for x in v]
    if isinstance(v, Mapping):
        if all(isinstance(k, str) for k in v) and not ({"__tuple__", "__items__"} & set(v)):
            return {k: _encode_value(x) for k, x in v.items()}
        return {"__items__": [[_encode_value(k), _encode_value(x)] for k, x in v.items()]}
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return _encode_value(v.item())
        except (TypeError, ValueError):
            pass
    return str(v)


def _decode_value(v: Any, depth: int = 0) -> Any:
    """The inverse of ``_encode_value``; raises ``_Invalid`` on what it never writes
    (nesting deeper than ``MAX_META_NESTING``, an ``__items__`` entry that is not a
    ``[key, value]`` pair or whose key cannot be a dict key)."""
    if depth > MAX_META_NESTING:
        raise _Invalid(f"the manifest's meta is nested deeper than {MAX_META_NESTING} levels")
    if isinstance(v, list):
        return [_decode_value(x, depth + 1) for x in v]
    if isinstance(v, dict):
        if len(v) == 1 and "__tuple__" in v and isinstance(v["__tuple__"], list):
            return tuple(_decode_value(x, depth + 1) for x in v["__tuple__"])
        if len(v) == 1 and "__items__" in v and isinstance(v["__items__"], list):
            out = {}
            for pair in v["__items__"]:
                if type(pair) is not list or len(pair) != 2:
                    raise _Invalid("the manifest's meta has an __items__ entry that is not a pair")
                key = _hashable(_decode_value(pair[0], depth + 1))
                try:
                    out[key] = _decode_value(pair[1], depth + 1)
                except TypeError:
                    raise _Invalid("the manifest's meta has a key that cannot be one") from None
            return out
        return {k: _decode_value(x, depth + 1) for k, x in v.items()}
    return v


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, (list, tuple)) else v


def _graph_data(trace: Trace) -> dict[str, Any] | None:
    """``node_link_data`` of the trace graph, made JSON-safe (None if no graph module)."""
    try:
        import networkx as nx

        graph = trace.graph
    except ImportError:  # the graph module is optional for the file format
        return None
    return nx.node_link_data(graph, edges="edges")


# --------------------------------------------------------------------------- load


def load(path: str | os.PathLike) -> Trace:
    """Open a trace file written by ``save``.

    Reads and checks the header only: the container's layout (``tracing.container``), the
    manifest, its structure (parents before their steps, depths and ends that agree, sizes
    within bounds), every cross-reference, and the shape and dtype of every stored tensor
    against its record. Tensor data stays on disk until ``trace.values[key]`` is asked
    for, and is checked against its checksum then. Raises ``TraceFileError`` naming the
    file and the problem for anything wrong, and never anything else.
    """
    path = Path(path)
    # Decoding builds many small lists and records at once; the cyclic garbage collector
    # would otherwise walk the growing heap again and again (several times the parse).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        container = Container(path)
    except ContainerError as e:
        raise TraceFileError(f"{path}: {e}") from None
    except (OSError, ValueError, MemoryError) as e:  # a path the OS cannot take, no memory
        raise TraceFileError(f"{path}: cannot read: {_reason(e)}") from None
    finally:
        if gc_was_enabled:
            gc.enable()

    gc.disable()
    try:
        container.attach_checksums()
        manifest = _read_manifest(container)
        stored = {k: (e.shape, e.dtype) for k, e in container.entries.items()}
        trace = _validate(manifest, stored)
        check_meta(trace.meta, steps=len(trace.steps), tensors=len(trace.tensors))
    except (_Invalid, ContainerError, MetaProblem) as e:
        container.close()
        raise TraceFileError(f"{path}: {e}") from None
    except RecursionError:
        container.close()
        raise TraceFileError(f"{path}: the manifest is nested too deeply") from None
    except MemoryError:
        container.close()
        raise TraceFileError(f"{path}: the manifest is too big to open in memory") from None
    except (TypeError, ValueError, KeyError, OverflowError) as e:  # a case no rule names
        container.close()
        raise TraceFileError(f"{path}: the manifest is malformed ({_reason(e)})") from None
    finally:
        if gc_was_enabled:
            gc.enable()

    value_keys = [k for k in container.entries if not k.startswith(RESERVED_PREFIX)]
    trace.values = LazyValues(path, container, value_keys)
    return trace


def _short(v: Any) -> str:
    """``repr(v)``, cut short: a hostile file's value may be megabytes long."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _reason(e: BaseException) -> str:
    return str(getattr(e, "strerror", None) or e or type(e).__name__)[:300]


def read_graph_data(path: str | os.PathLike) -> dict[str, Any] | None:
    """The stored ``node_link_data`` of a trace file's graph (None if it has none).

    ``networkx.node_link_graph(data, edges="edges")`` turns it back into a graph.
    """
    trace_path = Path(path)
    try:
        with Container(trace_path) as container:
            container.attach_checksums()
            if container.metadata.get("format") != FORMAT_NAME:
                raise TraceFileError(f"{trace_path}: not a Scratchformer trace")
            if "graph" in container.metadata:
                text = container.metadata["graph"]
            elif GRAPH_TENSOR in container.entries:
                text = _stored_text(container, GRAPH_TENSOR)
            else:
                return None
            return json.loads(text)
    except (ContainerError, _Invalid, ValueError, RecursionError, MemoryError) as e:
        if isinstance(e, TraceFileError):
            raise
        raise TraceFileError(f"{trace_path}: cannot read the graph: {_reason(e)}") from None


def _stored_text(container: Container, name: str) -> str:
    """A manifest or graph kept as a uint8 entry, as text (bounded, checked)."""
    entry = container.entries[name]
    if entry.dtype != "uint8" or len(entry.shape) != 1:
        raise _Invalid(f"entry {name!r} is not a 1-D uint8 tensor of JSON text")
    if entry.end - entry.start > MAX_MANIFEST_BYTES:
        raise _Invalid(
            f"entry {name!r} is {entry.end - entry.start:,} bytes, more than the "
            f"{MAX_MANIFEST_BYTES:,} this reads"
        )
    try:
        return bytes(container.read_bytes(name).numpy()).decode("utf-8")
    except UnicodeDecodeError:
        raise _Invalid(f"entry {name!r} is not UTF-8 text") from None


def _read_manifest(container: Container) -> dict[str, Any]:
    header = container.metadata
    if header.get("format") != FORMAT_NAME:
        raise _Invalid(
            "a safetensors file but not a Scratchformer trace (its metadata has no trace manifest)"
        )
    try:
        schema = int(header.get("schema", ""))
    except ValueError:
        raise _Invalid(f"schema version {header.get('schema')!r:.40} is not a number") from None
    if schema > SCHEMA_VERSION:
        raise _Invalid(
            f"written with trace schema version {schema}, but this Scratchformer reads "
            f"versions up to {SCHEMA_VERSION}; upgrade Scratchformer to open it"
        )
    if schema < 1:
        raise _Invalid(f"schema version {schema} is not valid")

    if "manifest" in header:
        text = header["manifest"]
        if len(text) > MAX_MANIFEST_BYTES:
            raise _Invalid(f"the manifest is longer than the {MAX_MANIFEST_BYTES:,} this reads")
    elif MANIFEST_TENSOR in container.entries:
        text = _stored_text(container, MANIFEST_TENSOR)
    else:
        raise _Invalid("the trace manifest is missing from the file")
    try:
        manifest = json.loads(text)
    except RecursionError:
        raise _Invalid("the trace manifest is nested too deeply") from None
    except ValueError as e:
        raise _Invalid(f"the trace manifest is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(manifest, dict):
        raise _Invalid("the trace manifest is not a JSON object")
    inner = manifest.get("schema", schema)
    if type(inner) is not int or inner > SCHEMA_VERSION or inner < 1:
        raise _Invalid(f"the manifest's schema version {inner!r:.40} is not one this reads")
    return manifest


# --------------------------------------------------------------------------- validate


class _Bad(Exception):
    """A field value of the wrong type (the caller names the record and field)."""


def _as_int(v: Any) -> int:
    if type(v) is not int or not -MAX_INT <= v <= MAX_INT:
        raise _Bad("a whole number")
    return v


def _as_opt_int(v: Any) -> int | None:
    if v is not None and (type(v) is not int or not -MAX_INT <= v <= MAX_INT):
        raise _Bad("a whole number or null")
    return v


def _as_str(v: Any) -> str:
    if type(v) is not str:
        raise _Bad("text")
    return v


def _as_opt_str(v: Any) -> str | None:
    if v is not None and type(v) is not str:
        raise _Bad("text or null")
    return v


def _as_int_tuple(v: Any) -> tuple[int, ...]:
    if type(v) is not list or not set(map(type, v)) <= {int}:
        raise _Bad("a list of whole numbers")
    if v and not -MAX_INT <= min(v) <= max(v) <= MAX_INT:
        raise _Bad("a list of whole numbers")
    return tuple(v)


def _as_size_tuple(v: Any) -> tuple[int, ...]:
    if type(v) is not list or len(v) > 64 or not set(map(type, v)) <= {int}:
        raise _Bad("a list of at most 64 sizes")
    if v and not 0 <= min(v) <= max(v) <= MAX_INT:
        raise _Bad("a list of sizes")
    return tuple(v)


def _as_str_tuple(v: Any) -> tuple[str, ...]:
    if type(v) is not list or not set(map(type, v)) <= {str}:
        raise _Bad("a list of text")
    return tuple(v)


def _as_opt_str_tuple(v: Any) -> tuple[str, ...] | None:
    return None if v is None else _as_str_tuple(v)


def _as_any(v: Any) -> Any:
    """A field this version has no rule for (added later with a default): lists as tuples."""
    return tuple(v) if type(v) is list else v


# converters whose whole job, for a column of these types, is the type check (and the
# integer range check :func:`_decode_column` does for the column at once)
_PLAIN_KINDS: dict[Any, set[type]] = {
    _as_int: {int},
    _as_opt_int: {int, type(None)},
    _as_str: {str},
    _as_opt_str: {str, type(None)},
}
# converters of lists of one element type, decoded a whole column at once
_LIST_KINDS: dict[Any, type] = {
    _as_int_tuple: int,
    _as_size_tuple: int,
    _as_str_tuple: str,
    _as_opt_str_tuple: str,
}


# field name -> converter, per record type; "source" and "stats" are decoded apart
_STEP_RULES = {
    "index": _as_int,
    "kind": _as_str,
    "module": _as_str,
    "op": _as_str,
    "inputs": _as_int_tuple,
    "outputs": _as_int_tuple,
    "input_names": _as_str_tuple,
    "output_names": _as_str_tuple,
    "depth": _as_int,
    "parent": _as_opt_int,
    "end": _as_opt_int,
    "call": _as_int,
    "error": _as_opt_str,
    "forward": _as_opt_int,
}
_TENSOR_RULES = {
    "id": _as_int,
    "shape": _as_size_tuple,
    "dtype": _as_str,
    "device": _as_str,
    "dims": _as_opt_str_tuple,
    "value_key": _as_opt_str,
    "producer": _as_opt_int,
    "role": _as_opt_str,
    "grad_of": _as_opt_int,
}
_MODULE_RULES = {
    "path": _as_str,
    "type": _as_str,
    "parent": _as_opt_str,
    "children": _as_str_tuple,
    "params": _as_int,
    "params_total": _as_int,
    "extra": _as_str,
}


def _decode_rows(
    manifest: dict[str, Any], table: str, cls: type, rules: dict[str, Any], what: str, special=None
) -> tuple[list[Any], dict[str, Any]]:
    """Rows of one manifest table -> ``cls`` objects, every field type-checked, and the
    decoded columns by field name (for the checks across records).

    Fields are matched by name (a file may list them in any order; unknown ones are
    ignored; missing ones take the dataclass default or are an error if it has none).
    ``special`` maps a field name to a whole-column decoder ``(column) -> list`` for
    nested records (raising ``_Bad`` on a bad value).
    """
    t = manifest.get(table)
    if not isinstance(t, dict):
        raise _Invalid(f"the manifest has no {table} table")
    names, rows = t.get("fields"), t.get("rows")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _Invalid(f"the {table} table has no list of field names")
    if not isinstance(rows, list):
        raise _Invalid(f"the {table} table has no rows")
    if len(rows) > MAX_RECORDS:
        raise _Invalid(f"the {table} table has more than {MAX_RECORDS:,} rows")
    special = special or {}
    plan = []  # (field name, column or None, column decoder, default)
    for f in fields(cls):
        decode = special.get(f.name) or partial(_decode_column, rules.get(f.name, _as_any))
        if f.name in names:
            plan.append((f.name, names.index(f.name), decode, None))
        elif f.default is not MISSING_FIELD:
            plan.append((f.name, None, None, f.default))
        else:
            raise _Invalid(f"the {table} table has no {f.name!r} field")
    width = len(names)
    if not set(map(type, rows)) <= {list} or not set(map(len, rows)) <= {width}:
        i = next(i for i, r in enumerate(rows) if type(r) is not list or len(r) != width)
        raise _Invalid(f"row {i} of the {table} table does not have {width} fields")
    # column by column: a whole column of plain ints or strings is checked in one C-speed
    # pass (a 50,000-step trace loads in a fraction of the per-value time)
    columns = list(zip(*rows)) if rows else [() for _ in names]
    try:
        decoded = [
            repeat(default, len(rows)) if col is None else decode(columns[col])
            for _, col, decode, default in plan
        ]
    except _Bad:
        _raise_first_bad(rows, plan, what)
    names = [name for name, *_ in plan]
    by_name = {
        name: column if col is not None else [default] * len(rows)
        for (name, col, _, default), column in zip(plan, decoded)
    }
    return _build(cls, names, decoded, len(rows)), by_name


def _build(cls: type, names: list[str], columns: list, n: int) -> list[Any]:
    """``n`` frozen dataclass objects from checked columns, without calling ``__init__``.

    Equal to ``list(map(cls, *columns))`` (the records hold no ``__post_init__``), in
    about half the time: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, here each object gets its finished ``__dict__`` at once.
    """
    objects = list(map(object.__new__, repeat(cls, n)))
    dicts = map(dict, map(zip, repeat(names), zip(*columns)))
    deque(map(object.__setattr__, objects, repeat("__dict__"), dicts), maxlen=0)
    return objects


def _decode_column(convert, column: tuple) -> Any:
    """``convert`` applied to every value of ``column``, with whole-column fast paths.

    A column of plain scalars, or of lists of plain ints or strings, is checked by a few
    passes in C (types as a set, one min/max) instead of a Python call per value; anything
    else, or anything that fails the fast check, goes through ``convert`` value by value
    (which names the first bad one).
    """
    kinds = set(map(type, column))
    allowed = _PLAIN_KINDS.get(convert)
    if allowed is not None and kinds <= allowed:
        if int not in kinds:
            return column
        numbers = column if kinds == {int} else [v for v in column if type(v) is int]
        if _in_range(numbers, -MAX_INT):
            return column
    element = _LIST_KINDS.get(convert)
    optional = convert is _as_opt_str_tuple and type(None) in kinds
    lists = [v for v in column if v is not None] if optional else column
    if element is not None and (kinds - {type(None)} if optional else kinds) <= {list}:
        flat = list(chain.from_iterable(lists))
        ok = set(map(type, flat)) <= {element}
        if ok and element is int:
            ok = _in_range(flat, 0 if convert is _as_size_tuple else -MAX_INT)
        if ok and convert is _as_size_tuple:
            ok = max(map(len, column), default=0) <= 64
        if ok and optional:
            return [None if v is None else tuple(v) for v in column]
        if ok:
            return list(map(tuple, column))
    return list(map(convert, column))


def _in_range(numbers, low: int) -> bool:
    return not numbers or (min(numbers) >= low and max(numbers) <= MAX_INT)


def _raise_first_bad(rows: list, plan: list, what: str) -> None:
    """The slow path for an error message: the first row and field that fails."""
    for i, row in enumerate(rows):
        for name, col, decode, _ in plan:
            if col is None:
                continue
            try:
                decode((row[col],))
            except _Bad as e:
                raise _Invalid(f"{what} {i}: {name} {row[col]!r} is not {e}") from None
    raise AssertionError("no bad value found")  # pragma: no cover


def _validate(
    manifest: dict[str, Any], stored: dict[str, tuple[tuple[int, ...], str]] | None
) -> Trace:
    """Decode the manifest into a Trace, checking types and every cross-reference.

    ``stored`` gives the shape and dtype of the file's entries (None: do not check them).
    """
    raw_sources = manifest.get("sources", [])
    if not isinstance(raw_sources, list):
        raise _Invalid("the manifest's sources is not a list")
    if len(raw_sources) > MAX_RECORDS:
        raise _Invalid(f"the manifest has more than {MAX_RECORDS:,} sources")
    sources = [_source(row, i) for i, row in enumerate(raw_sources)]
    meta = manifest.get("meta", {})
    if not isinstance(meta, dict):
        raise _Invalid("the manifest's meta is not a JSON object")
    meta = _decode_value(meta)
    error = manifest.get("error")
    if error is not None and not isinstance(error, str):
        raise _Invalid("the manifest's error is not text")

    module_list, _ = _decode_rows(manifest, "modules", ModuleInfo, _MODULE_RULES, "module record")
    modules = {m.path: m for m in module_list}
    if len(modules) != len(module_list):
        raise _Invalid("a module path is listed twice in the modules table")

    stats_names = manifest.get("stats_fields", list(_STATS_FIELDS))
    if (
        not isinstance(stats_names, list)
        or not all(type(n) is str for n in stats_names)
        or len(set(stats_names)) != len(stats_names)
    ):
        raise _Invalid("the manifest's stats_fields is not a list of distinct names")

    tensors, tensor_columns = _decode_rows(
        manifest, "tensors", TensorRecord, _TENSOR_RULES, "tensor record",
        {"stats": partial(_stats_column, names=stats_names)},
    )  # fmt: skip
    as_source = partial(_source_column, sources=sources)
    steps, step_columns = _decode_rows(
        manifest, "steps", Step, _STEP_RULES, "step", {"source": as_source}
    )
    try:
        failure = failure_from_json(manifest.get("failure"), len(steps))
        embedded = sources_from_json(manifest.get("source_files"))
    except ValueError as e:
        raise _Invalid(str(e)) from None
    trace = Trace(
        steps=steps, modules=modules, tensors=tensors, meta=meta, error=error,
        failure=failure, sources=embedded,
    )  # fmt: skip
    if not _consistent(step_columns, tensor_columns, modules):
        check_trace(trace)  # names the first record that breaks a rule
    if stored is not None:
        for rec in tensors:
            if rec.value_key is not None:
                _check_stored(rec, stored, meta, f"tensor record {rec.id}")
    return trace


def _check_stored(
    rec: TensorRecord,
    stored: dict[str, tuple[tuple[int, ...], str]],
    meta: dict[str, Any],
    where: str,
) -> None:
    key = rec.value_key
    spec = stored.get(key)  # type: ignore[arg-type]
    if spec is None or key.startswith(RESERVED_PREFIX):  # type: ignore[union-attr]
        raise _Invalid(f"{where} names tensor {key!r}, which is not in the file")
    shape, dtype = spec
    if shape != rec.shape:
        raise _Invalid(
            f"tensor {key!r} is stored with shape {list(shape)} but its record ({where}) "
            f"says {list(rec.shape)}"
        )
    if dtype != rec.dtype:
        value_dtype = meta.get("value_dtype")
        downcast = isinstance(value_dtype, str) and _is_floating(rec.dtype) and _is_floating(dtype)
        if not downcast or dtype != value_dtype.removeprefix("torch."):
            raise _Invalid(
                f"tensor {key!r} is stored as {dtype} but its record ({where}) says {rec.dtype}"
            )


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _source(row: Any, i: int) -> SourceLocation:
    if (
        type(row) is not list
        or len(row) != 4
        or type(row[0]) is not str
        or type(row[1]) is not int
        or type(row[2]) is not str
        or type(row[3]) is not str
    ):
        raise _Invalid(f"source entry {i} is not [file, line, text, function]")
    return SourceLocation(file=row[0], line=row[1], text=row[2], function=row[3])


def _source_column(column: tuple, sources: list[SourceLocation]) -> list:
    """A steps table's source column (indices into the source table, or null) as
    ``SourceLocation`` objects (shared, one per source)."""
    if not set(map(type, column)) <= {int, type(None)}:
        raise _Bad("an entry of the source table")
    table: dict[int | None, SourceLocation | None] = dict(enumerate(sources))
    table[None] = None
    try:
        return list(map(table.__getitem__, column))
    except KeyError:
        raise _Bad("an entry of the source table") from None


def _stats_column(column: tuple, names: list[str]) -> list:
    """A tensors table's stats column (a list of numbers per row, in the order of the
    manifest's ``stats_fields``, or null) as ``TensorStats``, checked a field at a time;
    a column with anything unusual goes value by value (:func:`_stats` names the bad one)."""

    def one_by_one() -> list:
        return [None if v is None else _stats(v, names) for v in column]

    present = [v for v in column if v is not None]
    if not set(_STATS_FIELDS) <= set(names) or not set(map(type, present)) <= {list}:
        return one_by_one()
    if not set(map(len, present)) <= {len(names)}:
        return one_by_one()
    by_name = dict(zip(names, zip(*present))) if present else dict.fromkeys(names, ())
    values = []
    for name in _STATS_FIELDS:
        col = by_name[name]
        kinds = set(map(type, col))
        if name in ("nan", "inf"):  # counts
            if not kinds <= {int} or not _in_range(col, 0):
                return one_by_one()
        else:
            if not kinds <= {float, int}:
                return one_by_one()
            if int in kinds:
                if not _in_range([v for v in col if type(v) is int], -MAX_INT):
                    return one_by_one()
                col = list(map(float, col))
        values.append(col)
    built = _build(TensorStats, list(_STATS_FIELDS), values, len(present))
    if len(built) == len(column):
        return built
    it = iter(built)
    return [None if v is None else next(it) for v in column]


def _stats(v: Any, names: Any) -> TensorStats:
    if type(v) is not list or not isinstance(names, list) or len(v) != len(names):
        raise _Bad(f"a list of {len(_STATS_FIELDS)} numbers")
    d = dict(zip(names, v))
    try:
        mn, mx, mean, std, nan, inf = (d[k] for k in _STATS_FIELDS)
    except KeyError:
        raise _Bad("a complete set of stats") from None
    for x in (mn, mx, mean, std):
        if type(x) is not float and (type(x) is not int or not -MAX_INT <= x <= MAX_INT):
            raise _Bad("a list of numbers")
    for n in (nan, inf):
        if type(n) is not int or not 0 <= n <= MAX_INT:
            raise _Bad("stats with whole-number NaN and Inf counts")
    return TensorStats(float(mn), float(mx), float(mean), float(std), nan, inf)


# --------------------------------------------------------------------------- lazy values


class LazyValues(Mapping):
    """Read-only ``value_key -> tensor`` mapping backed by an open safetensors file.

    A tensor is read from disk the first time it is asked for (and checked against its
    checksum, and against the file having changed since it was opened: both raise
    ``TraceFileError``); the last ``VALUE_CACHE_SIZE`` tensors read (up to
    ``VALUE_CACHE_BYTES``) stay in memory, and so does any value the caller still holds:
    asked for again, it is that same tensor, never a second copy. The mapping holds the
    file open (a plain descriptor, never memory-mapped, so a file replaced underneath
    cannot crash the process) until ``close()`` or until it is garbage-collected. Safe to
    use from several threads.
    """

    def __init__(self, path: Path, handle: Any, keys: list[str], cache_size: int | None = None):
        self.path = path
        self._handle = handle
        self._keys = keys
        self._key_set = frozenset(keys)
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._cached_bytes = 0
        self._cache_size = VALUE_CACHE_SIZE if cache_size is None else cache_size
        self._alive: weakref.WeakValueDictionary[str, torch.Tensor] = (
            weakref.WeakValueDictionary()
        )  # every value read that someone still holds
        self._spares = _SpareMemory()
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._key_set:
            raise KeyError(key)
        with self._lock:
            t = self._cache.get(key)
            if t is not None:
                self._cache.move_to_end(key)
                return t
            if self._handle is None:
                raise TraceFileError(f"{self.path}: the trace file was closed")
            t = self._alive.get(key)
            if t is None:
                try:
                    out = self._spares.take(self._handle.entries[key])
                    t = self._handle.get_tensor(key, out)
                except (ContainerError, OSError) as e:
                    raise TraceFileError(f"{self.path}: cannot read tensor {key!r}: {e}") from None
                self._alive[key] = t
            self._cache[key] = t
            self._cached_bytes += _nbytes(t)
            while len(self._cache) > 1 and (
                len(self._cache) > self._cache_size or self._cached_bytes > VALUE_CACHE_BYTES
            ):
                box = [self._cache.popitem(last=False)[1]]
                self._cached_bytes -= _nbytes(box[0])
                self._spares.keep(box)
            return t

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._key_set

    def close(self) -> None:
        """Forget cached tensors and release the file."""
        with self._lock:
            self._cache.clear()
            self._cached_bytes = 0
            self._alive = weakref.WeakValueDictionary()
            self._spares = _SpareMemory()
            handle, self._handle = self._handle, None
        if handle is not None and hasattr(handle, "close"):
            handle.close()

    def __repr__(self) -> str:
        return f"LazyValues({str(self.path)!r}, {len(self)} tensors, {len(self._cache)} cached)"


SPARE_BYTES = 64 * 2**20
"""Most bytes of memory a loaded trace keeps, from values its cache let go, to read
other values into."""

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


class _SpareMemory:
    """Memory of values the cache let go that nobody else holds, to read the next values
    of the same size into.

    Reading every value of a trace once (a full load, an export) would otherwise put each
    one on freshly mapped pages, which the kernel must zero first: the cache holds up to
    ``VALUE_CACHE_SIZE`` values, so the allocator rarely has a freed block of the right
    size, and gives large blocks back to the system. (That cost ~40% of a full load.)

    A value's memory is reused only when nothing outside this mapping refers to it any
    more: no tensor or view (the storage's use count, which counts every tensor and
    storage object on it, is 1) and no Python reference to its storage object (torch
    keeps one storage object per storage, so a caller's ``t.untyped_storage()`` is the
    very object seen here; its reference count must be the one a storage nobody holds
    has, measured once the same way)."""

    _alone: tuple[int, int] | None = None  # (use count, reference count) of an unheld one

    def __init__(self) -> None:
        self._kept: list[torch.UntypedStorage] = []  # oldest first; a few dozen at most
        self._bytes = 0

    def keep(self, box: list[torch.Tensor]) -> None:
        """Keep the memory of the one tensor in ``box`` (the caller's other reference to
        it already dropped) for reuse if nothing else refers to it; else let it go."""
        if _storage_use_count is None or box[0].device.type != "cpu":
            return
        if _SpareMemory._alone is None:
            _SpareMemory._alone = _counts([torch.empty(8, dtype=torch.uint8)])[1:]
        storage, *counts = _counts(box)
        n = storage.nbytes()
        if tuple(counts) != _SpareMemory._alone or not 0 < n <= SPARE_BYTES:
            return
        self._kept.append(storage)
        self._bytes += n
        while self._bytes > SPARE_BYTES:
            self._bytes -= self._kept.pop(0).nbytes()

    def take(self, entry: Any) -> torch.Tensor | None:
        """A uint8 tensor over kept memory of exactly ``entry``'s size, or None."""
        n = entry.end - entry.start
        for i in range(len(self._kept) - 1, -1, -1):  # the newest first: likely still cached
            storage = self._kept[i]
            if storage.nbytes() == n:
                del self._kept[i]
                self._bytes -= n
                return torch.empty(0, dtype=torch.uint8).set_(storage)
        return None


def _counts(box: list[torch.Tensor]) -> tuple[torch.UntypedStorage, int, int]:
    """The storage of the tensor taken out of ``box`` (so the tensor itself is gone
    unless someone else holds it), with its use count and Python reference count."""
    storage = box.pop().untyped_storage()
    return storage, _storage_use_count(storage._cdata), sys.getrefcount(storage)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
