"""The axes an op joins (:mod:`tracing.dims.links`), on hand-built records.

Here ``C`` is declared by a module attribute (``attn.embed_dim``), not by a config: it names
an axis only where the module it runs in declares it, or where an op joins the axis to one
so named. A size that matches is never enough.
"""

from __future__ import annotations

from test_rules import Walk

from tracing.dim_legend import proof_text
from tracing.dims.evidence import Evidence, Pass
from tracing.dims.letters import Sized
from tracing.dims.links import Axes, axis_links
from tracing.dims.naming import _quotient, name_axes

SIZES = {"B": 2, "T": 5, "C": 12}


def named(w: Walk):
    letters = {
        "C": Sized(12, "module attribute attn.embed_dim"),
        "B": Sized(2, "input: the first input's axis 0"),
        "T": Sized(5, "input: the first input's axis 1"),
    }
    inputs = Pass("inputs", "device", {**SIZES, "B": 3, "T": 9}, w.other)
    evidence = Evidence(
        letters=letters, inputs=inputs, param_paths=w.paths, attributes={"attn": {"C": 12}}
    )
    records, _ = name_axes(w.steps, w.tensors, evidence)
    return [r.dims for r in records], [r.why for r in records]


def test_a_name_proven_downstream_names_the_axis_it_joins():
    """The input's width is 12, C's size, but only the ``attn`` module declares C: the
    scale it multiplies by there is C, and ``mul`` joins the two axes."""
    w = Walk(sizes=SIZES)
    x = w.input((2, 5, 12), (3, 9, 12))
    y = w.op("relu", [x], [(2, 5, 12)], [(3, 9, 12)], module="")
    scale = w.param((12,), "attn.scale")
    z = w.op("mul", [y, scale], [(2, 5, 12)], [(3, 9, 12)], module="attn")
    names, why = named(w)
    assert names[scale] == ("C",) and why[scale] == ("declared attn",)
    assert names[x] == ("B", "T", "C") and names[y] == ("B", "T", "C")
    assert names[z] == ("B", "T", "C")
    assert why[x][2] == f"same #{scale}"
    assert proof_text(why[x][2]).startswith(f"the same axis as tensor #{scale}'s")


def test_rows_of_the_width_size_that_no_op_joins_to_it_stay_unnamed():
    """A classifier with as many classes as the width: its rows are 12 like C, but nothing
    declares them and no op joins them to a C axis."""
    w = Walk(sizes=SIZES)
    x = w.input((2, 5, 12), (3, 9, 12))
    scale = w.param((12,), "attn.scale")
    y = w.op("mul", [x, scale], [(2, 5, 12)], [(3, 9, 12)], module="attn")
    head = w.param((12, 12), "head.weight")
    logits = w.op("linear", [y, head], [(2, 5, 12)], [(3, 9, 12)], module="head")
    names, why = named(w)
    assert names[head] == ("?", "C") and why[head][1] == f"same #{scale}"  # contracted
    assert names[logits] == ("B", "T", "?")


def test_the_parts_of_a_split_add_up_to_their_whole():
    """``qkv(x).split(12, dim=-1)`` in a module that declares C: each part is C, so the
    projection's 36 rows are 3C, and its weight's rows with them."""
    w = Walk(sizes=SIZES)
    x = w.input((2, 5, 12), (3, 9, 12))
    weight = w.param((36, 12), "attn.qkv.weight")
    qkv = w.op("linear", [x, weight], [(2, 5, 36)], [(3, 9, 36)], module="attn.qkv")
    parts = w.op("split", [qkv], [(2, 5, 12)] * 3, [(3, 9, 12)] * 3, module="attn")
    names, why = named(w)
    assert [names[p] for p in parts] == [("B", "T", "C")] * 3
    assert names[qkv] == ("B", "T", "3C") and why[qkv][2] == "sum split"
    assert names[weight][0] == "3C"


def test_the_equal_parts_of_a_chunk_are_one_size_and_a_remainder_is_not():
    """``qkv.chunk(3, dim=-1)``: the three parts are one size by the op, so their cut axes
    are joined (the values' width is the queries'). ``y.split(5, dim=-1)`` of 12 leaves a
    part of 2: that one is joined to none; its whole axes (B, T) to the input's as ever.
    ``z.split([q, kv, kv], dim=-1)`` makes three parts of 4 only because ``H == KV`` here:
    the list makes them, not the op, so none is joined."""
    w = Walk(sizes=SIZES)
    x = w.input((2, 5, 36), (3, 9, 36))
    parts = w.op("chunk", [x], [(2, 5, 12)] * 3, [(3, 9, 12)] * 3)
    y = w.input((2, 5, 12), (3, 9, 12))
    cut = w.op("split", [y], [(2, 5, 5), (2, 5, 5), (2, 5, 2)], [(3, 9, 5)] * 2 + [(3, 9, 2)],
               text="a, b, c = y.split(5, dim=-1)")  # fmt: skip
    z = w.input((2, 5, 12), (3, 9, 12))
    listed = w.op("split", [z], [(2, 5, 4)] * 3, [(3, 9, 4)] * 3,
                  text="q, k, v = z.split([q, kv, kv], dim=-1)")  # fmt: skip
    links = axis_links(w.steps, w.tensors, [_pairs(w, r) for r in range(len(w.tensors))])
    classes = Axes(links)
    assert classes.find((parts[1], 2)) == classes.find((parts[0], 2))
    assert classes.find((parts[2], 2)) == classes.find((parts[0], 2))
    assert classes.find((parts[0], 2)) != classes.find((x, 2))  # a third of it, not it
    assert classes.find((cut[1], 2)) == classes.find((cut[0], 2))
    assert classes.find((cut[2], 2)) != classes.find((cut[0], 2))
    assert classes.find((cut[2], 1)) == classes.find((y, 1))
    assert classes.find((listed[1], 2)) != classes.find((listed[0], 2))
    assert classes.find((listed[1], 1)) == classes.find((z, 1))


def test_a_product_less_its_named_factors_is_the_rest():
    """What a ``view`` of a named product leaves for its one unnamed part."""
    assert _quotient("H·D", ["H"]) == "D"
    assert _quotient("B·T·K", ["B·T"]) == "K"
    assert _quotient("H·(Dn+R)", ["H"]) == "(Dn+R)"
    assert _quotient("H·D", ["KV"]) is None  # not a factor of it
    assert _quotient("C", ["H"]) is None  # C is no written product: no quotient by words
    assert _quotient("H·D", ["H", "D"]) is None  # nothing left


def test_a_transpose_of_equal_sizes_is_read_from_the_other_pass():
    """``B == T`` (5 and 5) and a line that does not say which axes it swaps: the inputs
    pass (3 and 9) does."""
    w = Walk(sizes={**SIZES, "B": 5})
    x = w.input((5, 5, 12), (3, 9, 12))
    y = w.op("transpose", [x], [(5, 5, 12)], [(9, 3, 12)], text="f(x)")
    links = axis_links(w.steps, w.tensors, [_pairs(w, r) for r in range(len(w.tensors))])
    classes = Axes(links)
    assert classes.find((y, 0)) == classes.find((x, 1))
    assert classes.find((y, 1)) == classes.find((x, 0))
    assert classes.find((y, 0)) != classes.find((x, 0))


def test_a_reduction_joins_nothing():
    """``x.sum(1)`` of ``(B, T, C)`` with ``B == T``: not a broadcast of its input, so no
    axis of the output is said to be one of the input's."""
    w = Walk(sizes={**SIZES, "B": 5})
    x = w.input((5, 5, 12), (3, 9, 12))
    w.op("sum", [x], [(5, 12)], [(3, 12)])
    assert axis_links(w.steps, w.tensors, [_pairs(w, r) for r in range(len(w.tensors))]) == []


def _pairs(w: Walk, rid: int):
    other = w.other[rid]
    shape = w.tensors[rid].shape
    return [(s, other[i] if other is not None else None) for i, s in enumerate(shape)]
