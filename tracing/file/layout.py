"""The trace file: one safetensors container holding a whole ``Trace``.

Layout
------
A trace file is an ordinary `safetensors <https://github.com/huggingface/safetensors>`_
file, so any safetensors reader can list and read its tensors, and opening one runs no
code (there is no pickle anywhere):

- every kept tensor value is a named entry; the name is the ``TensorRecord.value_key``;
- the safetensors header's ``__metadata__`` (a string -> string map) carries::

      "format":   "scratchformer-trace"     # marks the file as ours
      "schema":   "1"                       # SCHEMA_VERSION of the manifest
      "manifest": "{...}"                   # the JSON manifest (compact)
      "graph":    "{...}"                   # node_link_data of Trace.graph (JSON)

  A manifest or graph too big for the header (safetensors caps the header at ~100 MB) is
  stored as a ``uint8`` entry named ``__scratchformer_manifest__`` /
  ``__scratchformer_graph__`` instead, and its key is absent.

The manifest
------------
``meta``, ``error``, then ``steps``, ``tensors`` and ``modules`` as small tables
(``{"fields": [...], "rows": [[...], ...]}``: one list per record, field names once).
Source locations are de-duplicated into ``sources`` and steps point at them by index.

The graph
---------
``graph`` is ``networkx.node_link_data(trace.graph, edges="edges")`` (networkx 3.6
renamed the edge key, so it is given explicitly), for readers outside ``tracing``:
``networkx.node_link_graph(json.loads(...), edges="edges")`` or ``read_graph_data``. It
sits beside the manifest rather than inside it because it repeats what the steps say:
``tracing.load`` never parses it (that would double the work of opening a file) and
rebuilds ``Trace.graph`` from the steps on first use.

Reading
-------
``load`` reads the header only and validates every field and cross-reference against it,
so opening takes the same time whatever the size of the tensors. ``Trace.values`` is then
a read-only mapping that reads a tensor from disk the first time it is asked for (and
keeps the last few in a small cache). Every problem raises one ``TraceFileError`` naming
the file and the problem.

Writing
-------
``save`` writes to a temporary name in the same directory, then renames it over the
target, so an interrupted save never leaves a file that looks complete.

This module holds the names and limits of that layout; the other modules of
:mod:`tracing.file` read and write it.
"""

from __future__ import annotations

from dataclasses import fields

from tracing.file.container import (
    DTYPES,
)
from tracing.record import (
    TensorStats,
)

FORMAT_NAME = "scratchformer-trace"
"""Value of the ``format`` metadata key: tells our files from other safetensors files."""

MANIFEST_TENSOR = "__scratchformer_manifest__"
"""Entry that holds the manifest when it is too big for the safetensors header."""

GRAPH_TENSOR = "__scratchformer_graph__"
"""Entry that holds the graph JSON when it is too big for the safetensors header."""

RESERVED_PREFIX = "__scratchformer"

MANIFEST_INLINE_LIMIT = 2**20
"""Most characters of manifest + graph kept in the header; larger ones are stored as
``uint8`` entries. A header is parsed whole on every open, each string in it unescaped:
a 50,000-step trace's manifest and graph (28 MB) cost 0.1 s there, and the graph is not
needed to open a trace; as entries, the manifest is one read and the graph is read only
when asked for. (Files with larger inline manifests, written before, open as ever.)"""

VALUE_CACHE_SIZE = 16
"""How many tensors a loaded trace keeps in memory after reading them (least recent out),
besides those still held by the caller (see ``LazyValues``)."""

VALUE_CACHE_BYTES = 4 * 2**20
"""...and at most this many bytes of them (the last one read is always kept). Small on
purpose: a value in use stays reachable anyway, and reading every value of a trace once
runs faster when the memory of the values let go is reused while it is still in the
CPU's cache (``benchmarks/bench_trace_file.py`` has the figures)."""

MAX_MANIFEST_BYTES = 64 * 2**20
"""Largest manifest ``load`` decodes; decoding costs ~40x its size in memory, and a trace
of 50,000 steps needs ~15 MB."""

MAX_RECORDS = 2_000_000
"""Most rows a manifest table (steps, tensors, modules, sources) may hold."""

MAX_DEPTH = 256
"""Deepest module nesting a step may have (real models nest a dozen levels)."""

MAX_META_NESTING = 64
"""Deepest nesting of lists and objects accepted in ``meta``."""

MAX_INT = 2**63 - 1
"""Whole numbers in the manifest (ids, sizes, counts) must fit in 64 bits."""

# safetensors dtype codes -> torch dtype names (as TensorRecord.dtype spells them)
_ST_DTYPES = {code: name for code, (name, _) in DTYPES.items()}

TORCH_DTYPES = {name: code for code, name in _ST_DTYPES.items()}

STEP_KINDS = ("module", "op", "backward")
STATS_FIELDS = tuple(f.name for f in fields(TensorStats))


class Invalid(Exception):
    """A problem found while decoding; ``load`` turns it into one TraceFileError."""
