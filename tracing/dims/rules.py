"""What each op does to its input's axes: the op shape rules, as one registry.

Each :class:`Rule` names the general fact it encodes, the ops it applies to, and the
:class:`~tracing.dims.naming._Namer` method that applies it. The walk tries the rules whose
ops include the step's op, in this order; the first that says something wins, and an op no
rule names falls back to broadcasting (aligned axes of the same sizes keep their names) and,
for ``cat``, to adding its parts up. Each rule is tested alone on hand-built records in
``tests/tracing/dims/test_rules.py``; none names a model or a module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TRANSPOSES = frozenset({"transpose", "transpose_", "swapaxes", "swapdims", "t", "mT"})
RESHAPES = frozenset({"view", "reshape", "flatten", "unflatten", "_unsafe_view", "view_as"})
SLICES = frozenset({"getitem", "narrow", "split", "chunk", "tensor_split", "unbind", "slice"})
SPLITS = frozenset({"split", "chunk", "tensor_split", "split_with_sizes"})
MATMULS = frozenset({"matmul", "bmm", "baddbmm"})
CONVS = frozenset({"conv1d", "conv2d", "conv3d"})
CATS = frozenset({"cat", "concat", "concatenate"})
RECURRENT = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})  # torch's recurrent layers
MOVES_AXES = frozenset(  # ops whose output axes are their input's, moved or with 1s added
    {"unsqueeze", "squeeze", "expand", "expand_as", "permute", "movedim", "repeat", "unbind"}
)


@dataclass(frozen=True)
class Rule:
    """One op shape rule: the fact, the ops it holds for, the walk's method applying it."""

    name: str
    ops: frozenset[str]
    fact: str
    method: str


RULES: tuple[Rule, ...] = (
    Rule("linear", frozenset({"linear"}),
         "the output's last axis is the weight's rows; the others are the input's", "_rule_linear"),
    Rule("embedding", frozenset({"embedding"}),
         "the ids' axes, then the table's width", "_rule_embedding"),
    Rule("conv", CONVS,
         "the input's batch, the weight's out-channels, then spatial axes no rule names",
         "_rule_conv"),
    Rule("matmul", MATMULS,
         "batch axes and rows of the left operand, columns of the right", "_rule_matmul"),
    Rule("einsum", frozenset({"einsum"}),
         "each output subscript is the input axis of the same subscript", "_rule_einsum"),
    Rule("transpose", TRANSPOSES | {"permute"},
         "names move with their axes (which ones: the call on the line, or the sizes)",
         "_rule_moved"),
    Rule("reshape", RESHAPES,
         "kept axes keep their names, a split factors a product, a merge multiplies",
         "_rule_reshape"),
    Rule("gather", frozenset({"getitem"}),
         "indexing by a tensor takes the index's axes", "_rule_gathered"),
    Rule("slice", SLICES,
         "a part of a named axis is that name's part (C of 3C, D/2 of D) or the slice written",
         "_rule_sliced"),
    Rule("new axis", frozenset({"getitem"}),
         "x[:, None] adds a 1 and keeps the rest", "_rule_grown"),
    Rule("unsqueeze", frozenset({"unsqueeze", "squeeze"}),
         "the axes bigger than 1 keep their order; only 1s come or go", "_rule_kept"),
    Rule("complex", frozenset({"view_as_real", "view_as_complex"}),
         "a complex axis is 2 real numbers, and back", "_rule_complex"),
    Rule("repeat", frozenset({"repeat"}),
         "an axis repeated k times is k times its name", "_rule_repeated"),
    Rule("recurrent", RECURRENT,
         "the output's steps are the input's, its width the hidden-to-hidden weight's columns "
         "(twice, both ways); the final states keep the initial states' axes", "_rule_recurrent"),
)  # fmt: skip
"""Every rule, in the order the walk tries them."""

BY_OP: dict[str, tuple[Rule, ...]] = {}
for _rule in RULES:
    for _op in _rule.ops:
        BY_OP[_op] = (*BY_OP.get(_op, ()), _rule)


_EQUATION = re.compile(r"""["']([^"']*->[^"']*)["']""")


def einsum_subscripts(text: str, inputs: int) -> tuple[list[list[str]], list[str]] | None:
    """The subscripts of the one einsum equation a line writes, per input and for the
    output, one entry per axis: ``"bhid,bhjd->bhij"`` and einops' spaced
    ``"b h i d, b h j d -> b h i j"`` both give ``([[b,h,i,d], [b,h,j,d]], [b,h,i,j])``.
    ``None`` when the line writes none, several, an ellipsis, an f-string's ``{part}``, or
    not ``inputs`` operands."""
    found = _EQUATION.findall(text)
    if len(found) != 1 or "..." in found[0] or "{" in found[0]:
        return None  # several, an ellipsis, or an f-string's placeholder: not written out
    left, right = found[0].split("->")
    operands = left.split(",")
    if len(operands) != inputs:
        return None

    def axes(part: str) -> list[str]:
        part = part.strip()
        return part.split() if " " in part else list(part)

    return [axes(o) for o in operands], axes(right)
