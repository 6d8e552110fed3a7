"""CRC-32 (the one of zlib, gzip and PNG) of memory, fast through the ``zlib-ng`` wheel.

Trace files store every entry's CRC-32 (see :mod:`tracing.container`), computed while
saving and checked on the first read of each value, so its speed is part of both.
``zlib-ng`` (a dependency: wheels for Linux, macOS and Windows, no system package) computes
the same function as ``zlib.crc32`` with carry-less multiplication, several times faster
(``benchmarks/bench_checksum.py`` prints both speeds). Where it cannot be imported
everything falls back to ``zlib.crc32``: the results are the same bit for bit, only
slower. Both release the GIL for large buffers, so other threads run meanwhile.

:func:`combine` joins the CRC-32 of two pieces into the CRC-32 of both (zlib's
``crc32_combine``), so one buffer can be checksummed in pieces on several threads.
"""

from __future__ import annotations

import ctypes
import functools
import zlib
from collections.abc import Callable
from typing import Any

_POLY = 0xEDB88320
"""The CRC-32 polynomial, bit-reflected (bit 31 holds x^0), as zlib uses it."""


def _find_zlib_ng() -> Callable[[Any, int], int] | None:
    """``zlib_ng.crc32(data, value)`` if the wheel imports and agrees with zlib on a test
    buffer, else None."""
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        return None
    function = zlib_ng.crc32
    probe = bytes(range(256)) * 5 + b"123456789"
    if function(probe) == zlib.crc32(probe) and function(probe[:9], zlib.crc32(probe)) == (
        zlib.crc32(probe + probe[:9])
    ):
        return function
    return None  # pragma: no cover - a broken build


@functools.cache
def _native() -> Callable[[Any, int], int] | None:
    """The accelerated function, looked for once (None: zlib is used)."""
    return _find_zlib_ng()


def implementation() -> str:
    """``"zlib-ng"`` or ``"zlib"``: which code computes the checksums."""
    return "zlib-ng" if _native() is not None else "zlib"


def crc32_at(address: int, nbytes: int, value: int = 0) -> int:
    """CRC-32 of the ``nbytes`` bytes of memory at ``address``, continuing from ``value``
    (the CRC-32 of what came before; 0 to start), as ``zlib.crc32`` would give it.

    The caller keeps that memory alive and unchanged during the call."""
    if nbytes <= 0:
        return value
    return crc32((ctypes.c_char * nbytes).from_address(address), value)


def crc32(data: Any, value: int = 0) -> int:
    """``zlib.crc32(data, value)`` for any C-contiguous buffer (bytes, memoryview, a
    NumPy array...), through zlib-ng when it is there."""
    native = _native()
    return zlib.crc32(data, value) if native is None else native(data, value)


# ---- combining the CRC-32 of two pieces (zlib's crc32_combine, in Python)


def _multiply(a: int, b: int) -> int:
    """``a * b`` modulo the CRC polynomial (both bit-reflected; ``a`` not zero)."""
    m = 1 << 31
    product = 0
    while True:
        if a & m:
            product ^= b
            if not a & (m - 1):
                return product
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    """x^(2^k) modulo the polynomial for k = 0..31 (x^(2^k) repeats with period < 2^32)."""
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multiply(table[-1], table[-1]))
    return table


_X_POW_2K = _powers()


@functools.lru_cache(maxsize=1024)
def _shift(nbytes: int) -> int:
    """x^(8 * nbytes) modulo the polynomial: what moving a CRC past ``nbytes`` bytes of
    zeros multiplies it by. (Cached: pieces of a trace file come in few lengths.)"""
    power, k = 1 << 31, 3  # x^0; bit i of nbytes stands for x^(2^(i + 3))
    while nbytes:
        if nbytes & 1:
            power = _multiply(_X_POW_2K[k & 31], power)
        nbytes >>= 1
        k += 1
    return power


def combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1`` = CRC-32 of ``A``, ``crc2`` = CRC-32 of ``B``
    and ``len2`` = the length of ``B`` in bytes (``A`` itself is not needed)."""
    return _multiply(_shift(len2), crc1) ^ crc2


@functools.lru_cache(maxsize=16)
def combiner(len2: int) -> Callable[[int, int], int]:
    """``combine`` for one fixed ``len2``, by table: ``append(crc1, crc2)`` is then a few
    table lookups instead of a matrix power (building the tables costs more than one
    ``combine``: for a length that comes back often, as the pieces of large entries do)."""
    shift = _shift(len2)
    basis = [_multiply(shift, 1 << bit) for bit in range(32)]
    tables = []
    for byte in range(4):
        table = [0] * 256
        for value in range(1, 256):
            low = value & -value  # the lowest set bit: table[value] = table[rest] ^ its row
            table[value] = table[value ^ low] ^ basis[8 * byte + low.bit_length() - 1]
        tables.append(table)
    t0, t1, t2, t3 = tables

    def append(crc1: int, crc2: int) -> int:
        return (
            t0[crc1 & 0xFF] ^ t1[crc1 >> 8 & 0xFF] ^ t2[crc1 >> 16 & 0xFF] ^ t3[crc1 >> 24] ^ crc2
        )

    return append
