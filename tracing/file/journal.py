"""The journal of a streamed trace file: what a killed capture leaves can be opened.

A streamed file (:class:`~tracing.file.writer.TraceWriter`) gets its header only when
the capture ends, so a process killed outright (``SIGKILL``, the OOM killer) would leave
values no reader can place. So while it records, the writer keeps a *journal* beside the
file: a small sidecar that says, for the last checkpoint, which entries the data holds
(dtype, shape, byte range, CRC-32) and the manifest of the steps recorded up to then.

- The data file is ``NAME.PID-TID.partial`` and the journal ``NAME.PID-TID.journal``,
  both visible in the output's folder (a leftover is never hidden).
- A checkpoint flushes the data file, then replaces the journal by an atomic rename, so
  the journal on disk always describes bytes that are in the file.
- Checkpoints are taken by the tracer between module calls, at most every
  ``JOURNAL_SECONDS`` and spaced so that their cost stays under ``1 / JOURNAL_COST_RATIO``
  of the capture time (see :meth:`tracing.capture.tracer.Tracer._checkpoint`).
- On ``close`` the finished file takes its name and the journal is removed.

``tracing.load(PARTIAL)`` (or the journal's own path) opens a leftover as a partial trace
(``complete`` False, ``error`` saying so) read in place; :func:`recover` (``scratchformer
recover FILE``) writes it out as an ordinary trace file and removes the leftover.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tracing.file.container import Container, ContainerError, _check_tiling, _entry

JOURNAL_SECONDS = 1.0
"""At most one checkpoint per this many seconds of capture."""

JOURNAL_COST_RATIO = 20
"""The next checkpoint waits at least this many times as long as the last one took."""

JOURNAL_FORMAT = "scratchformer-journal"
JOURNAL_SUFFIX = ".journal"
PARTIAL_SUFFIX = ".partial"

MAX_JOURNAL_BYTES = 200_000_000

_LEFTOVER = re.compile(r"^(?P<name>.+)\.(?P<pid>\d+)-(?P<tid>\d+)\.(partial|journal)$")

# --------------------------------------------------------------------------- names


def streaming_name(path: Path, pid: int, tid: int) -> Path:
    """The visible name a streamed file is written under before it is renamed."""
    return path.parent / f"{path.name}.{pid}-{tid}{PARTIAL_SUFFIX}"


def journal_of(partial: Path) -> Path:
    return partial.with_name(partial.name.removesuffix(PARTIAL_SUFFIX) + JOURNAL_SUFFIX)


def leftover_parts(path: Path) -> tuple[Path, Path, str, int] | None:
    """``(partial, journal, final name, pid)`` when ``path`` names a streamed leftover
    (either of its two files), else None."""
    m = _LEFTOVER.match(path.name)
    if m is None:
        return None
    stem = f"{m['name']}.{m['pid']}-{m['tid']}"
    return (
        path.with_name(stem + PARTIAL_SUFFIX),
        path.with_name(stem + JOURNAL_SUFFIX),
        m["name"],
        int(m["pid"]),
    )


def leftovers_for(path: Path) -> list[Path]:
    """The partial files a streamed capture to ``path`` left in its folder."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        m = _LEFTOVER.match(name)
        if m is not None and m["name"] == path.name and name.endswith(PARTIAL_SUFFIX):
            out.append(folder / name)
    return sorted(out)


# --------------------------------------------------------------------------- writing


def write_journal(
    journal: Path, reserve: int, entries: dict[str, tuple[str, list[int], int, int]],
    metadata: dict[str, str],
) -> int:  # fmt: skip
    """Replace ``journal`` atomically by one describing ``entries`` (offsets from the end
    of the ``reserve``) and ``metadata`` (the header's, manifest inline); returns its size."""
    record = {
        "format": JOURNAL_FORMAT,
        "reserve": reserve,
        "metadata": metadata,
        "entries": entries,
    }
    data = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    tmp = journal.with_name(journal.name + ".new")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, journal)
    except BaseException:  # a full disk, a size limit: no half-written sidecar left behind
        tmp.unlink(missing_ok=True)
        raise
    return len(data)


# --------------------------------------------------------------------------- reading


class JournalContainer(Container):
    """A streamed leftover read in place: the entries and metadata come from its journal
    (checked like a header: known dtypes, sizes that agree, ranges that tile the data up
    to the last checkpoint); the bytes after it, written since, are ignored."""

    def __init__(self, partial: Path, journal: Path):
        self._journal = journal
        super().__init__(partial)

    def _read_header(self, size: int) -> tuple[dict[str, str], dict[str, Any]]:
        try:
            with open(self._journal, "rb") as f:
                raw = f.read(MAX_JOURNAL_BYTES + 1)
        except OSError as e:
            raise ContainerError(f"its journal cannot be read: {e.strerror or e}") from None
        if len(raw) > MAX_JOURNAL_BYTES:
            raise ContainerError("its journal is too big")
        try:
            record = json.loads(raw)
        except (RecursionError, UnicodeDecodeError, ValueError):
            raise ContainerError("its journal is not valid JSON") from None
        if not isinstance(record, dict) or record.get("format") != JOURNAL_FORMAT:
            raise ContainerError("its journal is not a Scratchformer journal")
        reserve, metadata, specs = (
            record.get("reserve"),
            record.get("metadata"),
            record.get("entries"),
        )
        if type(reserve) is not int or not 8 <= reserve < 2**40:
            raise ContainerError("its journal has no valid header reserve")
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise ContainerError("its journal's metadata is not a map of text to text")
        if not isinstance(specs, dict):
            raise ContainerError("its journal's entries are not a JSON object")
        entries = {}
        for name, spec in specs.items():
            if not (isinstance(spec, list) and len(spec) == 4):
                raise ContainerError(f"journal entry {name!r} is not [dtype, shape, start, end]")
            code, shape, start, end = spec
            entries[name] = _entry(
                name, {"dtype": code, "shape": shape, "data_offsets": [start, end]}, reserve
            )
        end = max((e.end for e in entries.values()), default=reserve) - reserve
        if reserve + end > size:
            raise ContainerError(
                f"the file is shorter than its journal says ({size} bytes, {reserve + end} needed)"
            )
        _check_tiling(entries, end, reserve)
        return metadata, entries


def open_leftover(path: Path) -> Container | None:
    """The container of a streamed leftover at ``path`` (its partial file or its journal),
    None when ``path`` is not one. ``ContainerError`` when it is one that cannot be read,
    or was killed before its first checkpoint."""
    parts = leftover_parts(path)
    if parts is None:
        return None
    partial, journal, _, pid = parts
    if not journal.exists():
        if _alive(pid):
            raise ContainerError(
                f"a capture still being written (by process {pid}) that has no checkpoint yet"
            )
        raise ContainerError(
            "a streamed capture that stopped before its first checkpoint: nothing in it "
            "can be placed (delete it)"
        )
    return JournalContainer(partial, journal)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a number no process can have (a name's pid may be
    anything: ``t.sft.99999999999999999999-1.partial``) is a process that does not."""
    if pid == os.getpid():
        return True
    if not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def is_alive(path: Path) -> bool:
    """Whether the process that writes the leftover at ``path`` is still running."""
    parts = leftover_parts(path)
    return parts is not None and _alive(parts[3])


def recover(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the streamed leftover at ``path`` out as an ordinary trace file (``out``, by
    default the name the capture was writing) and remove the leftover; returns the path.
    ``TraceFileError`` naming the problem otherwise (a capture still running, an ``out``
    that exists already)."""
    from tracing.errors import TraceFileError
    from tracing.file.loading import load
    from tracing.file.saving import save

    path = Path(path)
    parts = leftover_parts(path)
    if parts is None:
        raise TraceFileError(f"{path}: not a streamed leftover (NAME.PID-TID.partial or .journal)")
    partial, journal, final, pid = parts
    if _alive(pid):
        raise TraceFileError(f"{path}: process {pid} is still writing it; wait for it to end")
    target = Path(out) if out is not None else partial.with_name(final)
    if target.exists():
        raise TraceFileError(f"{path}: {target} exists already; name another output (-o)")
    trace = load(partial)
    save(trace, target)
    trace.values.close()
    partial.unlink(missing_ok=True)
    journal.unlink(missing_ok=True)
    return target
