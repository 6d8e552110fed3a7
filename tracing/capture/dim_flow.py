"""Dims that follow the data: name an op's output from what the op does to its inputs.

:func:`tracing.dims.infer_dims` names an axis by its size alone. That is right until two
letters share a size: with ``T == D == 8`` the keys ``(2, 4, 8, 8)`` read ``(B, H, T, D)``
and so does their transpose, which is ``(B, H, D, T)``. This pass walks the op steps in
order and lets each op say what its output is, from its inputs' names:

- a ``view``/``reshape`` that splits ``C`` into ``(H, D)`` (or merges them back, or folds
  ``B, T`` into ``B*T``) keeps the names of the axes it only carries along;
- a ``transpose``/``permute`` moves its input's names (the axes come from the call on the
  source line, ``k.transpose(-2, -1)``, or from the sizes that moved);
- a ``matmul`` keeps the batch axes and rows of its left operand and the columns of its
  right one; its contraction names the right operand's rows when they were ambiguous;
- ``split``/``chunk`` rename only the split axis (``3C`` into three ``C``);
- an op whose output has its input's shape (``softmax``, ``masked_fill``, ``+``...) keeps
  its names.

Shape comments on the source line (``# (batch_size, num_heads, seq_len, d_head)``,
``# (B, nh, T, hs)``) name an output nothing else named, and give the sizes of letters the
model's attributes did not. A name is only ever given when its size agrees with the axis.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tracing.capture.dims import DimNamer
from tracing.record import Step, TensorRecord

Dims = tuple[str, ...]

# Words people write in shape comments, per house letter.
_COMMENT_WORDS: dict[str, str] = {}
for _letter, _words in {
    "B": "b batch batch_size bs bsz n_batch",
    "T": "t seq seq_len seqlen seq_length sequence_length time n_ctx tokens l",
    "C": "c d_model n_embd hidden hidden_size embed_dim emb embd d_emb channels",
    "H": "h nh n_head n_heads num_heads heads",
    "D": "hs head_size d_head head_dim d_k dk d_v hd",
    "V": "v vocab vocab_size n_vocab",
    "F": "f d_ff ff d_inner dim_feedforward intermediate_size",
}.items():
    for _word in _words.split():
        _COMMENT_WORDS[_word] = _letter
_COMMENT_WORDS["..."] = "..."

_GROUP = re.compile(r"\(([^()]*)\)")
_TRANSPOSE = re.compile(
    r"(?:\.transpose|\.swapaxes|\.swapdims|torch\.transpose)\(\s*(?:[A-Za-z_][\w.]*\s*,\s*)?"
    r"(-?\d+)\s*,\s*(-?\d+)\s*\)"
)
_PERMUTE = re.compile(r"\.permute\(\s*\(?([-\d,\s]+)\)?\s*\)")

_TRANSPOSES = frozenset({"transpose", "transpose_", "swapaxes", "swapdims", "t", "mT"})
_RESHAPES = frozenset({"view", "reshape", "flatten", "unflatten", "_unsafe_view", "view_as"})
_MATMULS = frozenset({"matmul", "bmm"})
_SPLITS = frozenset({"split", "chunk", "tensor_split", "split_with_sizes"})
_KEEPS_NO_SHAPE = frozenset({"permute", "linear", "embedding", "expand", "repeat", "unbind"})


def shape_comment(text: str) -> Dims | None:
    """The shape a source line's comment gives its result, in house letters.

    >>> shape_comment("k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)")
    ('B', 'H', 'T', 'D')
    >>> shape_comment("x = f(x)  # (..., seq_len, d_head) @ (...) -> (..., seq_len, seq_len)")
    ('...', 'T', 'T')

    The last parenthesised group after ``->`` (or the last one) counts, and only when every
    word in it is a known axis word; anything else is not a shape comment.
    """
    hash_at = text.find("#")
    if hash_at < 0:
        return None
    comment = text[hash_at + 1 :]
    if "->" in comment:
        comment = comment.rsplit("->", 1)[1]
    groups = _GROUP.findall(comment)
    if not groups:
        return None
    words = [w.strip() for w in groups[-1].split(",") if w.strip()]
    letters = []
    for word in words:
        letter = word if word in "BTCHDVF" and len(word) == 1 else _COMMENT_WORDS.get(word.lower())
        if letter is None:
            return None
        letters.append(letter)
    return tuple(letters) or None


def _size(name: str, sizes: Mapping[str, int]) -> int | None:
    if name in sizes:
        return sizes[name]
    if name == "3C" and "C" in sizes:
        return 3 * sizes["C"]
    if name == "B*T" and "B" in sizes and "T" in sizes:
        return sizes["B"] * sizes["T"]
    return None


def _fits(dims: Dims | None, shape: tuple[int, ...], sizes: Mapping[str, int]) -> bool:
    """Every axis is named, and every name's size is the axis size."""
    if dims is None or len(dims) != len(shape):
        return False
    return all(not (name == "?" or _size(name, sizes) != size) for name, size in zip(dims, shape))


def _known(dims: Dims | None) -> bool:
    return dims is not None and "?" not in dims


# --------------------------------------------------------------------------- op rules


def _axis(i: int, n: int) -> int:
    return i + n if i < 0 else i


def _transpose_axes(step: Step, in_shape, out_shape) -> tuple[int, int] | None:
    n = len(in_shape)
    if step.op in ("t", "mT") and n >= 2:
        return n - 2, n - 1
    text = step.source.text if step.source is not None else ""
    found = {(_axis(int(a), n), _axis(int(b), n)) for a, b in _TRANSPOSE.findall(text)}
    found = {p for p in found if 0 <= p[0] < n and 0 <= p[1] < n}
    if len(found) == 1:
        a, b = found.pop()
        if in_shape[a] == out_shape[b] and in_shape[b] == out_shape[a]:
            return a, b
    differ = [i for i in range(n) if in_shape[i] != out_shape[i]]
    if len(differ) == 2:
        a, b = differ
        if in_shape[a] == out_shape[b] and in_shape[b] == out_shape[a]:
            return a, b
    return None


def _permutation(step: Step, n: int) -> list[int] | None:
    text = step.source.text if step.source is not None else ""
    found = {m.replace(" ", "") for m in _PERMUTE.findall(text)}
    if len(found) != 1:
        return None
    try:
        perm = [_axis(int(p), n) for p in found.pop().strip(",").split(",")]
    except ValueError:
        return None
    return perm if sorted(perm) == list(range(n)) else None


def _reshape(in_dims: Dims, in_shape, out_shape, sizes) -> Dims | None:
    """Carry names through a view: axes kept as they are keep their name; a split of ``C``
    into ``(H, D)`` and a merge of ``(H, D)`` into ``C`` (``(B, T)`` into ``B*T``) rename."""
    out: list[str] = []
    i = j = 0
    n, m = len(in_shape), len(out_shape)
    while i < n and j < m:
        gi, gj = [i], [j]
        pi, pj = in_shape[i], out_shape[j]
        while pi != pj:
            if pi < pj and gi[-1] + 1 < n:
                gi.append(gi[-1] + 1)
                pi *= in_shape[gi[-1]]
            elif pj < pi and gj[-1] + 1 < m:
                gj.append(gj[-1] + 1)
                pj *= out_shape[gj[-1]]
            else:
                return None
        names = tuple(in_dims[k] for k in gi)
        parts = tuple(out_shape[k] for k in gj)
        if len(gi) == 1 and len(gj) == 1:
            out.append(names[0])
        elif len(gi) == 1:
            out.extend(_split_name(names[0], parts, sizes) or ("?",) * len(parts))
        elif len(gj) == 1:
            out.append(_merged_name(names) or "?")
        else:
            out.extend("?" * len(parts))
        i, j = gi[-1] + 1, gj[-1] + 1
    if i != n or j != m:  # trailing size-1 axes
        out.extend("?" * (m - j))
    return tuple(out)


def _split_name(name: str, parts: tuple[int, ...], sizes) -> Dims | None:
    if name == "C" and parts == (sizes.get("H"), sizes.get("D")):
        return ("H", "D")
    if name == "B*T" and parts == (sizes.get("B"), sizes.get("T")):
        return ("B", "T")
    if name == "3C" and parts == (3, sizes.get("C")):
        return None  # (3, C): the 3 has no letter
    return None


def _merged_name(names: Dims) -> str | None:
    return {("H", "D"): "C", ("B", "T"): "B*T"}.get(names)


def _matmul(a: Dims, b: Dims, out_shape) -> Dims | None:
    if len(a) < 2 or len(b) < 2 or len(out_shape) != len(a):
        return None
    return a[:-1] + b[-1:]


def _split_outputs(in_dims: Dims, in_shape, out_shape, sizes) -> Dims | None:
    differ = [i for i in range(len(in_shape)) if in_shape[i] != out_shape[i]]
    if len(in_shape) != len(out_shape) or len(differ) != 1:
        return None
    axis = differ[0]
    name = in_dims[axis]
    size = out_shape[axis]
    if name == "3C" and size == sizes.get("C"):
        new = "C"
    else:
        candidates = [k for k, v in sizes.items() if v == size and k != "B"]
        new = candidates[0] if len(candidates) == 1 else "?"
    return (*in_dims[:axis], new, *in_dims[axis + 1 :])


# --------------------------------------------------------------------------- the pass


class _Flow:
    def __init__(self, tensors: Sequence[TensorRecord], sizes: Mapping[str, int]):
        self.tensors = tensors
        self.sizes = sizes
        self.dims: list[Dims | None] = [r.dims for r in tensors]

    def named_input(self, step: Step, shape=None) -> int | None:
        """The first input that is not a parameter, with all axes named (and ``shape``)."""
        for tid in step.inputs:
            record = self.tensors[tid]
            if record.role in ("param", "buffer"):
                continue
            if shape is not None and record.shape != shape:
                continue
            if _known(self.dims[tid]):
                return tid
        return None

    def propose(self, step: Step) -> Dims | None:
        """The first output's dims as the op makes them, or None when it does not say."""
        out_shape = self.tensors[step.outputs[0]].shape
        op = step.op
        if op in _MATMULS and len(step.inputs) >= 2:
            a, b = step.inputs[0], step.inputs[1]
            da, db = self.dims[a], self.dims[b]
            if not (_known(da) and _known(db)):
                return None
            self._contract(a, b)
            return _matmul(da, self.dims[b], out_shape)
        src = self.named_input(step)
        if src is None:
            return None
        in_dims, in_shape = self.dims[src], self.tensors[src].shape
        if op in _TRANSPOSES:
            axes = _transpose_axes(step, in_shape, out_shape)
            if axes is None or len(in_shape) != len(out_shape):
                return None
            names = list(in_dims)
            names[axes[0]], names[axes[1]] = names[axes[1]], names[axes[0]]
            return tuple(names)
        if op == "permute":
            perm = _permutation(step, len(in_shape))
            return None if perm is None else tuple(in_dims[p] for p in perm)
        if op in _RESHAPES:
            return _reshape(in_dims, in_shape, out_shape, self.sizes)
        if op in _SPLITS:
            return _split_outputs(in_dims, in_shape, out_shape, self.sizes)
        if op in _KEEPS_NO_SHAPE:
            return None
        same = self.named_input(step, out_shape)
        return None if same is None else self.dims[same]

    def _contract(self, a: int, b: int) -> None:
        """``a @ b`` contracts ``a``'s columns with ``b``'s rows: when ``b``'s last two
        axes have one size, that says which of them is which."""
        da, db = self.dims[a], self.dims[b]
        shape = self.tensors[b].shape
        if db[-2] != da[-1] and db[-1] == da[-1] and shape[-1] == shape[-2]:
            self.dims[b] = (*db[:-2], db[-1], db[-2])

    def run(self, steps: Sequence[Step]) -> None:
        comments: dict[tuple[str, int], Dims | None] = {}
        for step in steps:
            if step.kind != "op" or not step.outputs:
                continue
            proposed = self.propose(step)
            for tid in step.outputs:
                shape = self.tensors[tid].shape
                if self.tensors[tid].role == "attention":
                    continue
                dims = proposed if shape == self.tensors[step.outputs[0]].shape else None
                if _fits(dims, shape, self.sizes):
                    self.dims[tid] = dims
                elif not _known(self.dims[tid]) and step.source is not None:
                    key = (step.source.file, step.source.line)
                    if key not in comments:
                        comments[key] = shape_comment(step.source.text)
                    named = _expand(comments[key], len(shape), self.dims[tid])
                    if _fits(named, shape, self.sizes):
                        self.dims[tid] = named


def _expand(comment: Dims | None, ndim: int, current: Dims | None) -> Dims | None:
    """A comment with ``...`` in front takes its leading names from the current ones."""
    if comment is None:
        return None
    if comment[0] == "...":
        tail = comment[1:]
        if len(tail) > ndim:
            return None
        lead = current[: ndim - len(tail)] if current else ("?",) * (ndim - len(tail))
        return tuple(lead) + tail
    return comment


def sizes_from_comments(
    steps: Sequence[Step], tensors: Sequence[TensorRecord], sizes: Mapping[str, int]
) -> dict[str, int]:
    """Sizes of letters still unknown, read off outputs whose line has a shape comment
    (``# (B, nh, T, hs)`` on a ``(2, 4, 10, 8)`` output gives ``H = 4``, ``D = 8``)."""
    learned: dict[str, int] = {}
    comments: dict[str, Dims | None] = {}
    for step in steps:
        if step.kind != "op" or not step.outputs or step.source is None:
            continue
        text = step.source.text
        if "#" not in text:
            continue
        if text not in comments:
            comments[text] = shape_comment(text)
        comment = comments[text]
        if comment is None or "..." in comment:
            continue
        shape = tensors[step.outputs[-1]].shape
        if len(shape) != len(comment):
            continue
        guess = dict(learned)
        for letter, size in zip(comment, shape):
            known = sizes.get(letter, guess.get(letter))
            if known is not None and known != size:
                break
            guess[letter] = size
        else:
            learned = guess
    return {k: v for k, v in learned.items() if k not in sizes}


def _worth_running(tensors: Sequence[TensorRecord], sizes: Mapping[str, int]) -> bool:
    """Only when a size is shared by two letters or an axis is still unnamed. ``F == V``
    does not count: the namer tells those apart by the module a tensor came from."""
    values = [v for k, v in sizes.items() if (k != "B" or v != 1) and k != "V"]
    if len(set(values)) < len(values) or sizes.get("V") in set(values) - {sizes.get("F")}:
        return True
    for r in tensors:
        if r.producer is None or len(r.shape) < 2:  # a parameter's names never flow
            continue
        if r.dims is None or any(d == "?" and n > 1 for d, n in zip(r.dims, r.shape)):
            return True  # (a size-1 broadcast axis has no letter to find)
    return False


def refine_dims(
    steps: Sequence[Step], tensors: list[TensorRecord], sizes: dict[str, int]
) -> list[TensorRecord]:
    """Tensor records whose dims follow the ops (see the module docstring).

    ``sizes`` gains the letters shape comments taught (the caller keeps them in
    ``meta["dims"]``). Records that do not change are returned as they were.
    """
    if not sizes or not _worth_running(tensors, sizes):
        return tensors
    learned = sizes_from_comments(steps, tensors, sizes)
    if learned:
        sizes.update(learned)
        namer = DimNamer(sizes)
        tensors = [
            replace(r, dims=namer(r.shape)) if r.dims is None or "?" in r.dims else r
            for r in tensors
        ]
    flow = _Flow(tensors, sizes)
    flow.run(steps)
    return [
        r if flow.dims[i] == r.dims else replace(r, dims=flow.dims[i])
        for i, r in enumerate(tensors)
    ]
