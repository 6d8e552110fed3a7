"""Which recognised attention maps are maps of tokens: decided once the axes are named.

While the forward runs, a softmax becomes a map by what it does: a contraction sums its
key axis with the values (:mod:`tracing.attention_flow`). Whether the two axes it relates
are token positions, and where its heads are, only the names can say. Once
:mod:`tracing.dims.naming` has named the axes from evidence, :func:`proven_maps`
settles it:

- a rank-4 map ``(B, H, T, S)`` keeps ``role="attention"`` unless its names prove that it
  is laid out otherwise: its axis 1 moves with the tokens (where a map has its heads), or
  one of its last two axes is not positions. An attention over the outputs of earlier
  blocks (Inkling-2's ``BlockAttentionResidual``: ``(B, T, 1, 1+1)``) attends, but no
  token attends to a token in it;
- a rank-3 candidate is a map only when its first axis is proven to be ``B·H`` (the heads
  folded into the batch, as BART, MVP and TrOCR do before their ``bmm``) or ``B`` (one
  head, ``b i j, b j d -> b i d``): its ``(B, H, T, S)`` view is then
  :func:`tracing.analysis.attention_maps.attention_maps`'s.

An axis is a position when its name moves with the input tokens (``T``, ``T+P``,
``Pr+T``), when it is the tokens an attention is proven to attend over (``Tk``: a vision
transformer's patches), or when nothing is known of it (``?``, or ``1``: a single query
while generating).
"""

from __future__ import annotations

from collections.abc import Iterable

from tracing.dims.letters import INPUT_LETTERS, letters_in
from tracing.record import TensorRecord, built

FLAT_HEADS = "B·H"
"""The first axis of a rank-3 map: the batch and the heads folded into one, batch outer."""
ONE_HEAD = "B"
"""The first axis of a rank-3 map with a single head: the batch alone, ``(B, T, S)``."""

_POSITION_LETTERS = INPUT_LETTERS | {"Pr", "Tk"}  # Tk: the keys a map is proven to attend


def moves_with_tokens(name: str) -> bool:
    """Whether an axis named ``name`` is proven to be (or to grow with) token positions."""
    return any(letter in _POSITION_LETTERS for letter in letters_in(name))


def may_be_positions(name: str) -> bool:
    """Whether an axis named ``name`` can be token positions (nothing proves otherwise)."""
    return name in ("?", "1") or moves_with_tokens(name)


def is_map(dims: tuple[str, ...] | None, rank: int) -> bool:
    """Whether named axes ``dims`` of a recognised attention map are a map of tokens."""
    if dims is None or len(dims) != rank:
        return rank == 4  # no names: a rank-4 candidate stands, a flattened one cannot
    if rank == 3 and dims[0] not in (FLAT_HEADS, ONE_HEAD):
        return False
    if rank == 4 and moves_with_tokens(dims[1]):  # (B, T, ...): no heads where a map has them
        return False
    return may_be_positions(dims[-2]) and may_be_positions(dims[-1])


def proven_maps(records: list[TensorRecord], flat: Iterable[int]) -> list[TensorRecord]:
    """``records`` with ``role="attention"`` on the proven maps only: rank-4 candidates
    (already marked) lose it where their names disprove it; rank-3 candidates (``flat``)
    gain it where their names prove it."""
    out = list(records)
    for rid in flat:
        r = out[rid]
        if r.role is None and is_map(r.dims, 3):
            out[rid] = built(TensorRecord, {**r.__dict__, "role": "attention"})
    for rid, r in enumerate(out):
        if r.role == "attention" and len(r.shape) == 4 and not is_map(r.dims, 4):
            out[rid] = built(TensorRecord, {**r.__dict__, "role": None})
    return out
