"""The safetensors container of a trace file, read defensively.

A trace file may come from anyone, so nothing in it is trusted before it is checked, and
reading it never blocks, never maps memory and never reads more than the file's own
layout allows:

- only a regular file is opened (a FIFO, a device or a socket is refused by ``stat``
  before ``open``, and ``open`` is non-blocking so a FIFO swapped in between cannot
  hang the caller either);
- the header is bounded (``MAX_HEADER_BYTES``, ``MAX_ENTRIES``) and every entry is
  checked the way safetensors checks it: a known dtype, sizes that agree with the byte
  range, byte ranges that tile the data section exactly;
- values are read with ``pread`` into fresh memory, never memory-mapped: a file replaced
  or truncated underneath an open trace gives a clear :class:`ContainerError` (the size
  or modification time changed, or a read came back short), never a ``SIGBUS``;
- each entry may carry a CRC-32 (``checksums`` in the header's ``__metadata__``, written
  by :func:`tracing.trace_file.write_safetensors`), verified on the first read of that
  entry from this open file, so a flipped byte or swapped offsets is an error rather
  than a wrong heatmap. A later read of the same entry (its copy was dropped from a
  cache) is not checked again: the file is the same one (size and modification time are
  checked on every read). Files without checksums (older writers, plain safetensors)
  still open; their values are read unverified.

Reading is ``preadv`` straight into the tensor's own memory, in ``PIECE``s each
checksummed (:mod:`tracing.crc32`: the zlib-ng wheel, else zlib) right after it
is read, while it is still in the CPU's cache; an entry of ``SPLIT_MIN`` bytes or more is
read by the calling thread and a helper thread together (:class:`_SharedRead`), their
CRC-32 combined. Both calls release the GIL. What checking still costs, and why: see
``_SharedRead``.

``Container`` knows nothing of traces: :mod:`tracing.trace_file` builds on it.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tracing.file import crc32

if TYPE_CHECKING:  # pragma: no cover - torch is imported by the reads that make tensors
    import torch

MAX_HEADER_BYTES = 100_000_000
"""Largest header accepted (safetensors' own limit)."""

MAX_ENTRIES = 250_000
"""Most entries a header may list; a big ``values`` trace holds a few thousand."""

CHECKSUM_KEY = "checksums"
"""``__metadata__`` key holding ``{"algorithm": "crc32", "entries": {name: "8 hex"}}``."""

CHECKSUM_ALGORITHM = "crc32"

PIECE = 512 * 1024
"""Bytes read at a time from an entry whose checksum is checked: each piece is
checksummed right after it is read, while it is still in the CPU's cache."""

SPLIT_MIN = 512 * 1024
"""Entries of at least this many bytes are read by two threads at once (below it, handing
work to the helper thread costs more than it saves)."""

# safetensors dtype code -> (torch dtype name, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "C64": ("complex64", 8),
}


class ContainerError(Exception):
    """The file is not a readable safetensors container (the message says why)."""


class Entry(NamedTuple):
    """One stored tensor: dtype (torch name), shape and absolute byte range in the file.
    (A named tuple: a header may list hundreds of thousands, and it builds fastest.)"""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int
    checksum: int | None = None


# --------------------------------------------------------------------------- opening


def open_regular_file(path: Path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file.

    Raises ``ContainerError`` naming the problem: missing, a folder, a FIFO or device,
    unreadable, a name too long. Never blocks.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ContainerError("no such file") from None
    except OSError as e:
        raise ContainerError(f"cannot read: {e.strerror or e}") from None
    _require_regular(info)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ContainerError(f"cannot read: {e.strerror or e}") from None
    try:
        _require_regular(os.fstat(fd))  # it may have been swapped since the stat
    except BaseException:
        os.close(fd)
        raise
    return fd


def _require_regular(info: os.stat_result) -> None:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise ContainerError("is a folder, not a trace file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ContainerError(f"is {kind}, not a regular file; refused")


# --------------------------------------------------------------------------- the container


class Container:
    """An open safetensors file: ``metadata``, ``entries``, and reads that check.

    Holds one file descriptor until :meth:`close`. Safe to read from several threads
    (``pread`` has no shared file position).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = open_regular_file(self.path)
        self._lock = threading.Lock()
        self._verified: set[str] = set()  # entries whose checksum held, read from this file
        try:
            info = os.fstat(self._fd)
            self._identity = _identity(info)
            self.metadata, self.entries = self._read_header(info.st_size)
        except BaseException:
            self.close()
            raise

    # ---- header

    def _read_header(self, size: int) -> tuple[dict[str, str], dict[str, Entry]]:
        if size < 8:
            raise ContainerError(_truncated(f"{size} bytes, less than a header length"))
        (length,) = struct.unpack("<Q", self._pread(0, 8))
        if length > MAX_HEADER_BYTES:
            if 8 + length > size:
                raise ContainerError(_truncated(f"header length {length} is beyond its end"))
            raise ContainerError(
                f"its header is {length:,} bytes, more than the {MAX_HEADER_BYTES:,} allowed"
            )
        if 8 + length > size:
            raise ContainerError(_truncated(f"header length {length} is beyond its end"))
        raw = self._pread(8, length)
        if raw.count(b'"data_offsets"') > MAX_ENTRIES:
            raise ContainerError(f"its header lists more than {MAX_ENTRIES:,} entries")
        try:
            header = json.loads(raw)
        except RecursionError:
            raise ContainerError("its header is nested too deeply") from None
        except (UnicodeDecodeError, ValueError) as e:
            raise ContainerError(f"not a safetensors file (the header is not JSON: {e})") from None
        if not isinstance(header, dict):
            raise ContainerError("not a safetensors file (the header is not a JSON object)")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise ContainerError("its __metadata__ is not a map of text to text")
        base = 8 + length
        entries = {name: _entry(name, spec, base) for name, spec in header.items()}
        _check_tiling(entries, size - base, base)
        return metadata, entries

    def attach_checksums(self) -> None:
        """Read the ``checksums`` metadata (if any) into the entries; check its form."""
        text = self.metadata.get(CHECKSUM_KEY)
        if text is None:
            return
        try:
            data = json.loads(text)
        except (RecursionError, ValueError):
            raise ContainerError("its checksums are not valid JSON") from None
        sums = data.get("entries") if isinstance(data, dict) else None
        if data.get("algorithm") != CHECKSUM_ALGORITHM or not isinstance(sums, dict):
            raise ContainerError("its checksums are not a crc32 table")
        for name, value in sums.items():
            entry = self.entries.get(name)
            if entry is None:  # a reader of the entries says what is missing, and better
                continue
            if type(value) is not str or len(value) != 8:
                raise ContainerError(f"the checksum of {name!r} is not 8 hex digits")
            try:
                crc = int(value, 16)
            except ValueError:
                raise ContainerError(f"the checksum of {name!r} is not 8 hex digits") from None
            self.entries[name] = Entry(entry.dtype, entry.shape, entry.start, entry.end, crc)

    # ---- reading

    def _pread(self, offset: int, n: int) -> bytes:
        fd = self._fd
        if fd is None:
            raise ContainerError("the file was closed")
        chunks, done = [], 0
        while done < n:
            try:
                chunk = os.pread(fd, n - done, offset + done)
            except OSError as e:
                raise ContainerError(f"cannot read: {e.strerror or e}") from None
            if not chunk:
                raise ContainerError(_truncated(f"a read at byte {offset + done} found its end"))
            chunks.append(chunk)
            done += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def read_bytes(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Entry ``name``'s bytes as a uint8 tensor, checked against its checksum (the
        first time it is read from this file) and against the file having changed since
        it was opened. Read into fresh memory, or into ``out`` (a contiguous uint8 CPU
        tensor of exactly the entry's size, which nobody else uses meanwhile)."""
        import torch

        entry = self.entries[name]
        n = entry.end - entry.start
        verify = self._start_read(name)
        if out is None:
            out = torch.empty(n, dtype=torch.uint8)
        elif out.dtype != torch.uint8 or out.numel() != n or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous uint8 tensor of {n} elements")
        if not n:
            return out
        view = memoryview(out.numpy())  # keeps ``out`` alive while any thread fills it
        # two threads at once when torch may use more than one (see :class:`_SharedRead`)
        shared = n >= SPLIT_MIN and torch.get_num_threads() >= 2
        self._fill_checked(name, view, out.data_ptr(), verify, shared)
        return out

    def read_buffer(self, name: str) -> bytearray:
        """Entry ``name``'s bytes as a ``bytearray``, checked as :meth:`read_bytes` checks
        them, without torch: a manifest kept as an entry is text, read before any value
        (so opening a trace never imports torch for it)."""
        entry = self.entries[name]
        n = entry.end - entry.start
        verify = self._start_read(name)
        out = bytearray(n)
        if n:
            address = ctypes.addressof(ctypes.c_char.from_buffer(out))
            self._fill_checked(name, memoryview(out), address, verify, shared=False)
        return out

    def _start_read(self, name: str) -> bool:
        """Check that the file is open and unchanged; whether ``name``'s checksum is to
        be verified (it has one, and no read from this file verified it yet)."""
        entry = self.entries[name]
        with self._lock:
            if self._fd is None:
                raise ContainerError("the file was closed")
            try:
                now = os.fstat(self._fd)
            except OSError as e:
                raise ContainerError(f"cannot read: {e.strerror or e}") from None
            if _identity(now) != self._identity:
                raise ContainerError(
                    "the file changed on disk after it was opened (it was overwritten or "
                    "truncated); open it again"
                )
            return entry.checksum is not None and name not in self._verified

    def _fill_checked(
        self, name: str, view: memoryview, address: int, verify: bool, shared: bool
    ) -> None:
        """Fill ``view`` (at ``address``) with entry ``name``'s bytes; with ``verify``,
        check their checksum (and remember that it held)."""
        entry = self.entries[name]
        if shared:
            read = _SharedRead(self._fill_part, view, address, entry.start, verify)
            _helper().submit(read.help)
            crc = read.read()
        else:
            crc = self._fill_part(view, address, entry.start, 0, len(view), verify)
        if verify:
            if crc != entry.checksum:
                raise ContainerError(
                    f"entry {name!r} fails its checksum: the file is corrupt or was changed"
                )
            with self._lock:
                self._verified.add(name)

    def _fill_part(
        self,
        view: memoryview,
        address: int,
        offset: int,
        start: int,
        end: int,
        checksum: bool,
        crc: int = 0,
    ) -> int:
        """Read bytes ``start:end`` of the entry at ``offset`` into ``view``; with
        ``checksum``, in ``PIECE``s, each checksummed right after it is read, while it is
        still in the CPU's cache. Returns the CRC-32 of those bytes continued from
        ``crc`` (that of the bytes before them), or 0 without checksum."""
        if not checksum:
            self._read_into(view[start:end], offset + start)
            return 0
        for at in range(start, end, PIECE):
            stop = min(at + PIECE, end)
            self._read_into(view[at:stop], offset + at)
            crc = crc32.crc32_at(address + at, stop - at, crc)
        return crc

    def _read_into(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` with the file's bytes from ``offset`` (``preadv`` until full)."""
        n, done = len(view), 0
        while done < n:
            try:
                got = os.preadv(self._fd, [view[done:]], offset + done)
            except (OSError, TypeError) as e:  # TypeError: closed meanwhile (fd None)
                raise ContainerError(f"cannot read: {getattr(e, 'strerror', e)}") from None
            if got == 0:
                raise ContainerError(
                    "the file changed on disk after it was opened (it is shorter now); "
                    "open it again"
                )
            done += got

    def get_tensor(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Entry ``name`` as a tensor of its dtype and shape (a fresh, writable copy; or
        read into ``out``, see :meth:`read_bytes`)."""
        import torch

        entry = self.entries[name]
        raw = self.read_bytes(name, out)
        return raw.view(getattr(torch, entry.dtype)).reshape(entry.shape)

    def empty_tensor(self, name: str) -> torch.Tensor:
        """Entry ``name``, which holds no bytes (a dimension of size 0), as a tensor of its
        dtype and shape: no read, no check that the file is unchanged (nothing of it is
        used); its checksum, if any, must be that of no bytes."""
        import torch

        entry = self.entries[name]
        if entry.start != entry.end:
            raise ValueError(f"entry {name!r} holds {entry.end - entry.start} bytes")
        if self._fd is None:
            raise ContainerError("the file was closed")
        if entry.checksum not in (None, 0):
            raise ContainerError(
                f"entry {name!r} fails its checksum: the file is corrupt or was changed"
            )
        return torch.empty(entry.shape, dtype=getattr(torch, entry.dtype))

    def keys(self) -> list[str]:
        return list(self.entries)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            self._fd = None
            try:  # noqa: SIM105 - at interpreter exit contextlib may already be gone
                os.close(fd)
            except Exception:
                pass

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SharedRead:
    """One entry read by the calling thread and the helper thread together.

    The entry is cut into ``PIECE``s. The caller takes pieces from the front, the helper
    (whenever it gets to run: waking it takes a while, and it may still be busy) from
    the back, until they meet; each piece is read and checksummed by whoever took it.
    The caller's pieces form one run, checksummed in order; the helper's CRC-32 are
    appended to it at the end (:func:`tracing.crc32.combiner`, microseconds each). The
    caller returns only when every piece the helper took is read (the memory is not
    handed back while a thread still writes into it); the first error of either is
    raised.

    What checking costs, and why the helper does not read ahead: measured by
    ``benchmarks/bench_checksum.py`` (its docstring has the figures)."""

    def __init__(self, fill_part: Any, view: memoryview, address: int, offset: int, checksum: bool):
        self._fill_part = fill_part
        self._args = (view, address, offset)
        self._checksum = checksum
        self._n = len(view)
        self._lock = threading.Lock()
        self._front = 0  # the caller's next piece
        self._back = -(-self._n // PIECE)  # the piece after the helper's last one
        self._closed = False  # the caller is done: the helper may not start any more
        self._helper_started = False
        self._helper_done = threading.Lock()
        self._helper_done.acquire()  # released when the helper has stopped
        self._helper_crcs: dict[int, int] = {}  # the helper's pieces -> their CRC-32
        self._helper_error: BaseException | None = None

    def help(self) -> None:
        """On the helper thread: take pieces from the back until the caller's."""
        with self._lock:
            if self._closed:
                return
            self._helper_started = True
        try:
            while True:
                with self._lock:
                    if self._back <= self._front:
                        break
                    self._back -= 1
                    piece = self._back
                start = piece * PIECE
                end = min(start + PIECE, self._n)
                self._helper_crcs[piece] = self._fill_part(*self._args, start, end, self._checksum)
        except BaseException as e:
            self._helper_error = e
        finally:
            self._helper_done.release()

    def read(self) -> int:
        """On the calling thread: take pieces from the front until the helper's; returns
        the CRC-32 of the whole entry (0 without checksum)."""
        crc = 0
        try:
            while True:
                with self._lock:
                    if self._front >= self._back:
                        break
                    piece = self._front
                    self._front += 1
                start = piece * PIECE
                end = min(start + PIECE, self._n)
                crc = self._fill_part(*self._args, start, end, self._checksum, crc)
        finally:
            with self._lock:
                self._closed = True
                started = self._helper_started
            if started:
                self._helper_done.acquire()  # (also when the caller failed: see above)
        if self._helper_error is not None:
            raise self._helper_error
        if not self._checksum:
            return 0
        append = crc32.combiner(PIECE)
        last = -(-self._n // PIECE) - 1
        for piece in range(self._front, last):
            crc = append(crc, self._helper_crcs[piece])
        if self._front <= last:  # the helper read the last piece, maybe a short one
            crc = crc32.combine(crc, self._helper_crcs[last], self._n - last * PIECE)
        return crc


class _Helper:
    """The one helper thread that reads parts of large entries (a queue of jobs; cheaper
    to hand work to than a thread pool, which matters for entries of a millisecond)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="trace-read", daemon=True).start()

    def _run(self) -> None:
        while True:
            self._jobs.get()()  # (a job catches its own errors)

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)


_HELPER: dict[int, _Helper] = {}  # process id -> its helper


def _helper() -> _Helper:
    """This process's helper thread (made on first use, again in a forked child, which
    has no threads)."""
    pid = os.getpid()
    helper = _HELPER.get(pid)
    if helper is None:  # (no lock: two made at once would both work)
        _HELPER.clear()
        helper = _HELPER[pid] = _Helper()
    return helper


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _truncated(detail: str) -> str:
    return f"the file is truncated or not a safetensors file ({detail})"


_INT = {int}


def _entry(name: str, spec: object, base: int) -> Entry:
    if not isinstance(spec, dict):
        raise ContainerError(f"not a safetensors file (entry {name!r} is not an object)")
    code, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not isinstance(code, str) or code not in DTYPES:
        raise ContainerError(f"entry {name!r} has dtype {code!r}, which this reader does not know")
    if (
        type(shape) is not list
        or len(shape) > 64
        or not set(map(type, shape)) <= _INT
        or (shape and not 0 <= min(shape) <= max(shape) < 2**62)
    ):
        raise ContainerError(f"entry {name!r} has an invalid shape {str(shape)[:80]}")
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
        or not 0 <= offsets[0] <= offsets[1] < 2**62
    ):
        raise ContainerError(f"entry {name!r} has invalid data offsets {str(offsets)[:80]}")
    dtype, size = DTYPES[code]
    numel = 1
    for s in shape:
        numel *= s
    if numel * size != offsets[1] - offsets[0]:
        raise ContainerError(
            f"entry {name!r}: {dtype} of shape {shape} needs {numel * size} bytes but its "
            f"data offsets span {offsets[1] - offsets[0]}"
        )
    return Entry(dtype, tuple(shape), base + offsets[0], base + offsets[1])


def _check_tiling(entries: dict[str, Entry], data_bytes: int, base: int) -> None:
    """Entries must cover the data section exactly, without gaps or overlaps."""
    at = 0
    for entry in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if entry.start - base != at:
            raise ContainerError(
                "not a safetensors file (its entries overlap or leave a gap in the data)"
            )
        at = entry.end - base
    if at > data_bytes:
        raise ContainerError(_truncated(f"the data needs {at} bytes, {data_bytes} are there"))
    if at < data_bytes:
        raise ContainerError(
            f"not a safetensors file ({data_bytes - at} bytes after the last entry's data)"
        )
