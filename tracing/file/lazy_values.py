"""The values of a loaded trace, read from the file the first time each is asked for."""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracing.errors import TraceFileError
from tracing.file.container import (
    ContainerError,
)
from tracing.file.layout import VALUE_CACHE_BYTES, VALUE_CACHE_SIZE

if TYPE_CHECKING:  # pragma: no cover - torch is imported with the first value read
    import torch

# --------------------------------------------------------------------------- lazy values


class LazyValues(Mapping):
    """Read-only ``value_key -> tensor`` mapping backed by an open safetensors file.

    A tensor is read from disk the first time it is asked for (and checked against its
    checksum, and against the file having changed since it was opened: both raise
    ``TraceFileError``); the last ``VALUE_CACHE_SIZE`` tensors read (up to
    ``VALUE_CACHE_BYTES``) stay in memory, and so does any value the caller still holds:
    asked for again, it is that same tensor, never a second copy (an empty one, which
    holds no memory, is made anew each time, without a read). The mapping holds the
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
            entry = self._handle.entries[key]
            if entry.start == entry.end:  # no bytes: nothing to read, check, cache or share
                try:
                    return self._handle.empty_tensor(key)
                except ContainerError as e:
                    raise TraceFileError(f"{self.path}: cannot read tensor {key!r}: {e}") from None
            t = self._alive.get(key)
            if t is None:
                try:
                    out = self._spares.take(entry)
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


def _storage_use_count() -> Any:
    """torch's use count of a storage (``None`` where this torch has none); imported on
    first use, so opening a trace does not import torch."""
    import torch

    return getattr(torch._C, "_storage_Use_Count", None)


class _SpareMemory:
    """Memory of values the cache let go that nobody else holds, to read the next values
    of the same size into.

    Reading every value of a trace once (a full load, an export) would otherwise put each
    one on freshly mapped pages, which the kernel must zero first: the cache holds up to
    ``VALUE_CACHE_SIZE`` values, so the allocator rarely has a freed block of the right
    size, and gives large blocks back to the system (what that costs:
    ``benchmarks/bench_trace_file.py``).

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
        if _storage_use_count() is None or box[0].device.type != "cpu":
            return
        import torch

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
                import torch

                return torch.empty(0, dtype=torch.uint8).set_(storage)
        return None


def _counts(box: list[torch.Tensor]) -> tuple[torch.UntypedStorage, int, int]:
    """The storage of the tensor taken out of ``box`` (so the tensor itself is gone
    unless someone else holds it), with its use count and Python reference count."""
    storage = box.pop().untyped_storage()
    return storage, _storage_use_count()(storage._cdata), sys.getrefcount(storage)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
