"""Attention by what it does: a softmax whose output contracts its key axis with values.

An attention map is recognised from the data flow of the recorded ops, wherever the code
sits and whatever its modules are called:

    scores = q @ k^T ...            (any way: matmul, einsum, a mask, a bias, a sink column)
    map    = softmax(scores, dim=-1)                           # the key axis is the last
    map'   = dropout / cast / mask fill / a slice / heads folded into the batch (map)
    out    = map' @ v   |   einsum("b h i j, b h j d -> b h i d", map', v)   |   bmm

The softmax is a *candidate* when it normalises the last axis of a rank-3 or rank-4 tensor;
it becomes a map when a contraction (:data:`MIXES`) takes it, directly or through ops that
carry it on element for element (:data:`SAME_MAP`, :data:`REFOLD`), and sums over its key
axis (the softmax's axis) against another operand, the values, while keeping its query
axis (the one before) in the output and out of the values. That excludes what only looks
like a map: a router's softmax whose experts are summed per token (the token axis is in
the expert outputs too), a softmax reduced by ``mul`` then ``sum``, a mixing matrix that is
added to before use. A fused attention call (``F.scaled_dot_product_attention``,
``F.multi_head_attention_forward``) is attention by definition; its map is rebuilt from its
arguments (:mod:`tracing.capture.fused_attention`, :mod:`tracing.capture.heads`).

:class:`MapFinder` does this while a trace records (the tracer hands it each softmax and
each contraction); :func:`values_mix` walks the same way forward on a finished trace, to
the op that makes the per-head output a head edit changes (:mod:`tracing.capture.heads`).
Whether a recognised map is a map *of tokens*, shown in the Attention tab, is settled once
its axes are named (:mod:`tracing.capture.attention_roles`). A trace without ops
(``ops=False``) has no data flow to read: there :func:`returned_weights` reads a module's
second output by its values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

MIXES = frozenset({"matmul", "bmm", "einsum"})
"""Ops that contract an attention map with the values."""

SAME_MAP = frozenset(
    {
        "getitem", "to", "type_as", "type", "float", "half", "bfloat16", "double", "dropout",
        "contiguous", "clone", "masked_fill", "detach",
    }
)  # fmt: skip
"""Ops that pass a map on to the values unchanged per element, keeping its rank and its
first two axes: a cast, dropout, a mask filled in after the softmax (CPM-Ant), or a slice
that keeps every head (GPT-OSS's and x-transformers' attention sinks: the softmax runs over
the keys and a sink column, ``probs[..., :-1]`` drops the sink, and that slice meets the
values)."""

REFOLD = frozenset({"view", "reshape"})
"""Views that fold a map's heads into the batch or unfold them, ``(B, H, T, S)`` <->
``(B·H, T, S)`` (XGLM, Bloom): the same rows, batch outer, so each head stays a head."""

SOFTMAXES = frozenset({"softmax", "_softmax"})

_HOPS = 4  # ops between a softmax and its contraction (cast, dropout, slice, refold)


def refolds(shape: Sequence[int], like: Sequence[int]) -> bool:
    """Whether ``shape`` is ``like`` with its heads folded into the batch, or unfolded."""
    if len(shape) + len(like) != 7 or tuple(shape[-2:]) != tuple(like[-2:]):
        return False
    return math.prod(shape[:-2]) == math.prod(like[:-2])


def carries_map(op: str, out_shape: Sequence[int], in_shape: Sequence[int]) -> bool:
    """Whether op ``op`` turning ``in_shape`` into ``out_shape`` still holds the same map
    (its key axis last, each head a head)."""
    if op in SAME_MAP:
        return len(out_shape) == len(in_shape) and tuple(out_shape[:2]) == tuple(in_shape[:2])
    return op in REFOLD and refolds(out_shape, in_shape)


def softmax_axis(args: tuple, kwargs: dict | None, rank: int) -> int | None:
    """The axis a ``softmax`` / ``_softmax`` call normalises, from 0; None when not given."""
    dim = (kwargs or {}).get("dim")
    if dim is None and len(args) > 1 and isinstance(args[1], int):
        dim = args[1]
    if not isinstance(dim, int) or not -rank <= dim < rank:
        return None
    return dim % rank


def einsum_terms(equation: str, operands: int) -> tuple[list[str], str] | None:
    """(input subscripts, output subscript) of an einsum equation, the implicit output
    (letters used once, in order) filled in; None when it cannot be read."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != operands:
        return None
    if not arrow:
        letters = "".join(terms).replace(".", "")
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, rhs


def contracts_key(name: str, args: tuple, position: int, operands: int) -> bool:
    """Whether contraction ``name`` called with ``args`` sums its tensor operand number
    ``position`` (a map, key axis last) over that key axis against another operand, keeping
    the query axis (the one before) in its output and out of the other operands."""
    if name in ("matmul", "bmm"):
        return position == 0  # rows of the first operand kept, its last axis summed
    if name != "einsum" or not args or not isinstance(args[0], str):
        return False
    found = einsum_terms(args[0], operands)
    if found is None:
        return False
    terms, out = found
    term = terms[position]
    if term.endswith("...") or len(term.replace("...", "")) < 2:
        return False
    query, key = term[-2], term[-1]
    others = "".join(t for i, t in enumerate(terms) if i != position)
    return key in others and key not in out and query in out and query not in others


def operands(args: tuple, kwargs: dict | None) -> list:
    """A call's tensor arguments in the order the tracer records them as inputs:
    positional ones (and those in a list, as ``einsum(eq, [a, b])`` takes them), then
    keyword ones."""
    found = []
    for a in args:
        if isinstance(a, (tuple, list)):
            found += [b for b in a if isinstance(b, torch.Tensor)]
        elif isinstance(a, torch.Tensor):
            found.append(a)
    return found + [a for a in (kwargs or {}).values() if isinstance(a, torch.Tensor)]


def per_head_output(out_shape: Sequence[int], map_shape: Sequence[int]) -> bool:
    """Whether a contraction's output ``out_shape`` is the per-head output of a map shaped
    ``map_shape`` laid out as a head edit reads it: the map's axes but the key, in order,
    then the values' width (``(B, H, T, D)`` from ``(B, H, T, S)``). An einsum that reads
    the map otherwise (its entropy per query, ``b h i j, b h i j -> b h i``) is not the
    values' contraction; one that mixes the values into another layout (XLNet's
    ``bnij,jbnd->ibnd``) is, but has no heads on axis 1 to edit."""
    return len(out_shape) == len(map_shape) and tuple(out_shape[:-1]) == tuple(map_shape[:-1])


# --------------------------------------------------------------------------- while recording


class MapFinder:
    """The softmaxes a trace is recording, until a contraction proves one a map.

    It reads the tracer's drafts through two lists only: ``steps`` (each with ``op``,
    ``kind``, ``inputs``, ``end``) and ``tensors`` (each with ``producer`` and ``shape``).
    A candidate holds its tensor, so that a map's value is kept as the softmax made it,
    until the module call around the one that made it ends (an ``nn.Softmax`` child's map
    meets the values in its parent), or until it is proven.
    """

    def __init__(self, steps: list, tensors: list):
        self.steps, self.tensors = steps, tensors
        self.pending: dict[int, tuple[Any, int]] = {}  # rid -> (tensor, holding call step)

    def softmax(self, rid: int, tensor: Any, args: tuple, kwargs: dict | None, holder: int):
        """Note softmax output ``rid`` as a candidate if it normalises the last axis of a
        rank-3 or rank-4 tensor; ``holder`` is the step of the module call it lives in."""
        rank = tensor.dim()
        if rank not in (3, 4) or softmax_axis(args, kwargs, rank) != rank - 1:
            return
        steps = self.steps
        for old in [r for r, (_, h) in self.pending.items() if steps[h].end is not None]:
            del self.pending[old]
        self.pending[rid] = (tensor, holder)

    def contraction(
        self, name: str, args: tuple, kwargs: dict | None, in_ids: Sequence[int]
    ) -> list[tuple[int, Any]]:
        """(record id, tensor) of each candidate this contraction proves a map; and of the
        map as it meets the values when a slice on the way changed it (a sink column
        dropped): that is the map of the tokens, the one a model returns."""
        if not self.pending:
            return []
        found = []
        for position, rid in enumerate(in_ids):
            source = self._source(rid)
            if source is None or not contracts_key(name, args, position, len(in_ids)):
                continue
            tensor = self.pending.pop(source)[0]
            found.append((source, tensor))
            used = operands(args, kwargs)[position]
            if used.dim() == tensor.dim() and used.shape != tensor.shape:
                found.append((rid, used))
        return found

    def _source(self, rid: int) -> int | None:
        """The candidate softmax output that ``rid`` carries on (itself included)."""
        tensors, steps = self.tensors, self.steps
        for _ in range(_HOPS + 1):
            if rid in self.pending:
                return rid
            producer = tensors[rid].producer
            if producer is None:
                return None
            step = steps[producer]
            if step.kind != "op" or not step.inputs:
                return None
            before = step.inputs[0]
            if not carries_map(step.op, tensors[rid].shape, tensors[before].shape):
                return None
            rid = before
        return None


def returned_weights(t: torch.Tensor) -> bool:
    """Whether ``t``, a module's second output, is attention weights by its values: rank 4,
    each row a distribution (non-negative, summing to 1). What a trace without ops
    (``ops=False``) has to go by, where no softmax and no contraction is recorded; a
    tensor on the meta device has no values to show it."""
    if t.dim() != 4 or t.device.type == "meta" or not t.is_floating_point() or not t.numel():
        return False
    with torch.no_grad():
        w = t.detach().float()
        rows = w.sum(-1)
        return bool((w >= 0).all()) and bool(torch.allclose(rows, torch.ones_like(rows), atol=1e-3))


# --------------------------------------------------------------------------- on a trace


def values_mix(trace, rec, consumers: dict[int, list]):
    """The op that contracts map ``rec`` with the values in a finished trace, its output
    the per-head output (:func:`per_head_output`): a consumer of it, directly or through
    ops that carry it on (:func:`carries_map`); None when none. ``consumers``: record id
    -> the steps that take it as an input."""
    frontier, seen = [rec.id], {rec.id}
    for _ in range(_HOPS):
        following = []
        for rid in frontier:
            shape = tuple(trace.tensor(rid).shape)
            for c in consumers.get(rid, ()):
                if c.kind != "op" or not c.outputs:
                    continue
                out = c.outputs[0]
                out_shape = tuple(trace.tensor(out).shape)
                mixes = c.op == "einsum" or (c.op in MIXES and c.inputs[0] == rid)
                if mixes and per_head_output(out_shape, shape):
                    return c  # (which operand of an einsum was checked while recording)
                if out in seen or c.inputs[0] != rid:
                    continue
                if carries_map(c.op, out_shape, shape):
                    seen.add(out)
                    following.append(out)
        frontier = following
    return None


__all__ = [
    "MIXES",
    "REFOLD",
    "SAME_MAP",
    "MapFinder",
    "carries_map",
    "contracts_key",
    "einsum_terms",
    "operands",
    "per_head_output",
    "refolds",
    "returned_weights",
    "softmax_axis",
    "values_mix",
]
