"""Reading a source file that a trace names, safely.

A trace records the path of every source line it saw. A trace from someone else may name
any path at all — ``/dev/zero`` (never ends), a FIFO (blocks forever), ``/etc/passwd``
(not source, and not theirs to show) — so a viewer reads a named file only through
:func:`read_source_file`, which accepts a regular Python source file of bounded size
and nothing else, and never blocks. Whether to read it at all (a file named by a
stranger's trace) is the viewer's question to its user; this module only says whether
it *can* be read as source.

Qt-free, so the app's source pane and anything else showing source text (a report, a
trace with embedded sources) share one rule.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tracing.file.container import ContainerError, open_regular_file

SOURCE_SUFFIXES = frozenset({".py", ".pyw", ".pyi"})
"""What counts as a source file (by name, and by the name a symlink resolves to)."""

MAX_SOURCE_BYTES = 4 * 2**20
"""Largest source file read; a model file is tens of kilobytes."""


class SourceRefused(Exception):
    """The named file is not read; the message says why, for the viewer to show."""


def source_problem(file: str) -> str | None:
    """Why ``file`` would not be read as source, or None if it would (cheap: one stat)."""
    try:
        _checked_path(file)
    except SourceRefused as e:
        return str(e)
    return None


def _checked_path(file: str) -> str:
    if not file or file.startswith("<"):
        raise SourceRefused("no source file recorded (code not from a file)")
    if "\0" in file:
        raise SourceRefused("the recorded path is not a valid path")
    real = os.path.realpath(file)
    for name in (file, real):
        if os.path.splitext(name)[1].lower() not in SOURCE_SUFFIXES:
            raise SourceRefused(f"{name} is not a Python source file (.py); not read")
    try:
        info = os.stat(real)
    except OSError as e:
        raise SourceRefused(f"{file} cannot be read here ({e.strerror or e})") from None
    if not stat.S_ISREG(info.st_mode):
        raise SourceRefused(f"{file} is not a regular file (a FIFO, device or folder); not read")
    if info.st_size > MAX_SOURCE_BYTES:
        raise SourceRefused(
            f"{file} is {info.st_size:,} bytes, more than the {MAX_SOURCE_BYTES:,} a source "
            "file may have; not read"
        )
    return real


def read_source_file(file: str) -> str:
    """The text of source file ``file`` (UTF-8, undecodable bytes replaced).

    Raises :class:`SourceRefused` unless it is a regular ``.py`` file (also after
    following symlinks) of at most ``MAX_SOURCE_BYTES`` with no NUL bytes. Opens without
    blocking and reads at most that many bytes, whatever happens to the file meanwhile.
    """
    real = _checked_path(file)
    try:
        fd = open_regular_file(Path(real))  # non-blocking, and regular when opened too
    except ContainerError as e:
        raise SourceRefused(f"{file}: {e}; not read") from None
    try:
        chunks, left = [], MAX_SOURCE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise SourceRefused(f"{file} cannot be read here ({e.strerror or e})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceRefused(f"{file} grew past {MAX_SOURCE_BYTES:,} bytes; not read")
    if b"\0" in data:
        raise SourceRefused(f"{file} holds binary data, not source text; not read")
    return data.decode("utf-8", errors="replace")
