"""Where the copies of kept tensor values go while a trace records: memory or a file.

Two sinks with one method, ``keep(key, tensor, dtype)``:

- :class:`ValueArena` packs the copies into large chunks of memory. A fresh allocation
  per copy lands on fresh pages, and the page faults cost more than the copy itself
  (471 MB of gpt2-small values: ~115,000 faults). Chunks are taken from a small pool
  that outlives each trace: once the values of an earlier trace are gone, the next one
  reuses the same (already mapped) memory, so a re-trace copies at memory speed. Small
  CPU tensors are simply cloned (``SMALL_COPY_BYTES``).
- :class:`StreamedValues` writes each copy to the trace file as it is produced (a
  :class:`tracing.trace_file.TraceWriter`), so memory stays flat whatever the trace size.

From an accelerator, copies are queued asynchronously into pinned host memory and waited
for once (when the trace finishes, or when the queued bytes of a streamed trace pass
``STREAM_PENDING_BYTES``), never per tensor.
"""

from __future__ import annotations

import torch

CHUNK_BYTES = 32 * 2**20
"""Size of one arena chunk (a larger value gets a chunk of its own size)."""

POOL_IDLE_BYTES = 1 * 2**30
"""At most this many bytes of chunks no trace uses anymore are kept for reuse."""

STREAM_PENDING_BYTES = 256 * 2**20
"""A streamed trace from an accelerator waits for its queued copies past this many bytes."""

ALIGN = 64  # bytes: every copy starts on a cache line (and so on its element size)

SMALL_COPY_BYTES = 64 * 2**10
"""A CPU tensor up to this size is copied with one ``clone`` (the allocator's free lists
serve it without page faults; packing it into a chunk would cost four calls, not one)."""

_CONTIGUOUS = torch.contiguous_format

_POOL: list[torch.Tensor] = []  # uint8 chunks, CPU (plain or pinned)


def _use_count(chunk: torch.Tensor) -> int | None:
    """How many tensors share ``chunk``'s memory (None if torch cannot say)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:  # pragma: no cover - a torch without it: chunks are not reused
        return None
    return count(chunk.untyped_storage()._cdata)


_ALONE = _use_count(torch.empty(1))  # the count of a tensor nothing else shares


def _idle(chunk: torch.Tensor) -> bool:
    """True when only the pool holds ``chunk`` (every copy made in it is gone)."""
    return _ALONE is not None and _use_count(chunk) == _ALONE


def _take_chunk(nbytes: int, pinned: bool) -> torch.Tensor:
    """A chunk of at least ``nbytes``: an idle pooled one if any, else a new one."""
    for i, chunk in enumerate(_POOL):
        if chunk.numel() >= nbytes and chunk.is_pinned() == pinned and _idle(chunk):
            return _POOL.pop(i)
    _trim_pool()
    return torch.empty(max(nbytes, CHUNK_BYTES), dtype=torch.uint8, pin_memory=pinned)


def _trim_pool() -> None:
    """Drop idle chunks beyond ``POOL_IDLE_BYTES`` (oldest first). By identity: a list's
    ``remove`` compares with ``==``, which on two chunks of one size is a tensor, not a
    bool (a values training step of gpt2-small once died of it)."""
    idle, drop = 0, set()
    for chunk in reversed(_POOL):
        if _idle(chunk):
            idle += chunk.numel()
            if idle > POOL_IDLE_BYTES:
                drop.add(id(chunk))
    if drop:
        _POOL[:] = [chunk for chunk in _POOL if id(chunk) not in drop]


def release_pool() -> None:
    """Forget every pooled chunk (memory still in use by a trace stays with it)."""
    _POOL.clear()


def _wait_for_devices(devices: set[torch.device]) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        else:  # pragma: no cover - other accelerators
            module = getattr(torch, device.type, None)
            sync = getattr(module, "synchronize", None)
            if sync is not None:
                sync()


class ValueArena:
    """Copies of kept values, packed into pooled chunks of host memory.

    ``keep`` returns the key and a contiguous CPU tensor that views a chunk; ``finish`` waits for
    copies still in flight from an accelerator (once, for all of them).
    """

    def __init__(self):
        self._chunk: torch.Tensor | None = None
        self._offset = 0
        self._chunks: list[torch.Tensor] = []
        self._devices: set[torch.device] = set()

    def keep(self, key: str, t: torch.Tensor, dtype: torch.dtype) -> tuple[str, torch.Tensor]:
        nbytes = t.numel() * dtype.itemsize
        on_host = t.device.type == "cpu"
        if on_host and nbytes <= SMALL_COPY_BYTES:
            if dtype == t.dtype:
                return key, t.detach().clone(memory_format=_CONTIGUOUS)
            return key, t.detach().to(dtype, memory_format=_CONTIGUOUS, copy=True)
        chunk = self._chunk
        if chunk is None or self._offset + nbytes > chunk.numel():
            chunk = self._chunk = _take_chunk(nbytes, pinned=not on_host)
            self._chunks.append(chunk)
            self._offset = 0
        start = self._offset
        self._offset = start + nbytes + (-nbytes % ALIGN)
        copy = chunk[start : start + nbytes].view(dtype).view(t.shape)
        if on_host:
            copy.copy_(t.detach())
        else:
            copy.copy_(t.detach(), non_blocking=True)  # waited for in finish()
            self._devices.add(t.device)
        return key, copy

    def finish(self) -> None:
        """Wait for copies in flight; hand the chunks to the pool for later traces."""
        _wait_for_devices(self._devices)
        self._devices.clear()
        _POOL.extend(self._chunks)  # reused only once every copy in them is gone
        self._chunks = []
        self._chunk = None

    aborted = False

    def abort(self) -> None:
        self.finish()


class StreamedValues:
    """Copies of kept values written straight to a trace file as they come.

    ``keep`` returns the key written (None: a dtype the file cannot hold), and None for
    the copy: nothing stays in memory. CPU tensors
    are written from their own memory (no copy); accelerator tensors are queued into
    pinned memory and written once the device has produced them.
    """

    def __init__(self, writer):
        self.writer = writer
        self._queued: list[tuple[str, torch.Tensor]] = []
        self._queued_bytes = 0
        self._devices: set[torch.device] = set()
        self._written: set[str] = set()
        self.aborted = False

    def keep(self, key: str, t: torch.Tensor, dtype: torch.dtype) -> tuple[str | None, None]:
        from tracing.file.writer import can_store  # imported with the writer it is given

        if not can_store(dtype):  # complex128, quantized...: the file has no such dtype
            return None, None
        if key in self._written:  # a record dropped and its id reused: a fresh name
            key = f"{key}.{len(self._written)}"
        self._written.add(key)
        t = t.detach()
        if t.device.type == "cpu":
            self.writer.add(key, t if t.dtype == dtype else t.to(dtype))
            return key, None
        host = torch.empty(t.shape, dtype=dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        self._devices.add(t.device)
        self._queued.append((key, host))
        self._queued_bytes += host.numel() * host.element_size()
        if self._queued_bytes > STREAM_PENDING_BYTES:
            self._drain()
        return key, None

    def _drain(self) -> None:
        _wait_for_devices(self._devices)
        for key, host in self._queued:
            self.writer.add(key, host)
        self._queued.clear()
        self._queued_bytes = 0

    def finish(self) -> None:
        self._drain()

    def abort(self) -> None:
        self._queued.clear()
        self.writer.abort()
        self.aborted = True
