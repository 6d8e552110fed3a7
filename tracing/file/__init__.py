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

from tracing.moved import lazy_names

# imported on first use: ``tracing.load`` (``tracing.file.loading``) then imports neither
# the writers nor torch, which a report of a shapes trace never needs
__getattr__ = lazy_names(
    __name__,
    {
        "FORMAT_NAME": "tracing.file.layout",
        "GRAPH_TENSOR": "tracing.file.layout",
        "MANIFEST_TENSOR": "tracing.file.layout",
        "RESERVED_PREFIX": "tracing.file.layout",
        "HEADER_RESERVE": "tracing.file.writer",
        "LazyValues": "tracing.file.lazy_values",
        "TraceWriter": "tracing.file.writer",
        "can_store": "tracing.file.writer",
        "check_trace": "tracing.file.manifest",
        "encode_manifest": "tracing.file.manifest",
        "load": "tracing.file.loading",
        "rank_path": "tracing.file.rank_paths",
        "read_graph_data": "tracing.file.loading",
        "save": "tracing.file.saving",
        "tensors_to_store": "tracing.file.saving",
        "write_safetensors": "tracing.file.saving",
    },
)

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
