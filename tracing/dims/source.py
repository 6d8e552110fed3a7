"""What a source line writes about the shapes it makes: evidence read from text.

A step records the line that ran it (``step.source.text``). That line may say more than
the shapes do: a shape comment (``# (B, nh, T, hs)``), the axes a ``transpose(1, 2)`` or
``permute(0, 2, 1, 3)`` moves, a subscript (``x[..., :i]``, ``x[:, None]``), a number it
passes as a size (``reshape(..., -1, 2)``, ``topk(2)``), or a config attribute it passes as
one (``view(b, t, self.num_heads, -1)``). The functions here only read; what a reading is
worth (a hint checked against the passes, never a proof by itself) is
:mod:`tracing.dims.naming`'s to decide.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tracing.dims.letters import INPUT_LETTERS, LETTERS, SAME_AXIS, Sized
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


def _axis(i: int, n: int) -> int:
    return i + n if i < 0 else i


def transpose_axes(step: Step, in_shape, out_shape) -> tuple[int, int] | None:
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


def permutation(step: Step, n: int) -> list[int] | None:
    text = step.source.text if step.source is not None else ""
    found = {m.replace(" ", "") for m in _PERMUTE.findall(text)}
    if len(found) != 1:
        return None
    try:
        perm = [_axis(int(p), n) for p in found.pop().strip(",").split(",")]
    except ValueError:
        return None
    return perm if sorted(perm) == list(range(n)) else None


_SUBSCRIPT = re.compile(r"\[([^\[\]]*)\]")


def text_of(step: Step) -> str:
    """The source line a step ran, or ``""``."""
    return step.source.text if step.source is not None else ""


def subscripts(step: Step, ndim: int) -> list[tuple[int, ...]]:
    """The axes each subscript on the step's line keeps, for those of slices and single
    indices only: ``[:, :, i]`` of a 4-D tensor -> ``(0, 1, 3)`` (the axes it does not
    name are kept whole), ``[..., i, :]`` -> ``(0, 1, 3)``."""
    return [tuple(k for k, e in enumerate(s) if ":" in e) for s in subscript_entries(step, ndim)]


def subscript_entries(step: Step, ndim: int, new_axes: bool = False) -> list[list[str]]:
    """Each subscript on the step's line, one entry per axis of an ``ndim`` tensor:
    ``[..., i, :i]`` of a 5-D tensor -> ``[":", ":", ":", "i", ":i"]``. With ``new_axes``,
    ``ndim`` is the result's and a ``None`` entry is one of its axes (``x[..., None]``);
    else a subscript with a ``None`` is not read."""
    text = text_of(step)
    out = []
    for match in _SUBSCRIPT.finditer(text):
        before = text[: match.start()]
        if before.count("[") != before.count("]"):
            continue  # inside another subscript (``x[..., : x.shape[-1] // 2]``'s ``[-1]``)
        entries = [e.strip() for e in match.group(1).split(",")]
        if any(not e or (e == "None" and not new_axes) for e in entries):
            continue
        if entries.count("...") > 1:
            continue
        if "..." in entries:
            at = entries.index("...")
            entries[at : at + 1] = [":"] * (ndim - len(entries) + 1)
        entries += [":"] * (ndim - len(entries))
        if len(entries) == ndim:
            out.append(entries)
    return out


def written_slices(step: Step, ndim: int) -> list[str] | None:
    """The one subscript of the step's line that fits an ``ndim`` tensor, per axis;
    ``None`` when there is none or several (which of them this step is, the line cannot say)."""
    found = {tuple(e) for e in subscript_entries(step, ndim)}
    return list(found.pop()) if len(found) == 1 else None


# --------------------------------------------------------------------------- source names

_SHAPED_BY_ARGS = frozenset({"view", "reshape", "ones", "zeros", "empty", "eye", "rand", "randn"})
_SPELLINGS = {name: letter for letter, spec in LETTERS.items() for name in spec.config}


def sizes_from_source(
    steps: Sequence[Step], tensors: Sequence[TensorRecord], known: Mapping[str, Sized]
) -> dict[str, Sized]:
    """Sizes of letters no config gave, from the names the source passes as a shape:
    ``x.reshape(b, h, -1, chunk_size, d)`` makes axis 3 ``chunk_size`` (``Q``), as
    ``torch.ones(chunk_size, chunk_size)`` makes both (Qwen3-Next fixes its chunk length
    in a default argument, no config attribute). Each positional argument that is a
    letter's config spelling (bare or ``self.``) names the output axis at its place; a
    letter seen at two sizes is not learned."""
    seen: dict[str, set[int]] = {}
    where: dict[str, str] = {}
    for step in steps:
        if step.kind != "op" or step.op not in _SHAPED_BY_ARGS or not step.outputs:
            continue
        text = text_of(step)
        if "(" not in text:
            continue
        shape = tensors[step.outputs[0]].shape
        for args in call_args(text, step.op):
            if len(args) != len(shape):
                continue
            for arg, size in zip(args, shape):
                letter = _SPELLINGS.get(arg.removeprefix("self."))
                if letter is None or letter in known or letter in INPUT_LETTERS:
                    continue
                same = known.get(SAME_AXIS.get(letter, ""))
                if same is not None and same.size == size:
                    continue  # one axis (R when the whole head is rotated): not a new letter
                seen.setdefault(letter, set()).add(size)
                if step.source is not None:
                    file = step.source.file.rsplit("/", 1)[-1]
                    where.setdefault(letter, f"source: `{arg}` at {file}:{step.source.line}")
    return {
        letter: Sized(sizes.pop(), where[letter])
        for letter, sizes in seen.items()
        if len(sizes) == 1 and letter in where
    }


SIZED_BY_LITERALS = _SHAPED_BY_ARGS | {"expand", "new_zeros", "new_ones", "new_empty", "topk"}
"""Ops whose line may write an output size as a number (:func:`literal_sizes` reads it)."""


def literal_sizes(step: Step, k: int, tensors: Sequence[TensorRecord]) -> list[str | None] | None:
    """An axis whose size the line writes as a number, named by it: mRoPE's
    ``position_ids.expand(3, b, -1)`` is ``(3, B, T)`` (its three position streams, not the
    top-k 3 that is the same size), ``x.reshape(*x.shape[:-1], -1, 2)`` ends in ``2`` (the
    pairs of a complex rotation). A starred argument stands for the axes between: those
    before it count from the left, those after from the right."""
    if (k and step.op != "topk") or step.op not in SIZED_BY_LITERALS or step.source is None:
        return None
    shape = tensors[step.outputs[k]].shape
    if step.op == "topk":  # x.topk(2, dim=-1): the k it keeps, on the last axis
        for args in call_args(step.source.text, step.op):
            if len(args) == 1 and args[0].isdigit() and shape and int(args[0]) == shape[-1] > 1:
                return [None] * (len(shape) - 1) + [args[0]]
        return None
    for args in call_args(step.source.text, step.op):
        starred = [i for i, a in enumerate(args) if a.startswith("*")]
        if len(starred) > 1 or (not starred and len(args) != len(shape)):
            continue
        at = starred[0] if starred else len(args)
        places = list(range(at)) + [len(shape) - (len(args) - i) for i in range(at + 1, len(args))]
        out: list[str | None] = [None] * len(shape)
        for arg, place in zip((a for i, a in enumerate(args) if i != at), places):
            if 0 <= place < len(shape) and arg.isdigit() and int(arg) == shape[place] > 1:
                out[place] = arg
        if any(out):
            return out
    return None


def call_args(text: str, op: str) -> list[list[str]]:
    """The positional arguments of each ``op(...)`` call on a line, stripped, top level only
    (``x.reshape(x.shape[0], -1, chunk_size)`` -> ``["x.shape[0]", "-1", "chunk_size"]``)."""
    out = []
    for m in re.finditer(rf"\b{op}\(", text):
        depth, start, args = 0, m.end(), []
        for i in range(m.end(), len(text)):
            ch = text[i]
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                if depth == 0:
                    args.append(text[start:i].strip())
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                args.append(text[start:i].strip())
                start = i + 1
        else:
            continue  # the call goes on past this line
        out.append([a for a in args if a and "=" not in a])
    return out


def sizes_from_comments(
    steps: Sequence[Step], tensors: Sequence[TensorRecord], sizes: Mapping[str, int]
) -> dict[str, Sized]:
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
    return {k: Sized(v, "a shape comment") for k, v in learned.items() if k not in sizes}
