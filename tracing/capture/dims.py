"""Symbolic axis names for tensor shapes: ``(1, 4, 12, 12)`` -> ``("B", "H", "T", "T")``.

The house letters are ``B`` batch, ``T`` time, ``C`` d_model, ``H`` heads, ``D`` d_head,
``V`` vocab, ``F`` d_ff. Their sizes come from the caller (``dims=``), else from the
model's config (our ``ModelConfig`` or a Hugging Face config), plus ``B`` and ``T`` from
the first input's shape.

Naming an axis is easy when its size matches one letter. When sizes coincide (``T == D``,
``B == H``, ``F == V``...) a shape is matched against common layouts in priority order —
``(B, H, T, D)`` before ``(B, T, H, D)``, ``(B, T, C)`` ... — and the first layout that fits
wins. An axis no letter fits becomes ``"?"``; a shape with no named axis gets ``None``.
Simple multiples that models use all the time are named too: ``3C`` (fused q, k, v),
``B*T`` (a flattened batch of tokens).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Mapping
from typing import Any

LETTERS = ("B", "T", "C", "H", "D", "V", "F")

# Layouts tried in order when a shape is ambiguous; each letter must match its axis size.
_LAYOUTS: dict[int, tuple[tuple[str, ...], ...]] = {
    1: (("C",), ("F",), ("V",), ("3C",), ("T",), ("D",), ("B",), ("H",)),
    2: (
        ("B", "T"),
        ("T", "C"),
        ("B*T", "C"),
        ("B*T", "V"),
        ("B*T", "F"),
        ("B*T", "3C"),
        ("V", "C"),
        ("C", "V"),
        ("C", "F"),
        ("F", "C"),
        ("C", "3C"),
        ("3C", "C"),
        ("C", "C"),
        ("T", "T"),
        ("B", "C"),
        ("B", "V"),
        ("T", "D"),
    ),
    3: (
        ("B", "T", "C"),
        ("B", "T", "V"),
        ("B", "T", "F"),
        ("B", "T", "3C"),
        ("B", "T", "T"),
        ("T", "B", "C"),
        ("H", "T", "D"),
        ("H", "T", "T"),
        ("B", "T", "D"),
        ("B", "H", "T"),
    ),
    4: (
        ("B", "H", "T", "D"),
        ("B", "H", "T", "T"),
        ("B", "T", "H", "D"),
        ("B", "H", "D", "T"),
        ("B", "?", "T", "T"),
    ),
}

# A letter that fits by size but is implausible at that position (a size-1 axis in the
# middle of a shape is a kept dimension, not a batch).
_ONLY_FIRST = frozenset({"B"})


def sizes_from_config(config: Any) -> dict[str, int]:
    """Read C, H, D, V, F (and T as the context length) from a model config, if present.

    Understands our ``ModelConfig`` (``vocab_size, d_model, n_heads, d_ff``) and Hugging
    Face configs (``n_embd``/``hidden_size``, ``n_head``/``num_attention_heads``,
    ``n_inner``/``intermediate_size``, where ``None`` means ``4 * C``). Also accepts a dict.
    """
    if config is None:
        return {}

    def get(*names: str) -> Any:
        for name in names:
            try:
                is_map = isinstance(config, Mapping)
                value = config.get(name) if is_map else getattr(config, name, None)
            except Exception:  # a config that refuses one global value (per-layer heads)
                continue
            if value is not None:
                return value
        return None

    sizes: dict[str, int] = {}
    C = get("d_model", "n_embd", "hidden_size", "dim", "embed_dim")
    H = get("n_heads", "n_head", "num_attention_heads", "num_heads")
    V = get("vocab_size")
    F = get("d_ff", "n_inner", "intermediate_size", "ffn_dim", "ffn_hidden_size")
    if isinstance(C, int):
        sizes["C"] = C
        if F is None:
            F = 4 * C
    if isinstance(H, int) and H > 0:
        sizes["H"] = H
        if isinstance(C, int) and C % H == 0:
            sizes["D"] = C // H
    if isinstance(V, int):
        sizes["V"] = V
    if isinstance(F, int):
        sizes["F"] = F
    return sizes


def _candidates(size: int, sizes: Mapping[str, int], position: int) -> list[str]:
    out = []
    for letter, value in sizes.items():
        if value == size and (position == 0 or letter not in _ONLY_FIRST):
            out.append(letter)
    return out


def _layout_fits(layout: tuple[str, ...], shape: tuple[int, ...], sizes: Mapping) -> bool:
    for name, size in zip(layout, shape):
        if name != "?" and _size_of(name, sizes) != size:
            return False
    return True


def _size_of(name: str, sizes: Mapping[str, int]) -> int | None:
    if name in sizes:
        return sizes[name]
    if name == "3C":
        c = sizes.get("C")
        return None if c is None else 3 * c
    if name == "B*T":
        b, t = sizes.get("B"), sizes.get("T")
        return None if b is None or t is None else b * t
    return None


def infer_dims(shape: tuple[int, ...], sizes: Mapping[str, int]) -> tuple[str, ...] | None:
    """Name each axis of ``shape`` with a letter, ``"?"`` for an axis none fits.

    >>> infer_dims((2, 4, 16, 8), {"B": 2, "H": 4, "T": 16, "D": 8})
    ('B', 'H', 'T', 'D')
    >>> infer_dims((2, 16, 16), {"B": 2, "T": 16, "C": 32})
    ('B', 'T', 'T')
    """
    if not sizes or not shape:
        return None
    per_axis = [_candidates(s, sizes, i) for i, s in enumerate(shape)]
    if all(len(c) == 1 for c in per_axis):
        return tuple(c[0] for c in per_axis)
    for layout in _LAYOUTS.get(len(shape), ()):
        if _layout_fits(layout, shape, sizes):
            return layout
    named = tuple(c[0] if len(c) == 1 else "?" for c in per_axis)
    return None if all(n == "?" for n in named) else named


# Attribute spellings people give a model's sizes, per letter (first found wins).
ATTRIBUTE_NAMES: dict[str, tuple[str, ...]] = {
    "H": ("num_heads", "n_head", "n_heads", "nhead", "num_attention_heads"),
    "D": ("d_head", "head_dim", "d_k", "head_size"),
    "C": ("d_model", "n_embd", "hidden_size", "embed_dim"),
    "F": ("d_ff", "dim_feedforward", "intermediate_size"),
    "V": ("vocab_size",),
}


def sizes_from_model(model: Any) -> dict[str, int]:
    """Read C, H, D, V, F from the modules themselves, for a model with no config.

    First the attributes modules carry (``self.num_heads = num_heads``; the spellings in
    :data:`ATTRIBUTE_NAMES`), outermost module first; then layer shapes: the token
    embedding ``Embedding(V, C)`` (the first embedding not named for positions), and the
    feed-forward's inner width (a ``Linear`` from ``C`` under a path that reads as a
    feed-forward: ``mlp``, ``ffn``, ``feed_forward``...). ``D`` is ``C // H`` when only
    those two are known. Cached per model object.
    """
    modules = getattr(model, "named_modules", None)
    if modules is None:
        return {}
    cached = _MODEL_SIZES.get(model)
    if cached is not None:
        return dict(cached)
    sizes: dict[str, int] = {}
    named = list(modules())
    for _, module in named:
        attrs = vars(module)
        for letter, names in ATTRIBUTE_NAMES.items():
            if letter in sizes:
                continue
            for name in names:
                value = attrs.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    sizes[letter] = value
                    break
    for path, module in named:
        kind = type(module).__name__
        if kind == "Embedding" and "pos" not in path.lower():
            sizes.setdefault("V", module.num_embeddings)
            sizes.setdefault("C", module.embedding_dim)
            break
    c = sizes.get("C")
    for path, module in named:
        if "F" in sizes or c is None:
            break
        if type(module).__name__ == "Linear" and _context(path) == "ffn":
            if module.in_features == c and module.out_features != c:
                sizes["F"] = module.out_features
            elif module.out_features == c and module.in_features != c:
                sizes["F"] = module.in_features
    h = sizes.get("H")
    if h and c and "D" not in sizes and c % h == 0:
        sizes["D"] = c // h
    if h and "C" not in sizes and "D" in sizes:
        sizes["C"] = h * sizes["D"]
    with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced
        _MODEL_SIZES[model] = dict(sizes)
    return sizes


_MODEL_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def resolve_sizes(
    given: Mapping[str, int] | None,
    config: Any,
    first_input_shape: tuple[int, ...] | None,
    model: Any = None,
) -> dict[str, int]:
    """Sizes per letter: the caller's ``dims`` win, then the config, then the model's own
    attributes and layer shapes (:func:`sizes_from_model`), then the first input.

    ``B`` and ``T`` come from the first input's shape (``(B, T)`` token ids or
    ``(B, T, C)`` embeddings) unless given.
    """
    sizes = sizes_from_config(config)
    if model is not None and not all(k in sizes for k in ("C", "H", "D", "V", "F")):
        for letter, value in sizes_from_model(model).items():
            sizes.setdefault(letter, value)
    if first_input_shape is not None and len(first_input_shape) >= 2:
        sizes.setdefault("B", int(first_input_shape[0]))
        sizes.setdefault("T", int(first_input_shape[1]))
    if given:
        for letter, value in given.items():
            if not isinstance(value, int):
                raise ValueError(f"dims[{letter!r}] must be an int size, got {value!r}")
            sizes[letter] = value
    return sizes


# Words in a module path or parameter name that say which of two same-sized letters an
# axis is: the feed-forward hidden width (F) or the vocabulary (V).
_FFN_WORDS = ("feed_forward", "ffn", "mlp", "fc", "ff", "intermediate", "linear1")
_VOCAB_WORDS = ("lm_head", "head", "embed", "wte", "token", "logits", "unembed", "decoder")


def _context(path: str) -> str | None:
    words = path.lower().replace("_", ".").split(".")
    joined = path.lower()
    if any(w in words for w in ("ffn", "mlp", "fc", "ff", "intermediate", "feed")) or (
        "feed_forward" in joined
    ):
        return "ffn"
    if any(w in joined for w in _VOCAB_WORDS):
        return "vocab"
    return None


class DimNamer:
    """``infer_dims`` with a cache per (shape, context), for naming thousands of records.

    ``context`` is the module path (or parameter name) a tensor came from; it only breaks
    ties between letters of equal size, e.g. ``F == V``: an ``mlp`` path prefers ``F``.
    """

    def __init__(self, sizes: Mapping[str, int]):
        self.sizes = dict(sizes)
        self._cache: dict[tuple, tuple[str, ...] | None] = {}
        self._named: dict[tuple, tuple[str, ...] | None] = {}  # (shape, context) -> dims
        self._contexts: dict[str, str | None] = {}
        ffn = dict(self.sizes)
        self._tie_break = "V" in ffn and "F" in ffn and ffn["V"] == ffn["F"]

    def named_cache(self) -> dict:
        """The ``(shape, context) -> dims`` answers given so far (read only): a caller naming
        many tensors can look there first and call the namer only for new pairs."""
        return self._named

    def __call__(self, shape: tuple[int, ...], context: str = "") -> tuple[str, ...] | None:
        found = self._named.get((shape, context), _UNSEEN)
        if found is not _UNSEEN:
            return found
        dims = self._name(shape, context)
        if len(self._named) > 100_000:
            self._named.clear()
        self._named[(shape, context)] = dims
        return dims

    def _name(self, shape: tuple[int, ...], context: str) -> tuple[str, ...] | None:
        kind = None
        if self._tie_break and context:
            kind = self._contexts.get(context, 0)
            if kind == 0:
                kind = self._contexts[context] = _context(context)
        key = (shape, kind)
        if key in self._cache:
            return self._cache[key]
        dims = infer_dims(shape, self.sizes)
        if dims is not None and kind == "ffn":
            dims = tuple("F" if d == "V" else d for d in dims)
        self._cache[key] = dims
        return dims


_UNSEEN = object()
UNSEEN = _UNSEEN
"""What ``DimNamer.named_cache().get(key, UNSEEN)`` returns for a pair not named yet."""
_NAMERS: dict[tuple, DimNamer] = {}


def namer_for(sizes: Mapping[str, int]) -> DimNamer:
    """A shared :class:`DimNamer` for these sizes: tracing one model again and again names
    each (shape, module) pair once, not once per trace."""
    key = tuple(sorted(sizes.items()))
    namer = _NAMERS.get(key)
    if namer is None:
        if len(_NAMERS) > 32:
            _NAMERS.clear()
        namer = _NAMERS[key] = DimNamer(sizes)
    return namer
