"""The trace file (a safetensors container, no pickle): save, stream, encode, load, validate.

Files: :mod:`~tracing.file.layout` (what a file holds, its names and limits),
:mod:`~tracing.file.saving` (``save``, the safetensors writer), :mod:`~tracing.file.writer`
(the streaming ``TraceWriter``), :mod:`~tracing.file.journal` (what a killed capture can
still be opened from), :mod:`~tracing.file.manifest` (a Trace as JSON tables),
:mod:`~tracing.file.loading` (``load``), :mod:`~tracing.file.validate` (every field of a
stranger's file checked), :mod:`~tracing.file.lazy_values` (values read on first use),
:mod:`~tracing.file.container` (the safetensors container read defensively),
:mod:`~tracing.file.crc32` (checksums), :mod:`~tracing.file.rank_paths` (one file per rank),
:mod:`~tracing.file.source_files` (reading a source file a trace names, safely),
:mod:`~tracing.file.postmortem` (a failure and source text as the manifest stores them).

Imports only the record (``tracing.record``, ``tracing.errors``) below it.
"""

from tracing.file.layout import FORMAT_NAME, GRAPH_TENSOR, MANIFEST_TENSOR, RESERVED_PREFIX
from tracing.file.lazy_values import LazyValues
from tracing.file.loading import load, read_graph_data
from tracing.file.manifest import check_trace, encode_manifest
from tracing.file.rank_paths import rank_path
from tracing.file.saving import save, tensors_to_store, write_safetensors
from tracing.file.writer import HEADER_RESERVE, TraceWriter, can_store
from tracing.moved import submodules

__all__ = [
    "FORMAT_NAME",
    "GRAPH_TENSOR",
    "HEADER_RESERVE",
    "MANIFEST_TENSOR",
    "RESERVED_PREFIX",
    "LazyValues",
    "TraceWriter",
    "can_store",
    "check_trace",
    "encode_manifest",
    "load",
    "rank_path",
    "read_graph_data",
    "save",
    "tensors_to_store",
    "write_safetensors",
]

__getattr__ = submodules(__name__)
