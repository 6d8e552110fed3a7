"""Every axis of a trace named from evidence, or ``?``: :func:`name_axes`, a pure function.

It reads only the records and the :class:`~tracing.dims.evidence.Evidence` gathered for them,
and walks the steps once, in order, naming each tensor where it is produced:

1. **Its sizes in every pass.** An axis has a size in the real trace and in each extra pass
   (the inputs pass, the knob passes); a name has one too, from the letter sizes each pass
   ran with (:class:`Table`). A name fits an axis when the two agree in every pass that saw
   it: ``T`` for an axis that moved with the tokens, ``H`` for one that moved with
   ``num_attention_heads`` and nothing else.
2. **The ops.** An op's output takes the names of the input axes it comes from, by the
   rules of :mod:`tracing.dims.rules` (linear, conv, view/reshape, transpose/permute,
   matmul, einsum, broadcasting, cat/split/chunk/slice/index, repeat...). A carried name
   must still fit the axis.
3. **Declarations and the line.** A constant no pass moved takes a letter only where the
   config, a module attribute or the source declares it and no other name has its size; a
   shape comment or a number the line writes names its axis if it fits.
4. **Ties**: where two names still fit, a module on the axis's path that declares one of
   them picks it; words never do: the axis reads ``?``.

Each named axis keeps why (``TensorRecord.why``, :func:`tracing.dim_legend.proof_text`).
Nothing proven: ``?``.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping, Sequence

from tracing.dims.evidence import Evidence
from tracing.dims.letters import INPUT_LETTERS, LETTERS, Sized, expressions, letters_in, size_of
from tracing.dims.links import Axes, axis_links, keeps_axes, view_groups
from tracing.dims.links import same_axis as _same  # one axis by its sizes in every pass
from tracing.dims.rules import (
    BY_OP,
    CATS,
    MATMULS,
    MOVES_AXES,
    RESHAPES,
    SPLITS,
    einsum_subscripts,
)
from tracing.dims.source import (
    SIZED_BY_LITERALS,
    literal_sizes,
    permutation,
    shape_comment,
    subscript_entries,
    subscripts,
    text_of,
    transpose_axes,
    written_slices,
)
from tracing.record import Step, TensorRecord, built

Dims = tuple[str, ...]
Pair = tuple[int | None, ...]  # an axis's size in the real trace, the inputs pass, each knob pass

_WORDS = {  # words in a module path or source line -> the letter family they point at
    "rotary": ("rot", "rope", "rotary", "cos", "sin", "inv_freq"),
    "experts": ("expert", "experts", "moe", "router", "gate", "routing", "top_k"),
    "attention": ("attn", "attention", "self_attn", "head", "heads", "query", "key", "value"),
    "ffn": (
        "mlp",
        "ffn",
        "fc",
        "ff",
        "feed",
        "feed_forward",
        "intermediate",
        "linear1",
        "linear2",
        "fc1",
        "fc2",
        "c_fc",
        "up_proj",
        "down_proj",
        "w1",
        "w2",
        "w3",
        "wi",
        "wo",
        "dense_h_to_4h",
        "dense_4h_to_h",
        "fc_in",
        "fc_out",
    ),
    "vocab": ("lm_head", "embed", "wte", "token", "logits", "unembed", "vocab", "tok"),
}


# --------------------------------------------------------------------------- candidates


class Table:
    """Names by the sizes they give in every pass: ``(11, 16) -> ["T"]``, ``(16, 16) -> ["D"]``.

    ``passes[0]`` is the real trace's letter sizes, ``passes[1]`` the inputs pass's (``None``
    when it did not run), and each later one a pass that moved one size knob of the config.
    A name's *signature* is its size in each pass; an axis's is its size in each pass. A name
    fits an axis when the two agree wherever the axis was seen (``None``: not seen there).
    """

    def __init__(self, passes: Sequence[Mapping[str, int] | None]):
        self.passes = [dict(p) if p is not None else None for p in passes]
        self.sizes1 = self.passes[0]
        self.sizes2 = self.passes[1] if len(self.passes) > 1 else None
        sizes1 = self.sizes1
        knobs = [n for n in sizes1 if n not in LETTERS and n.isidentifier()]  # named after
        # a constructor argument no letter spells (tracing.dims.prove._name_after_knobs)
        names = [n for n in LETTERS if n in sizes1] + knobs + expressions(sizes1) + ["1", "0"]
        self.groups = [set(letters_in(n)) for n in names if len(letters_in(n)) > 1]
        self.every: list[tuple[str, Pair]] = []  # also the expressions a letter's pair hides
        self.by_size: dict[int, list[str]] = {}
        self.hidden: dict[Pair, list[str]] = {}  # expressions a letter of their pair hides
        base: set[Pair] = set()
        self._pair: dict[str, Pair | None] = {}
        for name in names:
            pair = self.pair(name)
            if pair is None or pair[0] < 0 or (pair[0] == 0 and name != "0"):
                continue
            self.every.append((name, pair))
            is_letter = name in LETTERS or name in ("1", "0") or name in knobs
            if not is_letter and pair in base:
                self.hidden.setdefault(pair, []).append(name)
                continue  # ``H·D`` when it is C: the letter names it
            if is_letter:
                base.add(pair)
            self.by_size.setdefault(pair[0], []).append(name)

        width = self.pair("C") if "C" in sizes1 else None
        self.hidden.pop(width, None)  # C is H·D by definition: what C hides stays hidden

    def pair(self, name: str) -> Pair | None:
        """``name``'s size in each pass (``None`` where that pass cannot say)."""
        if name in self._pair:
            return self._pair[name]
        v1 = size_of(name, self.sizes1)
        if v1 is None:
            out = None
        else:
            out = (
                v1,
                *(
                    (None if _moves(name) else v1) if sizes is None else size_of(name, sizes)
                    for sizes in self.passes[1:]
                ),
            )
            if len(out) == 1:
                out = (v1, None if _moves(name) else v1)
        self._pair[name] = out
        return out

    def fits(self, name: str, pair: Pair) -> bool:
        mine = self.pair(name)
        return mine is not None and _agree(mine, pair)

    def candidates(self, pair: Pair) -> list[str]:
        if len(pair) < 2 or pair[1] is None:  # not seen in the inputs pass: by size alone
            found = self.by_size.get(pair[0], ())
            return [n for n in found if _agree(self._pair[n], pair, skip_inputs=True)]
        found = [n for n in self.by_size.get(pair[0], ()) if _agree(self._pair[n], pair)]
        if not found and self.sizes2 is not None:
            found = _offset_of_t(pair, self.sizes1, self.sizes2)
        return found

    def moved_by(self, name: str) -> list[int]:
        """The passes whose size of ``name`` differs from the real trace's: its proof."""
        pair = self.pair(name) or ()
        return [i for i, v in enumerate(pair[1:], 1) if v is not None and v != pair[0]]


def _agree(mine: Pair | None, pair: Pair, skip_inputs: bool = False) -> bool:
    """Equal sizes wherever both are known (``skip_inputs``: the inputs pass not read)."""
    if mine is None or mine[0] != pair[0]:
        return False
    for i in range(1, min(len(mine), len(pair))):
        if skip_inputs and i == 1:
            continue
        a, b = mine[i], pair[i]
        if a is not None and b is not None and a != b:
            return False
        if i == 1 and a is None and b is not None:
            return False
    return True


def _constant(pair: Pair) -> bool:
    """The axis has one size in every pass that saw it (no pass moved it)."""
    return all(v is None or v == pair[0] for v in pair[1:])


def _offset_of_t(pair: Pair, s1: Mapping[str, int], s2: Mapping[str, int]) -> list[str]:
    """``T+3`` for an axis that moved by T's step but is 3 longer (a prefix, a cache)."""
    if "T" not in s1 or "T" not in s2:
        return []
    c = pair[0] - s1["T"]
    if pair[1] is not None and pair[1] - s2["T"] == c and 0 < abs(c) <= 8:
        return [f"T+{c}" if c > 0 else f"T-{-c}"]
    return []


def _moves(name: str) -> bool:
    return any(letter in INPUT_LETTERS for letter in letters_in(name))


# --------------------------------------------------------------------------- ops


class _Namer:
    """One walk over the steps in order, naming each tensor where it is produced."""

    def __init__(self, steps, tensors, table: Table, pairs, paths, attrs):
        self.steps, self.tensors, self.table = steps, tensors, table
        self.pairs: list[list[Pair]] = pairs
        self.paths: Mapping[int, str] = paths
        self.attrs: Mapping[str, Mapping[str, int]] = attrs
        self.names: list[Dims | None] = [None] * len(tensors)  # while walking ("?" kept)
        self.final: list[Dims | None] = [None] * len(tensors)  # no named axis: None
        self.why: list[tuple[str, ...] | None] = [None] * len(tensors)  # each axis's proof
        self.written: dict[str, str] = {}  # letter -> where the source passes its size
        self.unread: set[str] = set()  # letters whose every knob pass moved no axis
        self.shaped: dict[str, tuple[str, str]] = {}  # letter -> (module, attribute) sizing it
        self.contracts: Mapping[str, tuple] = {}  # parameter path -> what sizes each axis
        self._why, self._declared_by, self._data = "", "", False
        self._comments: dict[str, Dims | None] = {}
        # decide() is a pure function of its question (and of the tables above, fixed
        # before the walk): its answers, with their proofs, by question
        self._decided: dict[tuple, tuple[str, str, str]] = {}

    def run(self, first_input: int | None) -> list[Dims | None]:
        self.within_line = _within_line(self.steps, self.tensors)
        if first_input is not None:
            shape = self.tensors[first_input].shape
            seed = ("B", "T" if "T" in self.table.sizes1 else None) + (None,) * len(shape)
            seed = seed[: len(shape)]
            self.name(first_input, list(seed), "", "", via="input")
        for rid, record in enumerate(self.tensors):  # parameters, buffers, inputs
            if record.producer is None and self.names[rid] is None:
                path = self.paths.get(rid, "")
                self.name(rid, [None] * len(record.shape), path, "", leaf=True)
                self._anchor(rid, path)
                self._contract(rid, path)
        same: dict[tuple, tuple] = {}  # a broadcast step asked again: its answer
        for step in self.steps:
            if step.kind == "backward":
                continue
            text = text_of(step)
            for k, rid in enumerate(step.outputs):
                producer = self.tensors[rid].producer
                if self.names[rid] is not None or producer not in (step.index, None):
                    continue
                key = self._question(step, k, rid, text)
                answer = same.get(key) if key is not None else None
                if answer is not None:  # a loop's step again: the same question, answered
                    self.names[rid], self.final[rid], self.why[rid] = answer
                    continue
                carried = self.carried(step, k, rid)
                written = self._comment(text, rid) or literal_sizes(step, k, self.tensors)
                self.name(rid, carried, step.module, text, written, via=step.op)
                if key is not None:
                    same[key] = (self.names[rid], self.final[rid], self.why[rid])
        for rid, record in enumerate(self.tensors):
            if self.names[rid] is None:
                self.name(rid, [None] * len(record.shape), "", "")
        return self.final

    def _question(self, step: Step, k: int, rid: int, text: str) -> tuple | None:
        """What naming output ``k`` of a step that no rule names (it broadcasts: ``x * 0.5``,
        ``gelu(x)``) depends on, as a key: the op, its module and line, and each input's
        names, sizes and role; the output's sizes, role and whether its line's comment may
        speak of it. Two such steps with one key get one answer, so a loop of 50,000 of
        them is named by a dictionary lookup each. ``None`` for a step a rule names (rules
        read more: parameter paths, the line's arguments)."""
        op = step.op
        if op in BY_OP or op in CATS or op in SIZED_BY_LITERALS:
            return None
        names, pairs, tensors = self.names, self.pairs, self.tensors
        ins = tuple((names[i], pairs[i], tensors[i].role) for i in step.inputs)
        commented = "#" in text and rid not in self.within_line
        return (op, step.module, text, k, ins, pairs[rid], tensors[rid].role, commented)

    def _anchor(self, rid: int, path: str) -> None:
        """A letter read off a layer's shape names that axis of the layer's weight (and
        bias), in the layer and in the same layer of every other repeat of its list:
        ``F`` from ``layers.0.linear1.out_features`` is the rows of every ``linear1``."""
        module, _, kind = path.rpartition(".")
        for letter, (where, attr) in self.shaped.items():
            axis = _SHAPE_AXES.get((kind, attr))
            shape = self.tensors[rid].shape
            if axis is None or axis >= len(shape) or not _repeat_of(module, where):
                continue
            if shape[axis] == self.table.sizes1.get(letter) and _constant(self.pairs[rid][axis]):
                self._rename(rid, axis, letter, f"declared {where}.{attr}")

    def _contract(self, rid: int, path: str) -> None:
        """A torch layer's parameter, axis by axis as its documentation says
        (:mod:`tracing.dims.contracts`): an axis its ``hidden_size`` sizes is the letter
        that attribute spells (``C``; ``4C`` for four gates stacked), proven at any sizes;
        one its ``input_size`` sizes is no letter's, whatever a size that matched said."""
        contract = self.contracts.get(path)
        if contract is None:
            return
        module = path.rpartition(".")[0]
        names = self.names[rid] or ("?",) * len(contract)
        proofs = self.why[rid] or ("",) * len(contract)
        for axis, part in enumerate(contract):
            if part is None:
                continue
            letter = _spelled_by(part.attr)
            pair = self.pairs[rid][axis]
            if letter is not None and self.table.sizes1.get(letter) == part.size:
                name = letter if part.times == 1 else f"{part.times}{letter}"
                proven = proofs[axis].startswith(("moved", "input"))
                if _constant(pair) and not (proven and names[axis] == name):
                    self._rename(rid, axis, name, f"declared {module}.{part.attr}")
            elif names[axis] != "?" and not proofs[axis].startswith(("moved", "input")):
                self._rename(rid, axis, "?", "")  # sized by an attribute no letter spells

    def join(self, links) -> list[Dims | None]:
        """Names given across the axes the ops say are one (:mod:`tracing.dims.links`):
        an axis left ``?`` takes the one name its class's named axes agree on (a vision
        transformer's residual stream is its norms' declared ``C``); a class whose axes
        disagree, or that holds no name, is left as it is."""
        classes = Axes(links).classes()
        self._fill(classes)
        for _ in range(3):  # a part proven gives a whole, which may prove another class
            if not (self._sum_parts() | self._halves() | self._cat_rest() | self._products()):
                break
            self._fill(classes)
        return self.final

    def rename_if_unnamed(self, rid: int, axis: int, name: str, why: str) -> None:
        """Name one axis that the walk left ``?`` (and only such an axis)."""
        names = self.names[rid]
        axis %= len(self.tensors[rid].shape)
        if names is None or names[axis] == "?":
            self._rename(rid, axis, name, why)

    def _halves(self) -> bool:
        """The two equal parts of a ``cat`` whose axis is named ``X``, left ``?``: ``X/2``
        (a rotary table's ``cat((freqs, freqs))``, proven ``R`` where it meets the query)."""
        done = False
        for step in self.steps:
            if step.kind != "op" or step.op not in CATS or len(step.inputs) != 2:
                continue
            res = step.outputs[0] if len(step.outputs) == 1 else None
            a, b = step.inputs
            if res is None or a != b or self.names[res] is None or self.names[a] is None:
                continue
            shape, part = self.tensors[res].shape, self.tensors[a].shape
            if len(part) != len(shape):
                continue
            cut = [i for i in range(len(shape)) if part[i] != shape[i]]
            if len(cut) != 1 or 2 * part[cut[0]] != shape[cut[0]]:
                continue
            whole, mine = self.names[res][cut[0]], self.names[a][cut[0]]
            half = f"{whole}/2"
            letter = re.fullmatch(r"[A-Za-z][A-Za-z_]*", whole or "") and whole in LETTERS
            if mine == "?" and letter and self.table.fits(half, self.pairs[a][cut[0]]):
                self._rename(a, cut[0], half, f"sum {step.op}")
                done = True
        return done

    def _products(self) -> bool:
        """An axis left ``?`` that a ``view``/``reshape`` splits into named axes, or merges
        from them: their product (``(B, T, 160) -> (B, T, H, D)``: the 160 are ``H·D``)."""
        done = False
        for step in self.steps:
            if step.kind != "op" or step.op not in RESHAPES or len(step.outputs) != 1:
                continue
            src, res = self._primary(step), step.outputs[0]
            if src is None or self.names[src] is None or self.names[res] is None:
                continue
            for gi, gj in view_groups(self.pairs[src], self.pairs[res]) or ():
                for whole, parts, w, p in ((src, res, gi, gj), (res, src, gj, gi)):
                    if len(w) == 1 and len(p) >= 2 and self._factor(step, whole, parts, w, p):
                        done = True
                        continue
                    if len(w) != 1 or len(p) < 2 or self.names[whole][w[0]] != "?":
                        continue
                    names = [self.names[parts][j] for j in p]
                    if not all(_named(n) and n != "1" and not _is_slice(n) for n in names):
                        continue
                    product = "·".join(f"({n})" if any(c in n for c in "+-/") else n
                                       for n in names)  # fmt: skip
                    if self.table.fits(product, self.pairs[whole][w[0]]):
                        self._rename(whole, w[0], product, f"carried {step.op}")
                        done = True
        return done

    def _factor(self, step: Step, whole: int, parts: int, w, p) -> bool:
        """The one part left ``?`` of a named product that a ``view`` splits, the others
        named: the product less them (``(B, T, H·D) -> (B, T, H, ?)``: the ``?`` is ``D``,
        the values' head width once their width is proven ``H·D``)."""
        product = self.names[whole][w[0]]
        names = [self.names[parts][j] for j in p]
        if not _named(product) or _is_slice(product) or names.count("?") != 1:
            return False
        k = names.index("?")
        known = [n for i, n in enumerate(names) if i != k and n != "1"]
        if not all(_named(n) and not _is_slice(n) for n in known):
            return False
        rest = _quotient(product, known)
        if rest is None or not self.table.fits(rest, self.pairs[parts][p[k]]):
            return False
        self._rename(parts, p[k], rest, f"carried {step.op}")
        return True

    def _cat_rest(self) -> bool:
        """The one part of a two-part ``cat`` left ``?`` beside a named part, whose whole is
        a letter ``X``: ``X`` less the other (a vision transformer's patches beside its
        class token are ``Tk-1``, where ``Tk`` is proven by its attention)."""
        done = False
        for step in self.steps:
            if step.kind != "op" or step.op not in CATS or len(step.outputs) != 1:
                continue
            res, parts = step.outputs[0], list(dict.fromkeys(step.inputs))
            if len(parts) != len(step.inputs) or self.names[res] is None:
                continue
            shape = self.tensors[res].shape
            if any(len(self.tensors[p].shape) != len(shape) for p in parts):
                continue
            cut = [a for a in range(len(shape)) if any(
                self.tensors[p].shape[a] != shape[a] for p in parts)]  # fmt: skip
            if len(cut) != 1:
                continue
            a, whole = cut[0], self.names[res][cut[0]]
            names = [(self.names[p] or ("?",) * len(shape))[a] for p in parts]
            if len(parts) != 2 or names.count("?") != 1 or whole not in LETTERS:
                continue
            part, known = (parts[1], names[0]) if names[1] == "?" else (parts[0], names[1])
            if not _named(known) or _is_slice(known):
                continue
            rest = f"{whole}-{known}"
            if self.table.fits(rest, self.pairs[part][a]):
                self._rename(part, a, rest, f"rest {step.op}")
                done = True
        return done

    def _sum_parts(self) -> bool:
        """An axis a ``split`` or ``chunk`` cuts into named parts, left ``?``: the sum of
        its parts (nanoGPT's ``c_attn(x).split(n_embd, dim=2)`` into three ``C``: ``3C``)."""
        done = False
        for step in self.steps:
            if step.kind != "op" or step.op not in SPLITS or len(step.outputs) < 2:
                continue
            src = step.inputs[0] if step.inputs else None
            if src is None or self.names[src] is None:
                continue
            shape = self.tensors[src].shape
            outs = [self.tensors[o].shape for o in step.outputs]
            if any(len(o) != len(shape) for o in outs):
                continue
            cut = [a for a in range(len(shape)) if any(o[a] != shape[a] for o in outs)]
            if len(cut) != 1 or sum(o[cut[0]] for o in outs) != shape[cut[0]]:
                continue
            a = cut[0]
            parts = [(self.names[o] or ("?",) * len(shape))[a] for o in step.outputs]
            if self.names[src][a] != "?" or not all(_named(p) for p in parts):
                continue
            if any(_is_slice(p) for p in parts):
                continue
            whole = _summed(parts)
            if self.table.fits(whole, self.pairs[src][a]):
                self._rename(src, a, whole, f"sum {step.op}")
                done = True
        return done

    def _fill(self, classes) -> None:
        for members in classes.values():
            named: dict[str, tuple[int, int]] = {}
            for rid, axis in members:
                name = (self.names[rid] or ())[axis : axis + 1]
                if name and _named(name[0]) and name[0] != "1" and not _is_slice(name[0]):
                    named.setdefault(name[0], (rid, axis))
            if len(named) != 1:
                continue
            ((name, (src, _)),) = named.items()
            for rid, axis in members:
                names = self.names[rid]
                if names is not None and names[axis] == "?":
                    self._rename(rid, axis, name, f"same #{src}")

    def _comment(self, text: str, rid: int) -> list[str | None] | None:
        if "#" not in text or rid in self.within_line:
            return None  # a shape comment says what its line gives, not a step inside it
        if text not in self._comments:
            self._comments[text] = shape_comment(text)
        comment = self._comments[text]
        n = len(self.tensors[rid].shape)
        if comment is None:
            return None
        if comment[0] == "...":
            tail = list(comment[1:])
            return None if len(tail) > n else [None] * (n - len(tail)) + tail
        return list(comment) if len(comment) == n else None

    def name(
        self, rid, carried, context, text, comment=None, leaf: bool = False, via: str = ""
    ) -> None:
        pairs = self.pairs[rid]
        record = self.tensors[rid]  # an image's axes past B: data layout, no declared size
        self._data = record.role == "input" and len(record.shape) > 3
        out, why = [], []
        decided = self._decided
        for i, pair in enumerate(pairs):
            hints = (carried[i] if carried else None, comment[i] if comment else None)
            key = (pair, hints, context, text, leaf, self._data)
            try:
                self._why, self._declared_by, name = decided[key]
            except KeyError:  # decided once per distinct question (a layer repeats them)
                self._why, self._declared_by = "", ""
                name = self.decide(pair, hints, context, text, leaf)
                decided[key] = (self._why, self._declared_by, name)
            except TypeError:  # pragma: no cover - an unhashable hint
                self._why, self._declared_by = "", ""
                name = self.decide(pair, hints, context, text, leaf)
            out.append(name)
            source = self._declared_by if self._why == "declared" else via
            why.append(_proof(self._why, source, out[-1], pair, self.table))
        self._store(rid, out)
        self.why[rid] = tuple(why)

    def _store(self, rid: int, names: Sequence[str]) -> None:
        """A tensor's names, as the walk keeps them (:data:`CUT` included) and as shown."""
        self.names[rid] = tuple(names)
        shown = tuple("?" if n == CUT else n for n in names)
        self.final[rid] = None if all(n == "?" for n in shown) else shown

    def decide(self, pair: Pair, hints, context: str, text: str, leaf: bool = False) -> str:
        """One axis's name; ``self._why`` says which evidence gave it (:func:`_proof`)."""
        table = self.table
        cands = table.candidates(pair)
        if hints[0] and hints[0].isdigit() and hints[1] and hints[1] in cands:
            hints = (None, hints[1])  # view(2, 6, 3, 4) then "# (B, nh, T, hs)": 3 is H
        for hint, why in zip(hints, ("carried", "written")):
            if hint and hint != "?" and (hint in cands or table.fits(hint, pair)):
                self._why = why
                return hint
        if (pair[0] == 1 and all(v in (1, None) for v in pair[1:])) or (
            pair[0] == 1 and "1" in cands
        ):
            self._why = "one"
            return "1"  # a size-one axis nothing carried a letter to (KV == 1 included)
        if hints[0] == CUT or _is_slice(hints[0]):
            self._why = "slice"
            return hints[0]  # a part of a named axis no letter is a part of, carried along
        if pair[1] is None and any(_moves(c) for c in cands):
            return "?"  # no second pass for this tensor: names that move need the ops
        if len(cands) == 1:
            if self._data and _constant(pair) and not table.moved_by(cands[0]):
                return "?"  # an image's 3 channels are not the 3 heads a config declares
            if _constant(pair) and not table.moved_by(cands[0]):
                if hints[0] == "?":
                    return "?"  # the op says it is an input's axis, which nothing named
                declared = self._declared(context, cands[0], pair[0])
                if declared is None or self._hidden(pair, {_family(cands[0])}):
                    return "?"  # a computed axis of a constant's size, which nothing carried
                    # (or which a ratio of another family, R/2 beside KV, has too)
                self._why = "declared"
                self._declared_by = declared
                return cands[0]
            self._why = "sizes"
            return self._letter_or_hidden(cands[0], pair, context, text, leaf)
        if not cands:
            return "?"
        read = [c for c in cands if not set(letters_in(c)) & self.unread]
        if len(read) == 1:  # the other's knob moved no axis of the trace
            self._why = "sizes"
            return read[0]
        near = {c: self._declared_nearest(context, c, pair[0]) for c in cands}
        near = {c: where for c, where in near.items() if where is not None}
        if len(near) == 1:  # one of the tied names is declared by the module it runs in
            ((name, where),) = near.items()
            self._why, self._declared_by = "declared", where
            return name
        # two names give the axis's sizes in every pass and nothing parts them: the words
        # of its module path or line are no proof (a pass moving one of the knobs would be)
        return "?"

    def _declared(self, context: str, name: str, size: int) -> str | None:
        """Where ``name``'s size is declared: the config or source line that gives it, or
        the nearest module, from ``context`` outwards, that declares it as an attribute of
        its own (``self.num_heads = 4``), or a sibling of a module on that path (the parts of
        one layer share its sizes; the whole model is no such scope); for an expression
        (``D-R``), every letter of it so. ``None`` when some part is only derived (``C / H``,
        a layer's shape)."""
        parts = letters_in(name)
        if name[:1].isdigit() and not all(p in self.written for p in parts):
            return None  # 2C beside a width a module declares: a multiple of it is a
            # relation, which a pass moving C proves (a config's own C: its knob can)
        if len(parts) > 1:
            found = [self._declared(context, p, self.table.sizes1.get(p, -1)) for p in parts]
            return None if None in found else " and ".join(dict.fromkeys(found))
        letter = parts[0] if parts else name
        if letter != name:  # D/2: D's own size is what a module declares
            size = self.table.sizes1.get(letter, -1)
        written = self.written.get(letter)
        if written is not None:
            return written
        on_path = self._declared_here(context, letter, size)
        if on_path is not None:
            return on_path
        if self.attrs.get("", {}).get(letter) == size:
            return "the model"
        for where, declared in self.attrs.items():  # a sibling's: a layer's parts share sizes
            scope = where.rpartition(".")[0]
            if declared.get(letter) == size and scope and f"{context}.".startswith(f"{scope}."):
                return where
        return None

    def _declared_here(self, context: str, letter: str, size: int) -> str | None:
        """The nearest module from ``context`` outwards whose own attribute declares
        ``letter`` at ``size`` (``self.num_heads = 4``): the module the axis lives in says
        which of two equal sizes it is. ``None``: no module on the path does."""
        path = context
        while path:
            if self.attrs.get(path, {}).get(letter) == size:
                return path
            path = path.rpartition(".")[0]
        return None

    def _declared_nearest(self, context: str, letter: str, size: int) -> str | None:
        """The nearest module from ``context`` outwards that declares any size, if it
        declares ``letter`` at ``size``: that module speaks for the axes it makes (an
        ``nn.MultiheadAttention``'s ``num_heads``); one further out that declares many
        (a whole model's ``vocab_size``) says nothing of an axis deep inside it."""
        path = context
        while path:
            declared = self.attrs.get(path)
            if declared:
                return path if declared.get(letter) == size else None
            path = path.rpartition(".")[0]
        return None

    def _hidden(self, pair: Pair, families: set[str]) -> list[str]:
        """The ratios and halves of other families that letters of ``pair`` hide (``R/2``
        behind ``KV`` when both are 2): a product (``2KV·D``) is a fused width, which a
        weight carries, not a size alone."""
        hidden = self.table.hidden.get(pair)
        if hidden is None:  # an axis some pass did not pair (None): match where it was seen
            hidden = [h for key, names in self.table.hidden.items() if _agree(key, pair)
                      for h in names]  # fmt: skip
        return [h for h in hidden if "/" in h and "·" not in h and _family(h) not in families]

    def _letter_or_hidden(self, letter: str, pair: Pair, context, text, leaf) -> str:
        """The one letter of an axis's sizes, unless the words of its module and line point
        at an expression of another family that the letter hides (top-k ``K`` = 3 in
        ``self_attn``, where ``H/KV`` is 3 too: the query heads per key/value head)."""
        if letter == "C":
            return letter  # C is H·D by definition: the model width names it
        hidden = self._hidden(pair, {_family(letter)})
        if hidden and letter in LETTERS:
            picked = _tie_break([letter, *hidden], context, text, self.attrs, leaf)
            if picked in hidden and _family(picked) != "input":
                self._why = "words"
                return picked
        pointed = {_KIN.get(f, f) for f in _pointed(context, text)}
        family = _KIN.get(_family(letter), _family(letter))
        if not leaf and pointed and family in _KIN.values() and family not in pointed:
            return "?"  # the top-k K's size inside the rotary embedding: the size alone
        return letter

    # ---- what an op carries from its inputs, per output axis

    def carried(self, step: Step, k: int, rid: int) -> list[str | None]:
        """The names an op carries to output ``k`` from its inputs' axes: the first rule of
        :data:`tracing.dims.rules.RULES` for the op that says something, else broadcasting
        (and, for ``cat``, the sum of its parts)."""
        n = len(self.tensors[rid].shape)
        if all(self.names[i] is None for i in step.inputs):
            return [None] * n
        for rule in BY_OP.get(step.op, ()):
            try:
                out = getattr(self, rule.method)(step, k, rid, n)
            except (IndexError, KeyError, ValueError):
                out = None
            if out is not None:
                return out
        out = self._broadcast(step, rid)
        return self._cat(step, rid, out) if step.op in CATS else out

    # ---- the rules (tracing.dims.rules): (step, output k, its id, its rank) -> names

    def _rule_linear(self, step: Step, k: int, rid: int, n: int):
        if len(step.inputs) >= 2:
            return self._linear(step.inputs[0], step.inputs[1], n, step.inputs[2:3])
        return None

    def _rule_embedding(self, step: Step, k: int, rid: int, n: int):
        if len(step.inputs) >= 2:
            return [*self._get(step.inputs[0]), self._get(step.inputs[1])[-1]][-n:]
        return None

    def _rule_conv(self, step: Step, k: int, rid: int, n: int):
        return self._conv(step.inputs[0], step.inputs[1], n) if len(step.inputs) >= 2 else None

    def _rule_matmul(self, step: Step, k: int, rid: int, n: int):
        if len(step.inputs) >= 2:
            return self._matmul(step.inputs[-2], step.inputs[-1], n)
        return None

    def _rule_einsum(self, step: Step, k: int, rid: int, n: int):
        found = einsum_subscripts(text_of(step), len(step.inputs))
        if found is None or len(found[1]) != n:
            return None
        where: dict[str, str | None] = {}
        for operand, axes in zip(step.inputs, found[0]):
            names = self._get(operand)
            if len(axes) != len(names):
                return None
            for sub, name in zip(axes, names):
                if where.get(sub) in (None, "?"):
                    where[sub] = name
        return [where.get(sub) for sub in found[1]]

    def _rule_recurrent(self, step: Step, k: int, rid: int, n: int):
        x, rest = step.inputs[0], step.inputs[1:]
        hh = [i for i in rest if _param_name(self.paths.get(i, "")).startswith("weight_hh_l")]
        states = [i for i in rest if i not in self.paths and self.tensors[i].shape]
        if not hh or len(self.tensors[hh[-1]].shape) != 2:
            return None
        width, size = self._get(hh[-1])[1], self.tensors[hh[-1]].shape[1]
        last = self.tensors[rid].shape[-1]
        if k == 0:
            both = f"2{width}" if width not in (None, "?") and last == 2 * size else None
            return [*self._get(x)[: n - 1], width if last == size else both]
        if k - 1 >= len(states) or self.tensors[states[k - 1]].shape != self.tensors[rid].shape:
            return None
        return [*self._get(states[k - 1])[:-1], width if last == size else None]

    def _rule_moved(self, step: Step, k: int, rid: int, n: int):
        primary = self._primary(step)
        return None if primary is None else self._moved(step, primary, rid)

    def _rule_reshape(self, step: Step, k: int, rid: int, n: int):
        primary = self._primary(step)
        if primary is None:
            return None
        return self._reshape(primary, rid, literal_sizes(step, k, self.tensors))

    def _rule_gathered(self, step: Step, k: int, rid: int, n: int):
        if len(step.inputs) != 2:
            return None
        return self._gathered(step.inputs[0], step.inputs[1], rid)

    def _rule_sliced(self, step: Step, k: int, rid: int, n: int):
        primary = self._primary(step)
        if primary is None:
            return None
        sliced = self._sliced(primary, rid, step if step.op == "getitem" else None)
        if sliced is None and step.op in ("getitem", "select", "unbind"):
            sliced = self._indexed(primary, rid, step)
        return sliced

    def _rule_grown(self, step: Step, k: int, rid: int, n: int):
        primary = self._primary(step)
        if primary is None or "None" not in text_of(step):
            return None
        return self._grown(primary, rid, step)

    def _rule_kept(self, step: Step, k: int, rid: int, n: int):
        primary = self._primary(step)
        if primary is None:
            return None
        ins, outs = self.pairs[primary], self.pairs[rid]
        kept_in = [i for i, p in enumerate(ins) if p[0] != 1]
        kept_out = [j for j, p in enumerate(outs) if p[0] != 1]
        if len(kept_in) != len(kept_out):
            return None
        names, out = self._get(primary), [None] * n
        for i, j in zip(kept_in, kept_out):
            out[j] = names[i]
        return out

    def _rule_complex(self, step: Step, k: int, rid: int, n: int):
        primary = self._primary(step)
        if primary is None:
            return None
        if step.op == "view_as_real":  # a complex axis: its 2 parts
            return [*self._get(primary), "2"][-n:]
        return self._get(primary)[:-1][-n:]  # pairs become one number

    def _rule_repeated(self, step: Step, k: int, rid: int, n: int):
        primary = self._primary(step)
        return None if primary is None else self._repeated(primary, rid)

    def _cat(self, step: Step, rid: int, out: list[str | None]) -> list[str | None]:
        """A ``cat`` axis is the sum of its parts: ``D/2`` and ``D/2`` make ``D``, ``Lkv``
        and ``R`` make ``Lkv+R``."""
        n = len(out)
        parts = [i for i in step.inputs if len(self.tensors[i].shape) == n]
        for axis in range(n):
            if out[axis] is not None or len(parts) < 2:
                continue
            names = [self._get(i)[axis] for i in parts]
            if None in names or "?" in names:
                continue
            if CUT in names:
                out[axis] = CUT
                continue
            half = names[0][:-2] if names[0].endswith("/2") else None
            if half and len(names) == 2 and names[1] == names[0]:
                out[axis] = half
            else:
                out[axis] = _summed(names)
        return out

    def _sliced(self, src: int, rid: int, step: Step | None = None) -> list[str | None] | None:
        """A slice or split keeps every axis it leaves whole and names a cut one when it is a
        half or undoes a coefficient: rotary halves of ``D`` are ``D/2`` (whatever else is
        that size), the thirds of a fused ``3C`` are ``C``; any other part (a rotary width
        ``R`` of ``D``) is left to the letters that fit it, when one is a part of the cut
        name (its letters among the name's, or the two in one expression of the table:
        ``D-R``); a part no such letter fits is :data:`CUT` (a chunk of ``Q`` cut to the
        loop's ``i`` tokens is not the heads ``Hk`` because ``i`` is 9 once). Where the
        step's line writes that cut (``attn[..., :i, :i]``), it is named as written:
        ``Q[:i]``, see :meth:`_slice_name`."""
        ins, outs = self.pairs[src], self.pairs[rid]
        if len(ins) != len(outs):
            return None
        names = self._get(src)
        out: list[str | None] = []
        written = written_slices(step, len(ins)) if step is not None else None
        for axis, (name, a, b) in enumerate(zip(names, ins, outs)):
            (a1, a2), (b1, b2) = a[:2], b[:2]  # the trace and the inputs pass (knob passes
            # after them, where they ran, are read by the names that must fit the part)
            if (a1, a2) != (b1, b2) and name and written and ":" in written[axis]:
                sliced = self._slice_name(name, written[axis], b)
                if sliced is not None:
                    out.append(sliced)
                    continue
            if (a1, a2) == (b1, b2) or name is None:
                out.append(name if (a1, a2) == (b1, b2) else None)
                continue
            if not b1 or a1 % b1 or a2 is None or not b2 or a2 * b1 != b2 * a1:
                out.append(self._part(name, b))  # not one whole factor (both passes)
                continue
            factor = a1 // b1
            coefficient = re.match(r"^(\d+)([A-Za-z].*)$", name)
            if coefficient and int(coefficient.group(1)) == factor:
                out.append(coefficient.group(2))  # 3C / 3 = C
            elif factor == 2 and re.fullmatch(r"[A-Za-z][A-Za-z_]*", name):
                out.append(f"{name}/2")  # rotary halves; other parts keep their own letter
            else:
                out.append(self._part(name, b))
        return out

    def _slice_name(self, name: str, entry: str, pair: Pair) -> str | None:
        """An axis cut from ``name`` by a slice the line writes (``entry``), where no letter
        fits the cut: named as written, ``Q[:i]`` for ``attn[..., :i, :i]`` of a chunk axis
        ``Q`` (a loop's ``i`` has another size at each step, which no letter can have).
        Else what :meth:`_part` says: a letter that fits names it (``R`` of ``D``)."""
        part = self._part(name, pair)
        written = _SLICE_TEXT.fullmatch(entry) and entry.replace(":", "").strip()
        if name == CUT or _is_slice(name) or pair[0] == 1 or not written:
            return part
        if part == CUT or (part is None and name != "?" and not self.table.candidates(pair)):
            return f"{name}[{entry.replace(' ', '')}]"
        return part

    def _part(self, name: str, pair: Pair) -> str | None:
        """What a cut of ``name`` to ``pair`` may be called: ``None`` (let the letters that
        fit decide) when one of them is a part of ``name``, else :data:`CUT`."""
        if name == CUT:
            return CUT
        if name == "?":
            return None  # nothing known of the whole: the letters that fit the part decide
        cands = self.table.candidates(pair)
        if not cands or pair[0] == 1 or any(_moves(c) for c in cands) or _moves(name):
            return None
        mine = set(letters_in(name))
        if not mine:
            return CUT  # a cut of a number the code writes (mRoPE's 4 streams) is no letter
        if mine & {"H", "D"}:
            mine.add("C")  # C is H·D: a fused projection's query part
        kin = _kin(name)

        def part(c: str) -> bool:
            theirs = set(letters_in(c))
            return (
                theirs <= mine
                or _kin(c) == kin
                or any(mine | theirs <= group for group in self.table.groups)
            )

        if any(part(c) for c in cands):
            return None
        hidden = [n for n, p in self.table.every if p == pair and part(n)]
        return hidden[0] if len(hidden) == 1 else CUT  # R/2, where Hs too is 4

    def _indexed(self, src: int, rid: int, step: Step) -> list[str | None] | None:
        """An integer index drops axes and keeps the rest in order: ``x[:, :, i, :]`` of
        ``(B, I, T, S)`` is ``(B, I, S)``: each output axis takes the name every choice of
        kept axes that fits the sizes gives it (a scan's step inside a loop, whose B the
        second pass did not pair; with T == S the last axis is left to the other rules)."""
        ins, outs = self.pairs[src], self.pairs[rid]
        if not 0 < len(outs) < len(ins) or len(ins) > 8:
            return None
        fits = [
            kept
            for kept in itertools.combinations(range(len(ins)), len(outs))
            if all(_same(ins[i], out) for i, out in zip(kept, outs))
        ]
        if not fits:  # a kept axis was sliced too (attn[..., i, :i]): the source says which
            written = {k for k in subscripts(step, len(ins)) if len(k) == len(outs)}
            if len(written) != 1:
                return None
            kept, names = written.pop(), self._get(src)
            entries = written_slices(step, len(ins)) or [":"] * len(ins)
            return [
                names[i]
                if _same(ins[i], out)
                else names[i] and self._slice_name(names[i], entries[i], out)
                for i, out in zip(kept, outs)
            ]
        written = {kept for kept in subscripts(step, len(ins)) if kept in fits}
        if len(written) == 1:  # the source says which: x[:, :, i, :] keeps axes 0, 1, 3
            fits = list(written)
        names = self._get(src)
        picks = [{names[kept[j]] for kept in fits} for j in range(len(outs))]
        return [pick.pop() if len(pick) == 1 else None for pick in picks]  # what all agree on

    def _gathered(self, src: int, index: int, rid: int) -> list[str | None] | None:
        """``x[idx]`` with an index tensor: the index's axes, then the rest of ``x``'s
        (Phi-MoE's ``hidden_states[perm // num_top_k]``: ``(B·T·2, C)`` from ``(B·T, C)``)."""
        ins, idx, outs = self.pairs[src], self.pairs[index], self.pairs[rid]
        if self.tensors[index].dtype not in _INDEX_DTYPES or not idx:
            return None
        if len(outs) != len(idx) + len(ins) - 1:
            return None
        if not all(_same(a, b) for a, b in zip([*idx, *ins[1:]], outs)):
            return None
        return [*self._get(index), *self._get(src)[1:]]

    def _grown(self, src: int, rid: int, step: Step) -> list[str | None] | None:
        """``x[..., None]`` and ``x[:, None, :]``: the input's axes in order, a ``1`` where
        the subscript writes ``None`` (the one subscript on the line that fits both ranks)."""
        n_in, n_out = len(self.tensors[src].shape), len(self.tensors[rid].shape)
        names = self._get(src)
        found = {  # only whole axes and new ones: a slice or an index is for other rules
            tuple(entries)
            for entries in subscript_entries(step, n_out, new_axes=True)
            if entries.count("None") == n_out - n_in
            and all(e == "None" or not e.strip(":") for e in entries)
        }
        if len(found) != 1:
            return None
        it = iter(names)
        return ["1" if e == "None" else next(it, None) for e in found.pop()]

    def _get(self, rid: int) -> list[str | None]:
        names = self.names[rid]
        return list(names) if names is not None else [None] * len(self.tensors[rid].shape)

    def _primary(self, step: Step) -> int | None:
        for i in step.inputs:
            if self.names[i] is not None and self.tensors[i].role not in ("param", "buffer"):
                return i
        return next((i for i in step.inputs if self.names[i] is not None), None)

    def _linear(self, x: int, weight: int, n: int, bias=()) -> list[str | None]:
        xs, ws = self._get(x), self._get(weight)
        contracts = len(ws) == 2 and ws[1] in (None, "?") and xs and _named(xs[-1])
        if contracts and _same(self.pairs[weight][1], self.pairs[x][-1]):
            # BERT's output.dense (C, F) where V is F's size
            self._rename(weight, 1, xs[-1], "carried linear")
            ws = self._get(weight)
        for b in bias:  # the bias is one number per output feature: the weight's rows
            known = len(ws) == 2 and _named(ws[0]) and len(self.pairs[b]) == 1
            open_axis = known and self._get(b)[0] in (None, "?")
            if open_axis and _same(self.pairs[b][0], self.pairs[weight][0]):
                self._rename(b, 0, ws[0], "carried linear")
        return [*xs[:-1], ws[0] if len(ws) == 2 else None][-n:]

    def _rename(self, rid: int, axis: int, name: str, why: str) -> None:
        """One axis of an already named tensor, proven later (a weight's input axis by the
        activation it contracts with), and its proof."""
        names = list(self.names[rid] or ("?",) * len(self.tensors[rid].shape))
        names[axis] = name
        self._store(rid, names)
        proofs = list(self.why[rid] or ("",) * len(names))
        proofs[axis] = why
        self.why[rid] = tuple(proofs)

    def _conv(self, x: int, weight: int, n: int) -> list[str | None]:
        """A convolution's output: the input's batch axis, the weight's out-channels axis,
        and spatial axes no rule names (their size depends on stride and padding)."""
        batch = self._get(x)[:1] if len(self.tensors[x].shape) == n else []
        return [*batch, self._get(weight)[0]] + [None] * (n - len(batch) - 1)

    def _matmul(self, a: int, b: int, n: int) -> list[str | None]:
        da, db = self._get(a), self._get(b)
        if len(da) < 2 or len(db) < 2:
            return [None] * n
        batch = da[:-2] if len(da) >= len(db) else db[:-2]
        return [*batch, da[-2], db[-1]][-n:]

    def _moved(self, step: Step, src: int, rid: int) -> list[str | None] | None:
        in_shape, out_shape = self.tensors[src].shape, self.tensors[rid].shape
        if len(in_shape) != len(out_shape):
            return None
        names = self._get(src)
        if step.op == "permute":
            perm = permutation(step, len(in_shape))
            if perm is None:
                return None
            return [names[p] for p in perm]
        axes = transpose_axes(step, in_shape, out_shape)
        if axes is None:
            return None
        a, b = axes
        names[a], names[b] = names[b], names[a]
        return names

    def _reshape(self, src: int, rid: int, written=None) -> list[str | None] | None:
        """Carry names through a view: kept axes keep theirs, a split factors a product
        (``KV·D`` -> ``KV, D``; ``C`` -> ``H, D``), a merge multiplies (``B, T`` -> ``B·T``)."""
        in_pairs, out_pairs = self.pairs[src], self.pairs[rid]
        names = self._get(src)
        out: list[str | None] = [None] * len(out_pairs)
        groups = view_groups(in_pairs, out_pairs)
        if groups is None:
            return None
        for gi, gj in groups:
            parts = [names[g] for g in gi]
            if len(gi) == 1 and len(gj) == 1:
                out[gj[0]] = parts[0]
            elif len(gi) == 1 and parts[0]:
                split = [None] * len(gj)
                if written and len(gj) == 2:  # reshape(..., -1, 2): the number the line writes
                    split = self._split_by_number(parts[0], [written[g] for g in gj], gj, out_pairs)
                if None in split:
                    split = self._split(parts[0], [out_pairs[g] for g in gj])
                for g, name in zip(gj, split):
                    out[g] = name
            elif len(gj) == 1 and all(parts):
                out[gj[0]] = self._merge(parts, out_pairs[gj[0]])
            elif all(parts):
                for g, name in zip(gj, self._regroup(parts, [out_pairs[g] for g in gj])):
                    out[g] = name
        return out

    def _repeated(self, src: int, rid: int) -> list[str | None]:
        """``repeat`` tiles each axis (aligned from the right) a whole number of times: an
        axis ``X`` tiled by a count that exactly one letter has (the same in both passes)
        is ``count·X`` (JetMoE's keys, ``(B, KV, T, D).repeat(1, K, 1, 1)``: ``K·KV``), or
        the letter of that size where there is one (``H`` where H = K·KV)."""
        ins, outs, names = self.pairs[src], self.pairs[rid], self._get(src)
        out: list[str | None] = [None] * len(outs)
        for back in range(1, min(len(ins), len(outs)) + 1):
            a, pair, name = ins[-back], outs[-back], names[-back]
            a1, a2 = a[0], a[1]
            if a == pair:
                out[-back] = name
                continue
            if not name or name == "?" or not a1 or pair[0] % a1:
                continue
            count = pair[0] // a1
            if a2 is not None and pair[1] != count * a2:
                continue  # not one count in both passes
            letters = [
                c
                for c in LETTERS
                if c not in INPUT_LETTERS and size_of(c, self.table.sizes1) == count
            ]
            if len(letters) != 1:
                continue
            whole = [c for c in self.table.candidates(pair) if c in LETTERS]
            joined = f"{letters[0]}·{name}" if "+" not in name and "-" not in name else None
            out[-back] = whole[0] if len(whole) == 1 else joined
        return out

    def _regroup(self, parts: list[str], pairs: list[Pair]) -> list[str | None]:
        """Axes that split and merge in one view: their factors, in order, grouped to the
        new sizes (JetMoE's ``K, KV·D`` -> ``K·KV, D``: the top-k experts' heads); each
        group must fit its axis in both passes, and no letter may meet itself (``KV·KV``
        would say that an earlier tie between ``K`` and ``KV`` went the wrong way)."""
        factors = [f for p in parts for f in _factors(p)]
        sizes = self.table.sizes1
        out: list[str | None] = []
        at = 0
        for pair in pairs:
            group, size = [], 1
            while at < len(factors) and size < pair[0]:
                value = size_of(factors[at], sizes)
                if not value:
                    return [None] * len(pairs)
                group.append(factors[at])
                size *= value
                at += 1
            if size != pair[0] or not group or len(set(group)) < len(group):
                return [None] * len(pairs)
            name = group[0] if len(group) == 1 else "·".join(group)
            if len(group) > 1:  # a letter of that size names it (K·KV is H where H = K·KV)
                letters = [c for c in self.table.candidates(pair) if c in LETTERS]
                name = letters[0] if len(letters) == 1 else name
            if not self.table.fits(name, pair):
                return [None] * len(pairs)
            out.append(name)
        return out if at == len(factors) else [None] * len(pairs)

    def _split_by_number(self, name, numbers, places, pairs) -> list[str | None]:
        """A split whose one part the line writes as a number: ``C`` into ``(C/2, 2)``."""
        for at in (0, 1):
            if numbers[at] is None or numbers[1 - at] is not None:
                continue
            whole = f"({name})" if any(ch in name for ch in "+-/·") else name
            rest = f"{whole}/{numbers[at]}"
            if self.table.fits(rest, pairs[places[1 - at]]):
                return [rest, numbers[at]] if at == 1 else [numbers[at], rest]
        return [None, None]

    def _split(self, name: str, parts: list[Pair]) -> list[str | None]:
        s1 = self.table.sizes1
        factors = _factors(name)
        if name == "C" and "H" in s1 and "D" in s1 and s1["H"] * s1["D"] == s1["C"]:
            factors = ["H", "D"]
        elif name[0].isdigit() and len(parts) == 2:  # 3C -> 3, C
            digits = name[: len(name) - len(name.lstrip("0123456789"))]
            factors = [digits, name[len(digits) :]]
        if len(factors) == len(parts) and all(
            self.table.fits(f, p) for f, p in zip(factors, parts)
        ):
            return factors
        if len(parts) == 2:  # one part a letter, the other what is left: 2Hv -> Hk, 2Hv/Hk
            for at in (0, 1):
                letters = [c for c in self.table.candidates(parts[at]) if c in LETTERS]
                if len(letters) != 1:
                    continue
                whole = f"({name})" if any(ch in name for ch in "+-/") else name
                rest = f"{whole}/{letters[0]}"
                if self.table.fits(rest, parts[1 - at]):
                    known = [  # the table's expression for it: 2Dk+2(Hv/Hk)·Dvl, 3D
                        c for c in self.table.candidates(parts[1 - at]) if c not in LETTERS
                    ]  # (not a letter of that size: 2Hv/Hk is not the rotary width R)
                    rest = known[0] if len(known) == 1 else rest
                    return [letters[0], rest] if at == 0 else [rest, letters[0]]
        return [None] * len(parts)

    def _merge(self, parts: list[str], pair: Pair) -> str | None:
        if any(_is_slice(p) for p in parts):
            return CUT  # Q[:i] merged with another axis: no letter by size
        if "?" in parts or CUT in parts:
            return "?"  # a product of an axis nothing named (a conv's 4 x 4 patches) is
            # unknown too, whatever letter has its size
        kept = [p for p in parts if p != "1"]
        joined = "·".join(f"({p})" if ("+" in p or "-" in p) else p for p in kept)
        aliases = self.table.candidates(pair)
        if joined == "H·D" and "C" in aliases:  # heads merged back: the model width, by
            return "C"  # D = C / H (even where another letter has C's size: N == C)
        if joined in aliases or not aliases:
            return joined
        if any(p.isdigit() for p in kept) and self.table.fits(joined, pair):
            return joined  # B·T·2, PhiMoE's two routing choices, not B·T·KV by size
        kin = (
            [a for a in aliases if _family(a) == _family(kept[0])] if len(aliases) > 1 else aliases
        )
        return kin[0] if len(kin) == 1 else joined

    def _broadcast(self, step: Step, rid: int) -> list[str | None]:
        """Output axes aligned from the right with each input's axes of the same sizes;
        then axes still open matched to the one input axis of their sizes (unsqueeze,
        permute, expand)."""
        out_pairs = self.pairs[rid]
        n = len(out_pairs)
        out: list[str | None] = [None] * n
        inputs = [i for i in step.inputs if self.names[i] is not None]
        inputs.sort(key=lambda i: self.tensors[i].role in ("param", "buffer"))
        for i in inputs:
            names, pairs = self.names[i], self.pairs[i]
            for back in range(1, min(n, len(pairs)) + 1):
                if out[n - back] is None and _same(pairs[-back], out_pairs[n - back]):
                    name = names[-back]
                    out[n - back] = name  # "?" too: this axis is that unnamed one
        if inputs and None in out and step.op in MOVES_AXES:
            src = inputs[0]
            names, pairs = self.names[src], self.pairs[src]
            for j in range(n):
                if out[j] is None and out_pairs[j][0] != 1:
                    same = [a for a, p in enumerate(pairs) if p == out_pairs[j]]
                    if len(same) == 1 and names[same[0]] != "?":
                        out[j] = names[same[0]]
        return out


_INDEX_DTYPES = frozenset({"int64", "int32", "int16", "uint8", "int8"})

_SLICE_TEXT = re.compile(r"[A-Za-z_0-9+\-*/ ]*:[A-Za-z_0-9+\-*/ ]*")


def _within_line(steps: Sequence[Step], tensors: Sequence[TensorRecord]) -> set[int]:
    """Tensors a later op of their own source line consumes: ``self.norm(x)`` inside
    ``return self.head(self.norm(x))  # (B, T, V)``, which the comment does not describe."""
    line = {  # only a commented line matters: only a comment is read for what it gives
        s.index: (s.source.file, s.source.line)
        for s in steps
        if s.source is not None and "#" in s.source.text
    }
    out: set[int] = set()
    for step in steps if line else ():
        here = line.get(step.index) if step.kind == "op" else None
        if here is None:
            continue
        for rid in step.inputs:
            producer = tensors[rid].producer
            if producer is not None and producer != step.index and line.get(producer) == here:
                out.add(rid)
    return out


_SHAPE_AXES = {
    ("weight", "num_embeddings"): 0,
    ("weight", "embedding_dim"): 1,
    ("weight", "out_features"): 0,
    ("weight", "in_features"): 1,
    ("bias", "out_features"): 0,
}
"""Which axis of a layer's parameter a shape attribute sizes (``nn.Linear.weight`` is
``(out_features, in_features)``, ``nn.Embedding.weight`` ``(num_embeddings, embedding_dim)``)."""


def _attended(tensors: Sequence[TensorRecord], pairs, table: Table) -> list[int]:
    """The attention maps (``role == "attention"``, ``(B, H, queries, keys)``) whose keys no
    letter fits: their last axis is, by what the map does (a softmax over it, contracted
    with the values), the tokens it attends over. ``[]`` where there is none, or where
    the keys of two such maps differ in size in some pass (one letter has one size)."""
    maps = [
        r.id
        for r in tensors
        if r.role == "attention" and len(r.shape) == 4 and not table.candidates(pairs[r.id][-1])
    ]
    return maps if len({pairs[rid][-1] for rid in maps}) == 1 else []


def _contracted(steps, tensors, pairs, table: Table) -> list[tuple[int, int, int]]:
    """``(tensor, axis, scores)`` for the queries and keys whose product made the scores of
    each attention map: the axis the product contracts (``q @ k.transpose(-2, -1)``,
    ``einsum("bhid,bhjd->bhij")``), which is, by what the map does, the head width. Only
    where no letter fits it, and every map's is one size in every pass (one letter)."""
    out = []
    for record in tensors:
        if record.role != "attention" or len(record.shape) != 4:
            continue
        step = _producer(steps, tensors, record.id)
        for _ in range(8):  # back through the softmax, the scale, the mask...
            if step is None or step.op in MATMULS or step.op == "einsum":
                break
            if not keeps_axes(step.op):
                step = None
                break
            same = [i for i in step.inputs if tensors[i].shape == record.shape]
            step = _producer(steps, tensors, same[0]) if same else None
        if step is None or len(step.inputs) != 2:
            continue
        q, k = step.inputs
        if step.op == "einsum":
            found = einsum_subscripts(text_of(step), 2)
            if found is not None:
                (qs, ks), res = found
                shared = [x for x in qs if x in ks and x not in res]
                axes = [(q, qs.index(shared[0])), (k, ks.index(shared[0]))] if shared else []
            else:  # an equation the line builds: the one axis of each the scores lack
                kept = set(pairs[step.outputs[0]])
                axes = [(i, a) for i in (q, k) for a, p in enumerate(pairs[i]) if p not in kept]
            if len(axes) != 2 or axes[0][0] == axes[1][0]:
                continue
        else:
            axes = [(q, len(tensors[q].shape) - 1), (k, len(tensors[k].shape) - 2)]
        if any(table.candidates(pairs[i][a]) for i, a in axes):
            continue
        out.extend((i, a, record.id) for i, a in axes)
    return out if len({pairs[i][a] for i, a, _ in out}) == 1 else []


def _producer(steps, tensors, rid: int):
    producer = tensors[rid].producer
    return None if producer is None else steps[producer]


def _param_name(path: str) -> str:
    """A parameter's own name, past its module's path (``rnn.weight_hh_l0`` -> ``weight_hh_l0``)."""
    return path.rpartition(".")[2]


def _spelled_by(attribute: str) -> str | None:
    """The letter a module attribute spells (``hidden_size`` -> ``C``), or ``None``."""
    return next((k for k, spec in LETTERS.items() if attribute in spec.attrs), None)


_INDEX = re.compile(r"\.\d+(?=\.|$)")


def _repeat_of(context: str, module: str) -> bool:
    """Whether ``context`` lies in ``module`` or in the same module of another repeat of
    its layer list: ``blocks.3.mlp.fc1.weight`` in ``blocks.0.mlp.fc1``."""
    pattern = _INDEX.sub(".#", module)
    path = context
    while path:
        if _INDEX.sub(".#", path) == pattern:
            return True
        path = path.rpartition(".")[0]
    return False


def _named(name: str | None) -> bool:
    return bool(name) and name not in ("?", CUT)


def _is_slice(name: str | None) -> bool:
    """A name of :meth:`_Namer._slice_name` (``Q[:i]``), carried as it is: no size rule
    gives it."""
    return bool(name) and name.endswith("]") and "[" in name


CUT = "~"
"""While naming: an axis cut from a named one to a size no letter that is a part of it
has (shown ``?``), carried through the ops so that no letter is given it by size."""


def _summed(names: list[str]) -> str:
    """The parts of a ``cat`` added up, like terms counted: ``Hk·Dk``, ``Hk·Dk``, ``Hv·Dvl``
    -> ``2Hk·Dk+Hv·Dvl``."""
    if all(name.isdigit() for name in names):
        return str(sum(int(name) for name in names))  # two size-one parts: 2 (not 11)
    if any(name.isdigit() for name in names):
        return "+".join(names)
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    terms = []
    for name, n in counts.items():
        if n == 1:
            terms.append(name)
        else:
            terms.append(f"{n}({name})" if any(ch in name for ch in "+-/") else f"{n}{name}")
    return "+".join(terms)


def _quotient(product: str, known: Sequence[str]) -> str | None:
    """``product`` less the factors ``known`` (each of them a factor of it, or a product of
    its factors): ``H·D`` less ``H`` is ``D``; ``None`` where one is not a factor or
    nothing is left."""
    left = _factors(product)
    for name in known:
        for factor in _factors(name):
            if factor not in left:
                return None
            left.remove(factor)
    if not left:
        return None
    return "·".join(f"({f})" if any(c in f for c in "+-/") else f for f in left)


def _factors(name: str) -> list[str]:
    """Top-level factors of a product: ``H·(Dn+R)`` -> ``["H", "Dn+R"]``."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(name):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "·" and depth == 0:
            out.append(name[start:i])
            start = i + 1
    out.append(name[start:])
    return [f[1:-1] if f.startswith("(") and f.endswith(")") else f for f in out]


def _tie_break(cands: list[str], context: str, text: str, attrs, leaf: bool = False) -> str | None:
    """The one candidate the words of the module path and source line point at (``attn``:
    heads, not experts; ``router``: experts; ``rot``: the rotary width); ``None`` when they
    do not decide. (A module's own attributes do not: GPT-NeoX's attention declares its
    rotary width, not its heads, yet both live there.)"""
    pointed = _pointed(context, text)
    for family in (f for f in _WORDS if f in pointed):  # in _WORDS' order of precedence
        hits = [c for c in cands if _family(c) == family]
        if len(hits) == 1:
            return hits[0]
    # a position table's rows (N) are a parameter's axis: on a computed tensor an axis the
    # size of the context length and of one other letter is that other letter (a width
    # carried along; positions flow as T, a table's rows never become a width)
    rest = [c for c in cands if _family(c) != "position"]
    if not leaf and len(rest) == 1 and len(rest) < len(cands):
        return rest[0]
    return None


_PATH_ONLY = frozenset({"gate"})
"""Words that point at a family only as a whole module of the path: a router is
``mlp.gate``, but ``gate_proj``, ``self_attn.gate_bias`` or a line's ``query_gate_states``
(a gated MLP or attention) is no expert."""

_KIN = {
    "rotary": "attention",
    "attention": "attention",
    "experts": "ffn",
    "ffn": "ffn",
    "vocab": "vocab",
}
"""Families one module may hold (a head's rotary part, an expert's feed-forward width),
for :meth:`_Namer._letter_or_hidden`'s check of a lone letter against the words."""


@functools.lru_cache(maxsize=4096)
def _pointed(context: str, text: str) -> frozenset[str]:
    """The letter families the words of a module path and source line point at."""
    path = context.lower()
    components = set(path.split("."))
    words = (set(path.replace("_", ".").split(".")) - _PATH_ONLY) | components
    words |= set("".join(ch if ch.isalnum() else " " for ch in text.lower()).split()) - _PATH_ONLY
    return frozenset(
        family
        for family, hints in _WORDS.items()
        if any(w in words or (len(w) > 3 and w not in _PATH_ONLY and w in path) for w in hints)
    )


def _kin(name: str) -> str:
    """A name's family for what a cut of it may be: a head's rotary part is the head's."""
    family = _family(name)
    return "attention" if family == "rotary" else family


def _family(name: str) -> str:
    for letter in letters_in(name):
        if letter in LETTERS and letter not in INPUT_LETTERS:
            return LETTERS[letter].family
    return "input"


# --------------------------------------------------------------------------- the pass


def name_axes(
    steps: Sequence[Step], tensors: Sequence[TensorRecord], evidence: Evidence
) -> tuple[list[TensorRecord], dict[str, dict]]:
    """Every tensor record with its axes named from ``evidence``, or ``?``; and the letters
    the names use (``meta["dim_letters"]``: each one's size, origin and the passes that
    moved it). A pure function of the records and the evidence: no model, no second run."""
    letters = evidence.letters
    sizes1 = {k: v.size for k, v in letters.items()}
    inputs, knobs = evidence.inputs, evidence.knobs
    sizes = [sizes1, inputs.sizes if inputs else None, *(k.sizes for k in knobs)]
    table = Table(sizes)
    passes = [inputs, *knobs]
    pairs = [_pairs(r, [p.shapes[r.id] if p else None for p in passes]) for r in tensors]
    attended = _attended(tensors, pairs, table)
    if attended:  # Tk: sized by the keys of the attention maps, in every pass
        sizes = _with_letter(sizes, "Tk", pairs[attended[0]][-1])
        table = Table(sizes)
        letters = {**letters, "Tk": Sized(sizes[0]["Tk"], f"attended: the keys of #{attended[0]}")}
    contracted = []
    derived = "D" in letters and "/" in letters["D"].origin  # C / H: no proof of a width
    if derived or "D" not in sizes1:
        bare = [d if d is None else {k: v for k, v in d.items() if k != "D"} for d in sizes]
        contracted = _contracted(steps, tensors, pairs, Table(bare) if derived else table)
    if contracted:  # D: the width each query and key are contracted over, in every pass
        rid, axis, _ = contracted[0]
        if not (derived and pairs[rid][axis][0] == sizes1["D"]):  # (where C / H gives that
            sizes = _with_letter(bare, "D", pairs[rid][axis])  # width, D keeps its sizes)
            table = Table(sizes)
            letters = {**letters, "D": Sized(sizes[0]["D"], f"contracted: the queries of #{rid}")}
    first = next((r.id for r in tensors if r.role == "input"), None)
    namer = _Namer(steps, tensors, table, pairs, evidence.param_paths, evidence.attributes)
    namer.unread = set(evidence.unread)
    namer.contracts = evidence.contracts
    namer.shaped = {  # F from layers.0.linear1.out_features: that module declares it
        k: tuple(v.origin.removeprefix("layer shape ").rsplit(".", 1))
        for k, v in letters.items()
        if v.origin.startswith("layer shape ") and not table.moved_by(k)
    }
    namer.written = {  # letters whose size the config or the source declares, unmoved
        k: v.origin.removeprefix("source: ")
        for k, v in letters.items()
        if v.origin.startswith(("source:", "config.")) and not table.moved_by(k)
    }
    names = namer.run(first if "B" in sizes1 else None)
    for rid in attended:
        namer.rename_if_unnamed(rid, -1, "Tk", f"attended #{rid}")
    for rid, axis, scores in contracted:
        namer.rename_if_unnamed(rid, axis, "D", f"contracted #{scores}")
    names = namer.join(axis_links(steps, tensors, pairs, namer.names))
    whys = namer.why
    keys = _tokens_first(tensors, names)
    if keys is not None:  # the batch and the tokens of a sequence-first input, put right
        names, whys, letters = _swap_batch_and_tokens(names, whys, letters, keys)
    out = [_with_dims(r, n, w if n else None) for n, w, r in zip(names, whys, tensors)]
    return out, _used_letters(names, letters, table, evidence)


def _with_letter(sizes: list, letter: str, pair: Pair) -> list:
    """Each pass's letter sizes with ``letter`` at its size in that pass (where it has one)."""
    return [d if d is None or n is None else {**d, letter: n} for d, n in zip(sizes, pair)]


def _tokens_first(tensors: Sequence[TensorRecord], names) -> int | None:
    """The attention map that shows the first input is laid out tokens first, ``(T, B)``
    (torch's own layers by default): ``B`` and ``T`` are named after the first input's
    axes 0 and 1, and every map's keys — the tokens it attends over — read ``B``, its
    batch axis ``T``. ``None`` where no map says so (or one says otherwise)."""
    maps = [r.id for r in tensors if r.role == "attention" and len(r.shape) == 4 and names[r.id]]
    if maps and all(names[m][0] == "T" and names[m][-1] == "B" for m in maps):
        return maps[0]
    return None


_BATCH_OR_TOKENS = re.compile(r"(?<![A-Za-z_0-9])[BT](?![A-Za-z_0-9])")


def _swap_batch_and_tokens(names, whys, letters: Mapping[str, Sized], keys: int):
    """Every ``B`` read ``T`` and back (``B·T`` -> ``T·B``: the outer axis stays first);
    the input's axes proven so by attention map ``keys``."""

    def swap(name: str) -> str:
        return _BATCH_OR_TOKENS.sub(lambda m: "T" if m.group() == "B" else "B", name)

    names = [None if n is None else tuple(swap(x) for x in n) for n in names]
    whys = [
        None if w is None else tuple(f"tokens #{keys}" if x == "input" else x for x in w)
        for w in whys
    ]
    letters = dict(letters)
    b, t = letters.get("B"), letters.get("T")
    said = f" (tokens first: the keys of attention map #{keys})"
    if b is not None and t is not None:
        letters["T"] = Sized(b.size, b.origin + said)
        letters["B"] = Sized(t.size, t.origin + said)
    return names, whys, letters


def _with_dims(record: TensorRecord, dims: Dims | None, why=None) -> TensorRecord:
    """``replace(record, dims=dims, why=why)`` without the frozen ``__init__``."""
    return built(TensorRecord, {**record.__dict__, "dims": dims, "why": why})


def _proof(kind: str, via: str, name: str, pair: Pair, table: Table) -> str:
    """The proof of one axis's name as a short code, ``TensorRecord.why`` (``""``: unnamed):
    ``input``, ``carried linear``, ``written``, ``one``, ``slice``, ``moved``, ``constant``,
    ``declared config.head_dim``, ``words``; :func:`tracing.dim_legend.proof_text` reads it."""
    if not name or name in ("?", CUT):
        return ""
    if kind == "carried" and via == "input":
        kind = "input"
    if kind == "sizes":
        kind = "moved" if table.moved_by(name) else "constant"
    if kind == "":
        kind = "constant"
    if kind in ("carried", "declared"):
        return f"{kind} {via or 'an op'}"
    return kind


def _pairs(record: TensorRecord, others: Sequence[tuple[int, ...] | None]) -> tuple[Pair, ...]:
    """Each axis's sizes in every pass (``None`` where a pass did not pair the tensor).
    The inputs pass never moves a parameter; a knob pass rebuilds them, so it may."""
    shape = record.shape
    n = len(shape)
    param = record.role in ("param", "buffer")
    columns = [shape]
    for k, other in enumerate(others):
        if other is not None and len(other) == n:
            columns.append(other)
        else:
            columns.append(shape if (param and k == 0) else (None,) * n)
    return tuple(zip(*columns))


def _used_letters(
    names: Sequence[Dims | None], letters: Mapping[str, Sized], table, evidence
) -> dict:
    used: set[str] = set()
    for name in {name for dims in names for name in dims or ()}:
        used.update(letters_in(name))
    out = {}
    for k, v in letters.items():
        if k not in used:
            continue
        spec = LETTERS.get(k)
        meaning = (
            spec.meaning if spec else f"the constructor's argument {k}, which no letter spells"
        )
        entry = {"size": v.size, "origin": v.origin, "meaning": meaning}
        passes = [evidence.inputs, *evidence.knobs]
        moved = [passes[i - 1].what for i in table.moved_by(k) if passes[i - 1] is not None]
        if moved:
            entry["moved_by"] = moved
        out[k] = entry
    return out
