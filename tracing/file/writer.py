"""The streaming writer: a trace file written while the trace records."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import struct
import threading
from pathlib import Path
from typing import Any

import torch

from tracing.errors import TraceFileError
from tracing.file.crc32 import crc32
from tracing.file.journal import journal_of, streaming_name, write_journal
from tracing.file.layout import FORMAT_NAME, RESERVED_PREFIX, TORCH_DTYPES
from tracing.file.manifest import encode_manifest, json_default
from tracing.file.saving import dtype_name, header_metadata, partial_name, with_checksums
from tracing.record import (
    SCHEMA_VERSION,
    Trace,
)

# --------------------------------------------------------------------------- streaming writer

HEADER_RESERVE = 2 * 2**20
"""Bytes a streamed file keeps free at its start for the header. The unused part is a
hole (no disk space on the usual file systems) covered by a padding entry."""

STREAM_INLINE_LIMIT = 2**20
"""A streamed file keeps a manifest or graph up to this many characters in its header;
larger ones become entries after the data (the header must fit ``HEADER_RESERVE``)."""

HEADER_ROOM = 256 * 2**10
"""Bytes at the start of the reserve written (zeros) when the file opens, and grown at
each checkpoint to a few times the journal's size: the room the header will take, held
on disk from the start, so that a disk that fills while values stream still has room
for the header of what was written (a hole would need new blocks exactly then)."""

PAD_PREFIX = f"{RESERVED_PREFIX}_pad"


def can_store(dtype: torch.dtype) -> bool:
    """Whether a trace file can hold values of ``dtype`` (safetensors has no complex128,
    no quantized types...)."""
    return str(dtype).removeprefix("torch.") in TORCH_DTYPES


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

    The file is written under a temporary, visible name (``NAME.PID-TID.partial``) and
    renamed into place by ``close``: a capture that is interrupted (or ``abort``-ed)
    never leaves a complete-looking file. If the header outgrows its reserve, ``close``
    rewrites the file once, with room. A ``close`` that fails (a full disk, a size limit,
    Ctrl-C or SIGTERM) keeps what was written: see :meth:`_keep`.

    ``checkpoint(trace)`` keeps a journal beside it (``NAME.PID-TID.journal``, see
    :mod:`tracing.file.journal`): the entries written so far and the manifest of
    ``trace``, so that a process killed outright leaves a file ``tracing.load`` opens as
    a partial trace up to the last checkpoint. ``close`` and ``abort`` remove it.
    """

    def __init__(self, path: str | os.PathLike, reserve: int = HEADER_RESERVE):
        self.path = Path(path)
        partial_name(self.path)  # (checks the folder and what the path is now)
        self._tmp = streaming_name(self.path, os.getpid(), threading.get_ident())
        self._journal = journal_of(self._tmp)
        self.checkpoints = 0
        self._reserve = reserve + (-reserve % 8)
        self._entries: dict[str, tuple[str, list[int], int, int]] = {}  # offsets from data
        self._offset = 0  # bytes of data written so far
        self._pads = 0
        self._sums: dict[str, str] = {}  # entry -> CRC-32 of its bytes as written (8 hex)
        self._room = 0  # bytes at the start of the reserve held on disk (HEADER_ROOM)
        try:
            # unbuffered: after a failed write the file holds exactly the values before it
            # (a buffer would hold back some of theirs, to fail later under their names)
            self._file = open(self._tmp, "wb", buffering=0)  # noqa: SIM115 - see close/abort
            self._hold_room(HEADER_ROOM)
            self._file.seek(self._reserve)
        except OSError as e:  # nothing recorded yet: nothing to keep
            self.abort()
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
        code = TORCH_DTYPES.get(dtype_name(t))
        if code is None:
            raise TraceFileError(
                f"cannot write {self.path}: value {name!r} has dtype {t.dtype}, which "
                "safetensors cannot store"
            )
        if type(t) is not torch.Tensor or not t.is_contiguous():
            # a subclass (an async collective's output) only has its data after a torch
            # op waits for it: copy through one
            plain = torch.empty(t.shape, dtype=t.dtype)
            plain.copy_(t)
            t = plain
        nbytes = t.numel() * t.element_size()
        try:
            gap = -self._offset % t.element_size()
            if gap:
                self._pad(gap)
            if nbytes:
                data = _memory_of(t)
                self._sums[name] = f"{crc32(data):08x}"
                self._write(data)
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
        if at is None:
            self._write(bytes(nbytes))
            self._offset += nbytes
        self._entries[f"{PAD_PREFIX}{self._pads}__"] = ("U8", [nbytes], start, start + nbytes)
        self._pads += 1

    def _write(self, data) -> None:
        """All of ``data`` at the file's position (an unbuffered file may take part)."""
        view = memoryview(data).cast("B")
        while view:
            n = self._file.write(view)
            if not n:
                raise OSError(errno.EIO, "the file takes no more bytes")
            view = view[n:]

    def close(self, trace: Trace) -> Path:
        """Write the manifest of ``trace`` and the header; rename the file into place.

        When that fails, what was written is kept (:meth:`_keep`) and the path it is at
        set as ``.kept`` on the exception: a write error (a full disk, a size limit)
        raises ``TraceFileError`` naming that path (none when everything fitted after
        all); Ctrl-C, SIGTERM or an exit go on up as they are."""
        values = len(self._entries)  # what the forward wrote; the manifest comes after
        try:
            metadata, extra = header_metadata(trace, STREAM_INLINE_LIMIT)
            for name, t in extra.items():
                self._append(name, t)
            head = self._header(metadata)
            if head is None:
                return self._rewrite(metadata)
            self._file.truncate(self._reserve + self._offset)  # a hole if nothing came
            self._file.seek(0)
            self._write(struct.pack("<Q", len(head)) + head)
            self._file.close()
            os.replace(self._tmp, self.path)
            self._journal.unlink(missing_ok=True)
        except BaseException as e:
            kept = self._keep(trace, values)
            if not isinstance(e, (OSError, TraceFileError)):
                e.kept = kept  # type: ignore[attr-defined]
                raise
            if kept == self.path:  # the manifest fitted in the header after all
                return self.path
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            why = why.removeprefix(f"cannot write {self.path}: ")  # (from _append)
            where = (
                f"what was recorded is kept in {kept} (it opens as a partial trace)"
                if kept is not None
                else "nothing could be kept (no room even for its index)"
            )
            err = TraceFileError(f"cannot write {self.path}: {why.split('; ')[0]}; {where}")
            err.kept = kept  # type: ignore[attr-defined]
            raise err from None
        return self.path

    def _keep(self, trace: Trace, values: int) -> Path | None:
        """After a ``close`` that failed: keep the values that were written whole (the
        first ``values`` entries), with the manifest of ``trace``, and return where.

        First as a finished file at ``path``: the header, everything inline, written
        into the reserve (whose start is held on disk, see ``HEADER_ROOM``). Where it
        does not fit (or cannot be written), the streamed file stays as it is with a
        journal that describes it (``tracing.load`` opens it as a partial trace); where
        not even that can be written, the last checkpoint's journal; and with none, the
        file is removed (nothing could place its bytes) and None returned.
        """
        with contextlib.suppress(Exception):
            self._file.close()  # a failed flush is cut off below
        if not self._tmp.exists():  # renamed into place already: it is finished
            self._journal.unlink(missing_ok=True)
            return self.path if self.path.exists() else None
        for name in list(self._entries)[values:]:
            del self._entries[name]
            self._sums.pop(name, None)
        self._offset = max((e[3] for e in self._entries.values()), default=0)
        try:
            metadata, extra = header_metadata(trace, self._reserve)
            head = None if extra else self._header(metadata)
            with open(self._tmp, "r+b") as f:
                f.truncate(self._reserve + self._offset)
                if head is not None:
                    f.write(struct.pack("<Q", len(head)))
                    f.write(head)
            if head is not None:
                os.replace(self._tmp, self.path)
                self._journal.unlink(missing_ok=True)
                return self.path
        except Exception:  # (Ctrl-C again: goes on up, the file left as it is)
            pass
        try:
            text = json.dumps(
                encode_manifest(trace), separators=(",", ":"), ensure_ascii=False,
                default=json_default,
            )  # fmt: skip
            metadata = {"format": FORMAT_NAME, "schema": str(SCHEMA_VERSION), "manifest": text}
            entries = {name: list(spec) for name, spec in self._entries.items()}
            write_journal(
                self._journal, self._reserve, entries, with_checksums(metadata, self._sums)
            )
        except Exception:
            pass
        if self._journal.exists():
            return self._tmp
        self._tmp.unlink(missing_ok=True)
        return None

    def _hold_room(self, nbytes: int) -> None:
        """Write zeros over the start of the reserve up to ``nbytes`` (see HEADER_ROOM)."""
        nbytes = min(nbytes, self._reserve - 8)
        if nbytes <= self._room:
            return
        at = self._file.tell()
        try:
            self._file.seek(self._room)
            self._write(bytes(nbytes - self._room))
        finally:
            self._file.seek(at)  # (a full disk: the values go on where they were)
        self._room = nbytes

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
        header: dict[str, Any] = {"__metadata__": with_checksums(metadata, self._sums)}
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
        final = partial_name(self.path).with_suffix(".rewrite")
        try:
            with open(self._tmp, "rb") as src, open(final, "wb") as dst:
                dst.write(struct.pack("<Q", len(head)))
                dst.write(head)
                src.seek(self._reserve)
                shutil.copyfileobj(src, dst, 16 * 2**20)
            os.replace(final, self.path)
        except BaseException:
            final.unlink(missing_ok=True)  # the streamed file stays: close keeps it
            raise
        self._tmp.unlink(missing_ok=True)
        self._journal.unlink(missing_ok=True)
        return self.path

    def checkpoint(self, trace: Trace) -> None:
        """Journal the entries written so far with the manifest of ``trace`` (the steps
        recorded up to now; its values must all be written already): the data is flushed
        first, then the journal replaced by an atomic rename. A failure to write it (a
        full disk) is left for the next value's write to name."""
        text = json.dumps(
            encode_manifest(trace), separators=(",", ":"), ensure_ascii=False,
            default=json_default,
        )  # fmt: skip
        metadata = {"format": FORMAT_NAME, "schema": str(SCHEMA_VERSION), "manifest": text}
        entries = {name: list(spec) for name, spec in self._entries.items()}
        try:
            size = write_journal(
                self._journal, self._reserve, entries, with_checksums(metadata, self._sums)
            )
            self._hold_room(3 * size)  # the header will hold the graph too
        except OSError:
            return
        self.checkpoints += 1

    def abort(self) -> None:
        """Stop writing and remove the partial file."""
        with contextlib.suppress(OSError, AttributeError):  # (not opened at all)
            self._file.close()
        self._tmp.unlink(missing_ok=True)
        self._journal.unlink(missing_ok=True)
