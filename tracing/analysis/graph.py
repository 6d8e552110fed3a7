"""The trace as a graph: data flow between steps, with the module hierarchy as attributes.

``build_graph(trace)`` has a node per step (its index) and an edge ``producer -> consumer``
for every tensor a step consumed that another step produced; the edge carries the tensor
id and shape. A module's output that is its last op's output is one tensor whose
producer is that op, so the residual ``x + attn(x)`` shows as an edge from the op that
made the block input straight to the ``add``.

``collapse(trace, depth)`` is the block-level view a diagram draws: every step deeper than
``depth`` is folded into its enclosing module call at ``depth`` (each call its own node),
edges between groups are kept, self loops dropped. Module calls shallower than ``depth``
whose insides are shown are *containers*; they are left out unless asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:  # pragma: no cover
    from tracing.record import Step, Trace


def _out_shape(trace: Trace, step: Step) -> str:
    if not step.outputs:
        return ""
    return trace.tensors[step.outputs[0]].shape_str()


def _node_label(step: Step) -> str:
    if step.kind == "module":
        name = step.module.rsplit(".", 1)[-1] if step.module else "<root>"
        label = f"{name} ({step.op})"
        return label if step.call == 0 else f"{label} #{step.call}"
    return step.op


# --------------------------------------------------------------------------- full graph


def _step_attrs(trace: Trace, step) -> dict:
    """The node attributes every view of a step shares."""
    return {
        "kind": step.kind,
        "module": step.module,
        "op": step.op,
        "depth": step.depth,
        "parent": step.parent,
        "call": step.call,
        "label": _node_label(step),
        "shape": _out_shape(trace, step),
        "error": step.error,
    }


def build_graph(trace: Trace) -> nx.DiGraph:
    """A node per step, an edge per (producer step -> consumer step) tensor hand-over."""
    g = nx.DiGraph()
    for step in trace.steps:
        g.add_node(step.index, **_step_attrs(trace, step), end=step.end)
    tensors = trace.tensors
    for step in trace.steps:
        for tensor_id in step.inputs:
            record = tensors[tensor_id]
            producer = record.producer
            if producer is None or producer == step.index:
                continue
            # a module step does not consume what was made inside itself
            if g.has_edge(producer, step.index):
                continue
            g.add_edge(producer, step.index, tensor=tensor_id, shape=record.shape_str())
    return g


# --------------------------------------------------------------------------- collapsed view


def group_of(trace: Trace, depth: int) -> list[int]:
    """For each step, the step it folds into at ``depth`` (itself if not deeper; a
    backward step, the group of its forward step, or the root call's for the loss).

    One pass in step order: a parent comes before its steps (``tracing.load`` checks it,
    the tracer makes it so), so its group is known when its children are reached. A step
    whose parent does not come first (a hand-made trace) is its own group.
    """
    steps = trace.steps
    groups: list[int] = []
    for step in steps:
        index, parent = step.index, step.parent
        if step.kind == "backward":  # folds where the forward step it differentiates does
            forward = step.forward
            groups.append(groups[forward] if forward is not None and forward < index else 0)
        elif step.depth <= depth or parent is None or not 0 <= parent < index:
            groups.append(index)
        elif steps[parent].depth <= depth:
            groups.append(parent)
        else:
            above = groups[parent]  # the parent's own group, or itself if it has none
            groups.append(index if above == parent else above)
    return groups


def collapse(trace: Trace, depth: int, containers: bool = False) -> nx.DiGraph:
    """Every step deeper than ``depth`` folded into its module call at ``depth``.

    Nodes keep the attributes of their representative step plus ``members`` (the step
    indices folded in, its own first) and ``path`` (the module path). Module calls at a
    depth below ``depth`` that have steps inside them are containers (``container=True``);
    they are left out unless ``containers=True``.
    """
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    groups = group_of(trace, depth)
    members: dict[int, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    is_container = {
        step.index: step.kind == "module"
        and step.depth < depth
        and step.end is not None
        and step.end > step.index
        for step in trace.steps
    }
    g = nx.DiGraph()
    for group, indices in members.items():
        if is_container[group] and not containers:
            continue
        step = trace.steps[group]
        g.add_node(
            group,
            **_step_attrs(trace, step),
            path=step.module,
            members=tuple(indices),
            container=is_container[group],
        )
    tensors = trace.tensors
    for step in trace.steps:
        consumer = groups[step.index]
        if consumer not in g:
            continue
        for tensor_id in step.inputs:
            producer_step = tensors[tensor_id].producer
            if producer_step is None:
                continue
            producer = groups[producer_step]
            if producer == consumer or producer not in g:
                continue
            if not g.has_edge(producer, consumer):
                g.add_edge(
                    producer, consumer, tensor=tensor_id, shape=tensors[tensor_id].shape_str()
                )
    return g


# --------------------------------------------------------------------------- export


def _graphml_safe(g: nx.DiGraph, node_attrs: dict | None = None) -> nx.DiGraph:
    """GraphML takes str/int/float/bool attributes only: stringify the rest, drop None;
    ``node_attrs``: more attributes per node (``{node: {name: value}}``)."""
    out = nx.DiGraph()

    def clean(attrs: dict) -> dict:
        cleaned = {}
        for key, value in attrs.items():
            if value is None:
                continue
            if isinstance(value, (str, int, float, bool)):
                cleaned[key] = value
            else:
                cleaned[key] = str(value)
        return cleaned

    for node, attrs in g.nodes(data=True):
        more = node_attrs.get(node) if node_attrs else None
        out.add_node(node, **clean({**attrs, **more} if more else attrs))
    for u, v, attrs in g.edges(data=True):
        out.add_edge(u, v, **clean(attrs))
    return out


def to_graphml(
    trace: Trace,
    path: str | Path,
    depth: int | None = None,
    node_attrs: dict | None = None,
) -> None:
    """Write the step graph (or the collapsed view at ``depth``) as GraphML;
    ``node_attrs``: more attributes per node (``{node: {name: text}}``, the report's
    ``proofs``)."""
    g = trace.graph if depth is None else collapse(trace, depth)
    nx.write_graphml(_graphml_safe(g, node_attrs), str(path))
