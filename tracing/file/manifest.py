"""The manifest: a Trace encoded as JSON tables, and the checks that it is consistent.

A problem names a step by its place in the manifest's list, ``steps[5]`` (0-based, as the
file stores it and as ``parent``, ``end`` and ``forward`` point), never "step 5": that is
how people count steps in the app, from 1 (``tracing.formatting``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import fields
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from tracing.file.layout import (
    FORMAT_NAME,
    MAX_DEPTH,
    MAX_META_NESTING,
    STATS_FIELDS,
    STEP_KINDS,
    Invalid,
)
from tracing.file.postmortem import failure_to_json
from tracing.record import (
    SCHEMA_VERSION,
    ModuleInfo,
    SourceLocation,
    Step,
    TensorRecord,
    Trace,
)

# --------------------------------------------------------------------------- encode


def encode_manifest(trace: Trace) -> dict[str, Any]:
    """The manifest of ``trace`` (everything but the tensor values), ready for ``json``.

    Rows are tuples of field values (``json`` writes tuples as lists); only the nested
    records (source locations, stats) are flattened here.
    """
    sources: list[tuple[Any, ...]] = []
    source_index: dict[SourceLocation, int] = {}

    step_fields = [f.name for f in fields(Step)]
    source_at = step_fields.index("source")
    get_step = attrgetter(*step_fields)
    step_rows = []
    for s in trace.steps:
        row = list(get_step(s))
        src = row[source_at]
        if src is not None:
            i = source_index.get(src)
            if i is None:
                i = source_index[src] = len(sources)
                sources.append((src.file, src.line, src.text, src.function))
            row[source_at] = i
        step_rows.append(row)

    tensor_fields = [f.name for f in fields(TensorRecord)]
    stats_at = tensor_fields.index("stats")
    get_tensor = attrgetter(*tensor_fields)
    get_stats = attrgetter(*STATS_FIELDS)
    tensor_rows = []
    for r in trace.tensors:
        row = list(get_tensor(r))
        if row[stats_at] is not None:
            row[stats_at] = get_stats(row[stats_at])
        tensor_rows.append(row)

    module_fields = [f.name for f in fields(ModuleInfo)]
    get_module = attrgetter(*module_fields)
    module_rows = [get_module(m) for m in trace.modules.values()]

    return {
        "format": FORMAT_NAME,
        "schema": SCHEMA_VERSION,
        "meta": _encode_value(trace.meta),
        "error": trace.error,
        "sources": sources,
        "steps": {"fields": step_fields, "rows": step_rows},
        "tensors": {"fields": tensor_fields, "rows": tensor_rows},
        "modules": {"fields": module_fields, "rows": module_rows},
        "stats_fields": list(STATS_FIELDS),
        "failure": failure_to_json(trace.failure),
        "source_files": trace.sources,
    }


def check_trace(trace: Trace) -> None:
    """The cross-reference checks of ``load``, on the objects (cheap; run by ``save``)."""
    n_steps, n_tensors, modules = len(trace.steps), len(trace.tensors), trace.modules
    for i, r in enumerate(trace.tensors):
        if r.id != i:
            raise Invalid(f"tensor record {i} has id {r.id}, expected {i}")
        if r.producer is not None and not 0 <= r.producer < n_steps:
            raise Invalid(
                f"tensor record {i}: producer steps[{r.producer}] is out of range "
                f"(the trace has {n_steps} steps)"
            )
        if r.grad_of is not None and not 0 <= r.grad_of < n_tensors:
            raise Invalid(f"tensor record {i}: grad_of {r.grad_of} is out of range")
        if r.dims is not None and len(r.dims) != len(r.shape):
            raise Invalid(f"tensor record {i} has {len(r.dims)} axis names for {len(r.shape)} axes")
        if r.why is not None and len(r.why) != len(r.shape):
            raise Invalid(f"tensor record {i} has {len(r.why)} axis proofs for {len(r.shape)} axes")
    for i, s in enumerate(trace.steps):
        if s.index != i:
            raise Invalid(f"steps[{i}] has index {s.index}, expected {i}")
        for name, ids in (("input", s.inputs), ("output", s.outputs)):
            for t in ids:
                if not 0 <= t < n_tensors:
                    raise Invalid(
                        f"steps[{i}]: {name} tensor id {t} is out of range "
                        f"(the trace has {n_tensors} tensors)"
                    )
        for name, ref in (("parent", s.parent), ("end", s.end), ("forward", s.forward)):
            if ref is not None and not 0 <= ref < n_steps:
                raise Invalid(
                    f"steps[{i}]: {name} steps[{ref}] is out of range "
                    f"(the trace has {n_steps} steps)"
                )
        _check_nesting(trace.steps, s)
        if s.module not in modules:
            raise Invalid(f"steps[{i}]: module path {s.module!r} is not a module of the trace")
        if s.kind not in STEP_KINDS:
            raise Invalid(f"steps[{i}]: kind {s.kind!r} is not one of {', '.join(STEP_KINDS)}")
    for m in modules.values():
        if m.parent is not None and m.parent not in modules:
            raise Invalid(f"module {m.path!r} names an unknown parent {m.parent!r}")
        for c in m.children:
            if c not in modules:
                raise Invalid(f"module {m.path!r} names an unknown child {c!r}")


def consistent(steps: dict[str, Any], tensors: dict[str, Any], modules: dict) -> bool:
    """Whether :func:`check_trace` would pass, decided on whole columns at once (numpy).

    ``steps`` and ``tensors`` map field names to decoded columns. The same rules, a
    few array operations each instead of a Python loop over 50,000 records; when this
    says False, ``check_trace`` runs to name the first record that breaks one.
    """
    n_steps, n_tensors = len(steps["index"]), len(tensors["id"])
    if not (_is_arange(tensors["id"]) and _is_arange(steps["index"])):
        return False
    for column, n in ((tensors["producer"], n_steps), (tensors["grad_of"], n_tensors)):
        if not _refs_in_range(column, n):
            return False
    if any(d is not None and len(d) != len(s) for d, s in zip(tensors["dims"], tensors["shape"])):
        return False
    whys = tensors.get("why") or [None] * n_tensors
    if any(w is not None and len(w) != len(s) for w, s in zip(whys, tensors["shape"])):
        return False
    for name in ("inputs", "outputs"):
        flat = list(chain.from_iterable(steps[name]))
        if flat and not (min(flat) >= 0 and max(flat) < n_tensors):
            return False
    if not set(steps["module"]) <= modules.keys() or not set(steps["kind"]) <= set(STEP_KINDS):
        return False
    if not all(_refs_in_range(steps[name], n_steps) for name in ("parent", "end", "forward")):
        return False
    parent, end = _optional_ints(steps["parent"]), _optional_ints(steps["end"])
    index = np.arange(n_steps)
    depth = np.asarray(steps["depth"], dtype=np.int64)
    kind = np.asarray(steps["kind"], dtype=object)
    if n_steps and not (depth.min() >= 0 and depth.max() <= MAX_DEPTH):
        return False
    if ((end >= 0) & (end < index)).any():  # a call that ends before it starts
        return False
    root = parent < 0
    if (depth[root] != 0).any():
        return False
    child = np.flatnonzero(~root)
    up = parent[child]
    if (up >= child).any() or (kind[up] != "module").any():
        return False
    forward = kind[child] != "backward"
    child, up = child[forward], up[forward]
    if (depth[child] != depth[up] + 1).any():
        return False
    up_end = end[up]
    if ((up_end >= 0) & (child > up_end)).any():
        return False
    return all(
        (m.parent is None or m.parent in modules) and all(c in modules for c in m.children)
        for m in modules.values()
    )


def _is_arange(column: Any) -> bool:
    """``column`` is ``0, 1, 2, ...``."""
    return len(column) == 0 or np.array_equal(np.asarray(column), np.arange(len(column)))


def _optional_ints(column: Any) -> np.ndarray:
    """Whole numbers or None (-1), as an int64 array (values checked below 2**63 already)."""
    return np.array([-1 if v is None else v for v in column], dtype=np.int64)


def _refs_in_range(column: Any, n: int) -> bool:
    """Every value of ``column`` is None or in ``[0, n)``."""
    refs = [v for v in column if v is not None]
    return not refs or (min(refs) >= 0 and max(refs) < n)


def _check_nesting(steps: list[Step], s: Step) -> None:
    """A step's place in the call tree: its parent is an earlier module step whose call
    contains it, one level up; a module call ends at or after itself. (These make the
    tree a tree: no cycles, no unbounded chains, so every walk up it ends.) A backward
    step borrows its forward step's parent and depth, after that call has ended."""
    i = s.index
    if s.depth < 0 or s.depth > MAX_DEPTH:
        raise Invalid(f"steps[{i}] has depth {s.depth}, not between 0 and {MAX_DEPTH}")
    if s.end is not None and s.end < i:
        raise Invalid(f"steps[{i}] ends at steps[{s.end}], before it starts")
    if s.parent is None:
        if s.depth != 0:
            raise Invalid(f"steps[{i}] has depth {s.depth} but no parent (expected 0)")
        return
    if s.parent >= i:
        raise Invalid(f"steps[{i}]: parent steps[{s.parent}] does not come before it")
    parent = steps[s.parent]
    if parent.kind != "module":
        raise Invalid(f"steps[{i}]: parent steps[{s.parent}] is not a module call")
    if s.kind == "backward":
        return
    if s.depth != parent.depth + 1:
        raise Invalid(
            f"steps[{i}] has depth {s.depth} but its parent steps[{s.parent}] has depth "
            f"{parent.depth}"
        )
    if parent.end is not None and i > parent.end:
        raise Invalid(
            f"steps[{i}] lies after the end ({parent.end}) of its parent steps[{s.parent}]"
        )


def json_default(v: Any) -> Any:
    """For ``json.dumps``: what JSON has no type for (graph attributes, numpy numbers)."""
    if hasattr(v, "__dataclass_fields__"):
        return {f: getattr(v, f) for f in v.__dataclass_fields__}
    if isinstance(v, (set, frozenset)):
        return sorted(v, key=str)
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (TypeError, ValueError):
            pass
    return str(v)


def _encode_value(v: Any) -> Any:
    """``meta`` to JSON, losslessly for tuples and non-string dict keys.

    A tuple becomes ``{"__tuple__": [...]}`` and a dict with a non-string key
    ``{"__items__": [[k, v], ...]}``, so ``load`` gives back an equal ``meta``. Anything
    that is not JSON data (a dtype, a device) is stored as its ``str``.
    """
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, tuple):
        return {"__tuple__": [_encode_value(x) for x in v]}
    if isinstance(v, list):
        return [_encode_value(x) for x in v]
    if isinstance(v, Mapping):
        if all(isinstance(k, str) for k in v) and not ({"__tuple__", "__items__"} & set(v)):
            return {k: _encode_value(x) for k, x in v.items()}
        return {"__items__": [[_encode_value(k), _encode_value(x)] for k, x in v.items()]}
    torch = sys.modules.get("torch")  # a tensor comes from an imported torch: none, no tensor
    if torch is not None and isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return _encode_value(v.item())
        except (TypeError, ValueError):
            pass
    return str(v)


def decode_value(v: Any, depth: int = 0) -> Any:
    """The inverse of ``_encode_value``; raises ``Invalid`` on what it never writes
    (nesting deeper than ``MAX_META_NESTING``, an ``__items__`` entry that is not a
    ``[key, value]`` pair or whose key cannot be a dict key)."""
    if depth > MAX_META_NESTING:
        raise Invalid(f"the manifest's meta is nested deeper than {MAX_META_NESTING} levels")
    if isinstance(v, list):
        return [decode_value(x, depth + 1) for x in v]
    if isinstance(v, dict):
        if len(v) == 1 and "__tuple__" in v and isinstance(v["__tuple__"], list):
            return tuple(decode_value(x, depth + 1) for x in v["__tuple__"])
        if len(v) == 1 and "__items__" in v and isinstance(v["__items__"], list):
            out = {}
            for pair in v["__items__"]:
                if type(pair) is not list or len(pair) != 2:
                    raise Invalid("the manifest's meta has an __items__ entry that is not a pair")
                key = _hashable(decode_value(pair[0], depth + 1))
                try:
                    out[key] = decode_value(pair[1], depth + 1)
                except TypeError:
                    raise Invalid("the manifest's meta has a key that cannot be one") from None
            return out
        return {k: decode_value(x, depth + 1) for k, x in v.items()}
    return v


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, (list, tuple)) else v


def graph_data(trace: Trace) -> dict[str, Any] | None:
    """``node_link_data`` of the trace graph, made JSON-safe (None if no graph module)."""
    try:
        import networkx as nx

        graph = trace.graph
    except ImportError:  # the graph module is optional for the file format
        return None
    return nx.node_link_data(graph, edges="edges")
