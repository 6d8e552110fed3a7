"""Which axes of a trace are one axis: what an op says, not what sizes suggest.

An op often *is* a statement that two axes are the same thing: a ``linear`` contracts the
input's last axis with the weight's columns and gives the output the weight's rows; a norm's
weight lines up with the last axis it scales; an ``add`` of two ``(B, T, C)`` tensors keeps
each axis; a ``transpose`` moves them. :func:`axis_links` lists those statements, one pair
of ``(tensor id, axis)`` each, and :class:`Axes` joins them into classes. Naming uses them
both ways (:func:`tracing.dims.naming.name_axes`): a name proven anywhere in a class is the
name of every axis in it, so the residual stream of a vision transformer is ``C`` because
its norm's weight is declared ``C``, and a classifier's 11 rows stay ``?`` even where the
width is 11 too, because nothing joins them to the width.

Only links that need no guess are listed: an op whose output could reorder axes of equal
sizes (a transpose with ``B == T``, a reduction) links only what the line or the shapes
say without doubt.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tracing.dims.rules import CATS, CONVS, MATMULS, MOVES_AXES, RESHAPES, SLICES, TRANSPOSES
from tracing.dims.source import call_args, permutation, text_of, transpose_axes
from tracing.record import Step, TensorRecord

Axis = tuple[int, int]  # (tensor id, axis)
Pair = tuple[int | None, ...]

_NOT_ELEMENTWISE = (
    TRANSPOSES
    | RESHAPES
    | SLICES
    | MATMULS
    | CONVS
    | CATS
    | MOVES_AXES
    | {"permute", "linear", "embedding", "einsum", "stack", "index_select", "gather", "take"}
    | {"scatter", "scatter_add", "index_add", "index_copy", "index_put", "masked_scatter"}
    | {"diag", "diag_embed", "diagonal", "rot90", "tril_indices", "triu_indices", "roll"}
)
"""Ops whose output keeps its inputs' axes in place only by accident of the sizes."""


def axis_links(steps: Sequence[Step], tensors: Sequence[TensorRecord], pairs, names=None) -> list:
    """Every pair of axes an op says are one axis, as ``((rid, axis), (rid, axis))``.
    ``pairs[rid][axis]`` is an axis's size in each pass (:mod:`tracing.dims.naming`).
    With ``names`` (each tensor's names so far), only the links that touch an axis still
    ``?``: two named axes joined teach nothing (and a trace all named costs nothing)."""
    out: list[tuple[Axis, Axis]] = []
    if names is not None:
        open_ = {rid for rid, n in enumerate(names) if n is None or "?" in n}
        if not open_:
            return out
    else:
        open_ = None
    broadcasts: dict[tuple, tuple] = {}  # an elementwise step's sizes -> the axes it joins
    keeps: dict[str, bool] = {}
    for step in steps:
        if step.kind != "op" or not step.outputs:
            continue
        if open_ is not None and open_.isdisjoint(step.outputs) and open_.isdisjoint(step.inputs):
            continue  # every axis it touches is named already
        op = step.op
        keep = keeps.get(op)
        if keep is None:
            keep = keeps[op] = keeps_axes(op)
        if keep:  # by its sizes alone, which a loop's steps share: worked out once
            _elementwise_links(step, pairs, out, names, broadcasts)
            continue
        try:
            _links_of(step, tensors, pairs, out, names)
        except (IndexError, ValueError):
            continue
    return out


def _links_of(step: Step, tensors, pairs, out: list, names=None) -> None:
    op, ins = step.op, step.inputs
    rank = [len(tensors[i].shape) for i in ins]
    res = step.outputs[0]
    n = len(tensors[res].shape)

    def link(a: int, i: int, b: int, j: int) -> None:
        if names is not None:
            na, nb = names[a], names[b]
            if na is not None and nb is not None and na[i] != "?" and nb[j] != "?":
                return
        pa, pb = pairs[a][i], pairs[b][j]
        if (pa == pb and pa[0] != 1) or (pa[0] == pb[0] != 1 and same_axis(pa, pb)):
            out.append(((a, i), (b, j)))

    if op == "linear" and len(ins) >= 2 and rank[1] == 2:
        x, w = ins[0], ins[1]
        link(x, rank[0] - 1, w, 1)  # contracted
        link(res, n - 1, w, 0)  # the weight's rows
        for a in range(min(n, rank[0]) - 1):
            link(res, a, x, a)
        if len(ins) >= 3 and rank[2] == 1:
            link(ins[2], 0, w, 0)
    elif op == "embedding" and len(ins) >= 2 and rank[1] == 2:
        ids, table = ins[0], ins[1]
        link(res, n - 1, table, 1)
        for a in range(min(rank[0], n - 1)):
            link(res, a, ids, a)
    elif op in CONVS and len(ins) >= 2:
        x, w = ins[0], ins[1]
        link(res, 0, x, 0)
        link(res, 1, w, 0)
        if len(ins) >= 3 and rank[2] == 1:
            link(ins[2], 0, w, 0)
    elif op in MATMULS and len(ins) >= 2 and min(rank[-2:]) >= 2:
        a, b = ins[-2], ins[-1]
        ra, rb = len(tensors[a].shape), len(tensors[b].shape)
        link(a, ra - 1, b, rb - 2)  # contracted
        link(res, n - 2, a, ra - 2)
        link(res, n - 1, b, rb - 1)
        for back in range(3, n + 1):
            for t, r in ((a, ra), (b, rb)):
                if r - back >= 0:
                    link(res, n - back, t, r - back)
    elif op == "einsum":
        _einsum_links(step, tensors, link)
    elif op in TRANSPOSES or op == "permute":
        _moved_links(step, tensors, pairs, link)
    elif op in RESHAPES:
        _reshape_links(ins[0], res, pairs, link)
    elif op in CATS and len(step.outputs) == 1:
        for t in ins:
            if len(tensors[t].shape) == n:
                for a in range(n):
                    link(res, a, t, a)  # every axis but the one the parts add up on
    elif op in SLICES and ins:
        for o in step.outputs:
            if len(tensors[o].shape) == rank[0]:
                for a in range(rank[0]):
                    link(o, a, ins[0], a)  # the axes a slice leaves whole
            elif len(tensors[o].shape) < rank[0] <= 8:
                _dropped_links(ins[0], o, pairs, link)
        if len(step.outputs) >= 2 and _cut_to_one_size(step):
            _equal_parts_links(step, tensors, link)
    elif op in ("unsqueeze", "squeeze", "expand", "expand_as") and ins:
        _kept_links(ins[0], res, tensors, pairs, link)
    elif op == "multi_head_attention_forward" and len(ins) >= 2 and rank[0] == 3:
        _torch_attention_links(step, tensors, link)
    elif op == "scaled_dot_product_attention" and len(ins) >= 3 and min(rank[:3]) >= 2:
        q, k, v = ins[:3]
        link(q, rank[0] - 1, k, rank[1] - 1)  # contracted
        link(k, rank[1] - 2, v, rank[2] - 2)  # the keys are the values' rows
        for a in range(min(n, rank[0]) - 1):
            link(res, a, q, a)  # the queries' batch, heads and tokens
        link(res, n - 1, v, rank[2] - 1)
    # an op that keeps its axes (keeps_axes) never comes here: axis_links joins its axes


def keeps_axes(op: str) -> bool:
    """Whether ``op`` keeps its inputs' axes in place (broadcasting): an elementwise op, a
    softmax, a mask; not a reshape, a product, a gather, an attention."""
    return op not in _NOT_ELEMENTWISE and "attention" not in op.lower()


def _torch_attention_links(step: Step, tensors, link) -> None:
    """``F.multi_head_attention_forward`` (inside ``nn.MultiheadAttention``): the query
    ``(L, N, E)``, the key ``(S, N, E)``; its output ``(L, N, E)``, its weights
    ``(N, H, L, S)``, or ``(N, L, S)`` averaged over the heads."""
    q, k = step.inputs[0], step.inputs[1]
    out, *weights = step.outputs
    if len(tensors[out].shape) == 3:
        link(out, 0, q, 0)
        link(out, 1, q, 1)
        link(out, 2, q, 2)
    matrices = [
        i for i in step.inputs[3:] if tensors[i].role == "param" and len(tensors[i].shape) == 2
    ]
    if len(matrices) >= 2:  # in_proj_weight (or q_proj_weight) first, out_proj.weight last
        link(q, 2, matrices[0], 1)
        link(out, 2, matrices[-1], 0)
    for w in weights:  # the map, and the heads' outputs (N, H, L, D) the tracer records
        rank = len(tensors[w].shape)
        if tensors[w].role == "attention" and rank in (3, 4) and len(tensors[k].shape) == 3:
            link(w, 0, q, 1)
            link(w, rank - 2, q, 0)
            link(w, rank - 1, k, 0)
        elif rank == 4:
            link(w, 0, q, 1)
            link(w, 2, q, 0)


def _dropped_links(src: int, res: int, pairs, link) -> None:
    """An integer index drops axes and keeps the rest in order (``x[:, 0]`` of ``(B, T, C)``
    is ``(B, C)``): linked where one choice of kept axes alone fits the sizes."""
    a, b = pairs[src], pairs[res]
    fits = [
        kept
        for kept in itertools.combinations(range(len(a)), len(b))
        if all(same_axis(a[i], p) for i, p in zip(kept, b))
    ]
    if len(fits) == 1:
        for j, i in enumerate(fits[0]):
            link(res, j, src, i)


def _cut_to_one_size(step: Step) -> bool:
    """Whether the op itself makes its parts one size: ``chunk`` always (all but a
    smaller last part), ``split`` where its line writes the size as a number
    (``split(64, dim=-1)``). Not a ``split`` by a list, nor by a name that may hold one:
    ``split([q, kv, kv])`` makes equal parts only where ``H == KV`` happen to."""
    if step.op == "chunk":
        return True
    if step.op != "split":
        return False
    text = text_of(step)
    calls = call_args(text, "split")
    if len(calls) != 1 or not calls[0]:
        return False
    args = calls[0]
    if "torch.split(" in text:  # torch.split(x, 64): the size is the second argument
        return len(args) >= 2 and args[1].isdigit()
    return args[0].isdigit()


def _equal_parts_links(step: Step, tensors, link) -> None:
    """The parts an op cuts to one size (:func:`_cut_to_one_size`) are one size, by the op
    (not by a size that happens to match: ``link`` still asks for equal sizes in every
    pass). A fused projection cut in three, ``qkv.chunk(3, dim=-1)``: where the queries'
    width is proven, the keys' and the values' is that width too. A smaller last part (the
    remainder) is no such part."""
    src = tensors[step.inputs[0]].shape
    outs = step.outputs
    shapes = [tensors[o].shape for o in outs]
    if any(len(s) != len(src) for s in shapes):
        return
    cut = [a for a in range(len(src)) if any(s[a] != src[a] for s in shapes)]
    if len(cut) != 1:
        return
    for o in outs[1:]:
        link(o, cut[0], outs[0], cut[0])


def _elementwise_links(step: Step, pairs, out: list, names, known: dict) -> None:
    """An op whose one output has the broadcast shape of its inputs: axes aligned from the
    right are one axis (``x + bias``, ``norm(x)`` and its weight, ``softmax``, a cast).
    Which axes those are depends on the sizes alone (``known`` keeps each answer); the
    links that join two axes named already are left out, as :func:`_links_of` does."""
    if len(step.outputs) != 1:
        return
    res, ins = step.outputs[0], step.inputs
    key = (tuple(pairs[res]), *[tuple(pairs[t]) for t in ins])
    joined = known.get(key)
    if joined is None:
        joined = known[key] = _broadcast_axes(key[0], key[1:])
    for k, a, b in joined:
        t = ins[k]
        if names is not None:
            na, nb = names[res], names[t]
            if na is not None and nb is not None and na[a] != "?" and nb[b] != "?":
                continue
        out.append(((res, a), (t, b)))


def _broadcast_axes(result: Sequence[Pair], inputs: Sequence[Sequence[Pair]]) -> tuple:
    """``(input k, output axis, its axis)`` for each axis of a broadcast that is one axis by
    its sizes in every pass; nothing where an input is no broadcast of the output (a
    reduction, a gather, an index)."""
    shape = [p[0] for p in result]
    n = len(shape)
    for s in inputs:
        if len(s) > n or any(a[0] != 1 and a[0] != b for a, b in zip(s[::-1], shape[::-1])):
            return ()
    joined = []
    for k, s in enumerate(inputs):
        m = len(s)
        for back in range(1, m + 1):
            pa, pb = result[n - back], s[m - back]
            if pb[0] != 1 and same_axis(pa, pb):
                joined.append((k, n - back, m - back))
    return tuple(joined)


def _einsum_links(step: Step, tensors, link) -> None:
    from tracing.dims.rules import einsum_subscripts

    found = einsum_subscripts(text_of(step), len(step.inputs))
    if found is None:
        return
    operands, result = found
    where: dict[str, tuple[int, int]] = {}
    for sub, a in zip(result, range(len(result))):
        where.setdefault(sub, (step.outputs[0], a))
    for t, subs in zip(step.inputs, operands):
        if len(subs) != len(tensors[t].shape):
            return
        for a, sub in enumerate(subs):
            if sub in where:
                link(*where[sub], t, a)
            else:
                where[sub] = (t, a)


def _moved_links(step: Step, tensors, pairs, link) -> None:
    """Which axis went where: the call on the line, else the sizes in every pass where
    they leave one choice (``B == T`` in the trace, apart in the inputs pass)."""
    src, res = step.inputs[0], step.outputs[0]
    in_shape, out_shape = tensors[src].shape, tensors[res].shape
    if len(in_shape) != len(out_shape):
        return
    perm = permutation(step, len(in_shape)) if step.op == "permute" else None
    if perm is None and step.op != "permute":
        axes = transpose_axes(step, in_shape, out_shape)
        if axes is not None:
            a, b = axes
            perm = [b if j == a else a if j == b else j for j in range(len(in_shape))]
    if perm is None:  # by the sizes in every pass: one input axis per output axis
        found = [[i for i, p in enumerate(pairs[src]) if p == q] for q in pairs[res]]
        if any(len(f) != 1 for f in found) or len({f[0] for f in found}) != len(found):
            return
        perm = [f[0] for f in found]
    for j, p in enumerate(perm):
        link(res, j, src, p)


def view_groups(a_pairs, b_pairs) -> list[tuple[list[int], list[int]]] | None:
    """A view's axes matched up, size-one axes left out: each group of input axes with the
    group of output axes of the same product, in order (``(B, T, C) -> (B, T, H, D)`` is
    ``[0]-[0], [1]-[1], [2]-[2, 3]``); ``None`` where the sizes do not line up."""
    keep_a = [i for i, p in enumerate(a_pairs) if p[0] != 1]
    keep_b = [j for j, p in enumerate(b_pairs) if p[0] != 1]
    out, i, j = [], 0, 0
    while i < len(keep_a) and j < len(keep_b):
        gi, gj = [keep_a[i]], [keep_b[j]]
        pi, pj = a_pairs[gi[0]][0], b_pairs[gj[0]][0]
        while pi != pj:
            if pi < pj and i + len(gi) < len(keep_a):
                gi.append(keep_a[i + len(gi)])
                pi *= a_pairs[gi[-1]][0]
            elif pj < pi and j + len(gj) < len(keep_b):
                gj.append(keep_b[j + len(gj)])
                pj *= b_pairs[gj[-1]][0]
            else:
                return None
        out.append((gi, gj))
        i, j = i + len(gi), j + len(gj)
    return out


def _reshape_links(src: int, res: int, pairs, link) -> None:
    """A view keeps an axis where the sizes line up one to one (not where it splits or
    merges): ``(B, T, C) -> (B, T, H, D)`` keeps ``B`` and ``T``."""
    for gi, gj in view_groups(pairs[src], pairs[res]) or ():
        if len(gi) == 1 and len(gj) == 1:
            link(res, gj[0], src, gi[0])


def _kept_links(src: int, res: int, tensors, pairs, link) -> None:
    """``unsqueeze`` and ``squeeze`` keep the axes bigger than 1 in order; ``expand`` keeps
    those, aligned from the right, that it does not grow from 1."""
    a = [i for i, p in enumerate(pairs[src]) if p[0] != 1]
    b = [j for j, p in enumerate(pairs[res]) if p[0] != 1]
    if len(a) == len(b):
        for i, j in zip(a, b):
            link(res, j, src, i)
        return
    s, t = tensors[src].shape, tensors[res].shape
    for back in range(1, min(len(s), len(t)) + 1):
        if s[-back] == t[-back]:
            link(res, len(t) - back, src, len(s) - back)


def same_axis(a: Pair, b: Pair) -> bool:
    """One axis by its sizes: equal in the trace and wherever both passes paired it."""
    return a[0] == b[0] and all(x == y or x is None or y is None for x, y in zip(a[1:], b[1:]))


class Axes:
    """Union-find over ``(tensor id, axis)``: the classes of axes the ops say are one."""

    def __init__(self, links: Sequence[tuple[Axis, Axis]]):
        self.parent: dict[Axis, Axis] = {}
        parent = self.parent
        for a, b in links:
            ra = a
            while (up := parent.get(ra, ra)) != ra:  # path halving, inline
                parent[ra] = parent.get(up, up)
                ra = parent[ra]
            rb = b
            while (up := parent.get(rb, rb)) != rb:
                parent[rb] = parent.get(up, up)
                rb = parent[rb]
            if ra != rb:
                parent[ra] = rb
            if b not in parent:
                parent[b] = b

    def find(self, x: Axis) -> Axis:
        parent = self.parent
        while (up := parent.get(x, x)) != x:
            parent[x] = parent.get(up, up)
            x = parent[x]
        return x

    def classes(self) -> dict[Axis, list[Axis]]:
        """Each class of two or more axes, by its root."""
        out: dict[Axis, list[Axis]] = {}
        find = self.find
        for x in self.parent:
            out.setdefault(find(x), []).append(x)
        return {root: members for root, members in out.items() if len(members) > 1}
