"""Opening a trace file: read the header, validate, and give a Trace with lazy values."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tracing import collector
from tracing.errors import TraceFileError
from tracing.file.container import (
    Container,
    ContainerError,
)
from tracing.file.journal import leftovers_for, open_leftover
from tracing.file.layout import (
    FORMAT_NAME,
    GRAPH_TENSOR,
    MANIFEST_TENSOR,
    MAX_MANIFEST_BYTES,
    RESERVED_PREFIX,
    Invalid,
)
from tracing.file.lazy_values import LazyValues
from tracing.file.validate import validate
from tracing.meta_checks import MetaProblem, check_meta, upgrade_meta
from tracing.record import (
    SCHEMA_VERSION,
    Trace,
)

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
    with collector.paused():
        try:
            container = _open(path)
        except ContainerError as e:
            raise TraceFileError(f"{path}: {e}{_leftover_hint(path)}") from None
        except (OSError, ValueError, MemoryError) as e:  # a path the OS cannot take, no memory
            raise TraceFileError(f"{path}: cannot read: {_reason(e)}") from None

    with collector.paused():
        try:
            container.attach_checksums()
            manifest = _read_manifest(container)
            stored = {k: (e.shape, e.dtype) for k, e in container.entries.items()}
            trace = validate(manifest, stored)
            check_meta(trace.meta, steps=len(trace.steps), tensors=len(trace.tensors))
            upgrade_meta(trace.meta)  # an older file's fields, read as this version writes
        except (Invalid, ContainerError, MetaProblem) as e:
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

    value_keys = [k for k in container.entries if not k.startswith(RESERVED_PREFIX)]
    trace.values = LazyValues(path, container, value_keys)
    return trace


def _open(path: Path) -> Container:
    """The container of ``path``: an ordinary trace file, or the leftover of a streamed
    capture that was killed (read through its journal, :mod:`tracing.file.journal`)."""
    try:
        return Container(path)
    except ContainerError:
        leftover = open_leftover(path)
        if leftover is None:
            raise
        return leftover


def _leftover_hint(path: Path) -> str:
    """For a missing file: the leftovers a killed capture to it left, if any."""
    if os.path.lexists(path):
        return ""
    found = leftovers_for(path)
    if not found:
        return ""
    return (
        f" (a capture to it stopped before it ended and left {found[-1].name}: open that, "
        "or `scratchformer recover` it)"
    )


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
    except (ContainerError, Invalid, ValueError, RecursionError, MemoryError) as e:
        if isinstance(e, TraceFileError):
            raise
        raise TraceFileError(f"{trace_path}: cannot read the graph: {_reason(e)}") from None


def _stored_text(container: Container, name: str) -> str:
    """A manifest or graph kept as a uint8 entry, as text (bounded, checked)."""
    entry = container.entries[name]
    if entry.dtype != "uint8" or len(entry.shape) != 1:
        raise Invalid(f"entry {name!r} is not a 1-D uint8 tensor of JSON text")
    if entry.end - entry.start > MAX_MANIFEST_BYTES:
        raise Invalid(
            f"entry {name!r} is {entry.end - entry.start:,} bytes, more than the "
            f"{MAX_MANIFEST_BYTES:,} this reads"
        )
    try:
        return container.read_buffer(name).decode("utf-8")  # the bytes freed at once
    except UnicodeDecodeError:
        raise Invalid(f"entry {name!r} is not UTF-8 text") from None


def _read_manifest(container: Container) -> dict[str, Any]:
    header = container.metadata
    if header.get("format") != FORMAT_NAME:
        raise Invalid(
            "a safetensors file but not a Scratchformer trace (its metadata has no trace manifest)"
        )
    try:
        schema = int(header.get("schema", ""))
    except ValueError:
        raise Invalid(f"schema version {header.get('schema')!r:.40} is not a number") from None
    if schema > SCHEMA_VERSION:
        raise Invalid(
            f"written with trace schema version {schema}, but this Scratchformer reads "
            f"versions up to {SCHEMA_VERSION}; upgrade Scratchformer to open it"
        )
    if schema < 1:
        raise Invalid(f"schema version {schema} is not valid")

    if "manifest" in header:
        text = header["manifest"]
        if len(text) > MAX_MANIFEST_BYTES:
            raise Invalid(f"the manifest is longer than the {MAX_MANIFEST_BYTES:,} this reads")
    elif MANIFEST_TENSOR in container.entries:
        text = _stored_text(container, MANIFEST_TENSOR)
    else:
        raise Invalid("the trace manifest is missing from the file")
    try:
        manifest = json.loads(text)
    except RecursionError:
        raise Invalid("the trace manifest is nested too deeply") from None
    except ValueError as e:
        raise Invalid(f"the trace manifest is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(manifest, dict):
        raise Invalid("the trace manifest is not a JSON object")
    inner = manifest.get("schema", schema)
    if type(inner) is not int or inner > SCHEMA_VERSION or inner < 1:
        raise Invalid(f"the manifest's schema version {inner!r:.40} is not one this reads")
    return manifest
