"""What a trace's axis letters mean: its legend, and the words a dims cell shows on hover.

A trace names each axis (``TensorRecord.dims``: ``("B", "KV", "H/KV", "T", "D")``) and keeps,
per letter it uses, the size and the evidence for it in ``meta["dim_letters"]``::

    {"KV": {"size": 2, "origin": "config.num_key_value_heads", "meaning": "key/value heads"}}

This module reads that table the same way for the app (the Dims legend, the hover text of a
dims cell or a diagram box) and the shape report. A trace saved before letters carried their
evidence has no table: it still shows each axis's size, and says that it has no more.

>>> legend = letter_legend({"dim_letters": {"KV": {"size": 2, "origin": "config.n_kv",
...     "meaning": "key/value heads"}, "H": {"size": 6, "origin": "config.n_head",
...     "meaning": "heads"}}})
>>> [row.letter for row in legend]
['H', 'KV']
>>> letters_of("H/KV", legend)
['H', 'KV']
>>> print(dims_hover((6, 3), ("H", "H/KV"), legend))
(H, H/KV) = (6, 3)
H = 6 · heads · from config.n_head
KV = 2 · key/value heads · from config.n_kv
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NO_LETTERS = (
    "sizes only: this trace has no letter table (no size or origin per letter; "
    "trace files from before the letters kept their evidence lack it)"
)
"""Said wherever a legend would be, for a trace without ``meta["dim_letters"]``."""

#: the order letters are listed in: the tutorial's first, then by name
_ORDER = ("B", "T", "P", "C", "H", "KV", "D", "R", "Dn", "Dv", "Lq", "Lkv", "F", "FE", "E", "K")
_ORDER += ("V", "N")


@dataclass(frozen=True)
class LegendRow:
    """One letter of a trace: its size, where the size came from, what it names."""

    letter: str
    size: int | None
    origin: str
    meaning: str
    moved_by: tuple[str, ...] = ()  # the passes that moved it: "inputs", "config.X"

    def line(self) -> str:
        """``KV = 2 · key/value heads · from config.num_key_value_heads · moved by
        config.num_key_value_heads``."""
        parts = [f"{self.letter} = {'?' if self.size is None else self.size}"]
        if self.meaning:
            parts.append(self.meaning)
        if self.origin:
            parts.append(f"from {self.origin}")
        if self.moved_by:
            parts.append("moved by " + ", ".join(_pass_name(p) for p in self.moved_by))
        return " · ".join(parts)


def _pass_name(what: str) -> str:
    """``inputs`` -> ``the inputs pass``; ``config.X`` -> ``the config.X pass``."""
    return f"the {what} pass"


def letter_legend(meta: Mapping[str, Any] | None) -> list[LegendRow] | None:
    """The letters of ``meta["dim_letters"]`` in the usual order; ``None`` when the trace
    has no such table (an older file): then only sizes are known."""
    table = (meta or {}).get("dim_letters")
    if not isinstance(table, Mapping):
        return None
    rows = []
    for letter, info in table.items():
        info = info if isinstance(info, Mapping) else {}
        size = info.get("size")
        moved = info.get("moved_by")
        moved = tuple(str(m) for m in moved) if isinstance(moved, list | tuple) else ()
        rows.append(
            LegendRow(
                str(letter),
                size if isinstance(size, int) and not isinstance(size, bool) else None,
                str(info.get("origin") or ""),
                str(info.get("meaning") or ""),
                moved,
            )
        )
    rank = {name: i for i, name in enumerate(_ORDER)}
    return sorted(rows, key=lambda r: (rank.get(r.letter, len(rank)), r.letter))


def evidence_text(meta: Mapping[str, Any]) -> str:
    """One line on how the names were proven: the second pass, or why it did not run
    (``meta["dims_evidence"]``; "" when the trace does not say). The Dims legend and the
    shape report of proofs show it."""
    ev = meta.get("dims_evidence")
    if not isinstance(ev, Mapping):
        return ""
    how = ev.get("pass")
    sizes = ", ".join(f"{k}={ev[k]}" for k in ("B", "T") if k in ev)
    if how in ("device", "meta"):
        where = "on the device" if how == "device" else "on the meta device"
        return f"Axes that move with the inputs: proven by a second pass {where} at {sizes}."
    reason = ev.get("why_not") or "it did not run"
    return f"No second pass ({reason}): names come from the config, layers and comments."


def letters_of(name: str, legend: Sequence[LegendRow] | None) -> list[str]:
    """The legend's letters an axis name uses, in order, once each (``H/KV`` -> H, KV).

    Names are matched longest first, so ``KV`` is one letter, not ``K`` and ``V``."""
    if not legend or not name:
        return []
    pattern = _letter_pattern(tuple(r.letter for r in legend))
    found, at = [], 0
    while at < len(name):
        m = pattern.match(name, at)
        if m is None:
            # not a letter here: skip this character (or a whole unknown word)
            w = re.match(r"[A-Za-z]+", name[at:])
            at += len(w.group(0)) if w else 1
            continue
        found.append(m.group(0))
        at = m.end()
    return list(dict.fromkeys(found))


@functools.lru_cache(maxsize=32)
def _letter_pattern(letters: tuple[str, ...]) -> re.Pattern[str]:
    names = sorted(letters, key=len, reverse=True)
    return re.compile("|".join(re.escape(n) for n in names))


def dims_text(shape: Sequence[int], dims: Sequence[str] | None) -> str:
    """The whole dims, never cut: ``(B, KV, H/KV, T, D)``; ``?=32`` for an unnamed axis of
    size 32; ``–`` when the tensor has no dims."""
    if not dims or len(dims) != len(shape):
        return "–"
    return "(" + ", ".join(f"?={s}" if d in ("", "?") else d for d, s in zip(dims, shape)) + ")"


def dims_hover(
    shape: Sequence[int],
    dims: Sequence[str] | None,
    legend: Sequence[LegendRow] | None,
    why: Sequence[str] | None = None,
) -> str:
    """Plain text for hovering a dims cell: the axes with their sizes, each named axis's
    proof (``why``, :attr:`tracing.record.TensorRecord.why`), then one line per letter they
    use (size, meaning, origin, the passes that moved it); ``legend`` None says sizes only."""
    if not dims or len(dims) != len(shape):
        return "shape " + "(" + ", ".join(str(s) for s in shape) + ") · no axis names"
    lines = [dims_text(shape, dims) + " = (" + ", ".join(str(s) for s in shape) + ")"]
    if why is not None and len(why) == len(dims):
        for i, (d, w) in enumerate(zip(dims, why)):
            if w and d not in ("", "?"):
                lines.append(f"  axis {i} {d}: {proof_text(w)}")
    if legend is None:
        lines.append(NO_LETTERS)
        return "\n".join(lines)
    by_letter = {r.letter: r for r in legend}
    used: list[str] = []
    for d in dims:
        used.extend(x for x in letters_of(d, legend) if x not in used)
    lines.extend(by_letter[x].line() for x in used)
    for d in dict.fromkeys(dims):  # Q[:i] once, however many axes it names
        cut = _SLICE.fullmatch(d)
        if cut:
            size = shape[list(dims).index(d)]
            lines.append(
                f"{d} = {size} · {cut.group(1)} cut by the slice [{cut.group(2)}] "
                "its source line writes"
            )
    unnamed = [s for d, s in zip(dims, shape) if d in ("", "?")]
    if unnamed:
        lines.append(f"?: no evidence names an axis of size {', '.join(map(str, unnamed))}")
    return "\n".join(lines)


PROOFS = {
    "input": "the first input's axes: B, then T",
    "tokens": "the first input's axes, tokens first: attention map {via} attends over axis 0",
    "carried": "carried by {via} from its input's axis",
    "written": "written on its source line (a shape comment, a number it passes)",
    "one": "size 1",
    "slice": "the part of an axis its line's slice cuts",
    "moved": "its sizes in every pass, which no other name has",
    "constant": "the only name of its size in every pass",
    "declared": "declared by {via}, the only name of its size",
    "same": "the same axis as tensor {via}'s, which an op joins it to, proven there",
    "sum": "the sum of the named parts a {via} cuts it into",
    "contracted": "the width over which the scores of attention map {via} pair each query "
    "with each key: the head width",
    "rest": "the whole of a {via} less its other named parts",
    "attended": "the keys of attention map {via}: a softmax over them weighs the values",
    "words": "the words of its module or line; no pass tells it from another name",
}
"""What each proof code of ``TensorRecord.why`` (``tracing.dims``) says."""


def proof_text(code: str) -> str:
    """``carried linear`` -> ``carried by linear from its input's axis``; an unknown code
    (a newer file) as it is."""
    kind, _, via = code.partition(" ")
    text = PROOFS.get(kind)
    return code if text is None else text.format(via=via or "an op")


_SLICE = re.compile(r"(.+)\[([^\[\]]*:[^\[\]]*)\]")
"""An axis named as the slice its line writes: ``Q[:i]``, ``i`` positions of ``Q`` (a loop's
``i``, another size at each step)."""


def letters_used(trace: Any, legend: Sequence[LegendRow] | None) -> set[str]:
    """The legend's letters that some tensor of ``trace`` is named with."""
    names = {d for r in trace.tensors for d in (r.dims or ())}
    return {x for n in names for x in letters_of(n, legend)}


__all__ = [
    "NO_LETTERS", "PROOFS", "LegendRow", "dims_hover", "dims_text", "letter_legend", "letters_of",
    "proof_text",
]  # fmt: skip
__all__ += ["evidence_text", "letters_used"]
