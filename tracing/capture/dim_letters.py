"""The letters an axis can be called, where each letter's size comes from, and the
expressions built from them (``B·T``, ``KV·D``, ``3C``, ``D/2``, ``T+1``).

:data:`LETTERS` is the one table of letters. The tutorial's seven (``B T C H D V F``) come
first; the rest name what the tutorial's model does not have but the models people bring
do: key/value heads under grouped-query attention, experts and top-k of a mixture of
experts, a rotary width that is a part of the head, the latent ranks of multi-head latent
attention, the context length of a position table. A letter is given a size only by
evidence: the caller's ``dims=``, a config attribute, a module attribute, a layer's shape,
the first input's shape, or a shape comment; :func:`letter_sizes` says which, per letter,
and the trace keeps it in ``meta["dim_letters"]``.

An axis name is a letter or an expression of letters: ``·`` multiplies, ``/`` divides by
an integer, ``+`` and ``-`` add, an integer in front multiplies (``3C``), parentheses
group (``(H+2KV)·D``). :func:`size_of` evaluates one; ``1`` names a size-one axis.

A size-one axis reads ``1``, also where it is the key/value heads of a model with one
(``num_key_value_heads=1``, multi-query attention: Qwen2 built so, Falcon-7B). ``KV`` is
in the table with its size and origin, but on the axis itself no evidence can tell the
``KV`` axis from a ``1`` the model inserted beside it: both are 1 in every pass, the key
projection's width ``KV·D`` is then ``D`` (so a view splitting it shows no factor to carry),
and ``repeat_kv``'s ``[:, :, None]`` makes ``(B, 1, 1, T, D)``, where either 1 could be
called ``KV``. ``1`` is true of both; ``KV`` would be a guess on one of them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Letter:
    """One axis letter: what it means and the attribute spellings that give its size."""

    meaning: str
    config: tuple[str, ...] = ()  # config attributes, first found wins
    attrs: tuple[str, ...] = ()  # module attributes (``self.num_heads = ...``)
    family: str = ""  # input, attention, experts, rotary, ffn, vocab, model, position


LETTERS: dict[str, Letter] = {
    "B": Letter("batch: the first input's axis 0", family="input"),
    "T": Letter("time: tokens of the first input (its axis 1)", family="input"),
    "P": Letter("past: cached tokens before this call's T", family="input"),
    "Pr": Letter(
        "prompt: learned tokens the model puts before T", ("prompt_length",), (), "prompt"
    ),
    "C": Letter(
        "model width (d_model)",
        ("d_model", "n_embd", "hidden_size", "dim", "embed_dim", "d_embed"),
        ("d_model", "n_embd", "hidden_size", "embed_dim"),
        "model",
    ),
    "Ce": Letter(
        "embedding width when not C (a factorised embedding: ALBERT, ELECTRA, RemBERT)",
        ("embedding_size", "input_embedding_size", "word_embed_proj_dim"),
        (),
        "vocab",
    ),
    "Co": Letter(
        "output embedding width: the logits' projection before V (RemBERT)",
        ("output_embedding_size",),
        (),
        "vocab",
    ),
    "H": Letter(
        "attention (query) heads",
        (
            "n_heads",
            "n_head",
            "num_decoder_attention_heads",
            "num_attention_heads",
            "num_heads",
            "nhead",
        ),
        ("num_heads", "n_head", "n_heads", "nhead", "num_attention_heads", "num_attn_heads"),
        "attention",
    ),
    "KV": Letter(
        "key/value heads (grouped-query attention; shown only when not H)",
        ("num_key_value_heads", "num_kv_heads", "n_head_kv", "n_kv_heads", "kv_heads"),
        ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_head_kv"),
        "attention",
    ),
    "D": Letter(
        "head width (d_head)",
        ("head_dim", "d_head", "head_size", "d_k", "kv_channels", "dim_head"),
        ("d_head", "head_dim", "d_k", "head_size", "dim_head"),
        "attention",
    ),
    "Hw": Letter(
        "query heads of the sliding-window layers (when not H)",
        ("swa_num_attention_heads",),
        (),
        "attention",
    ),
    "KVw": Letter(
        "key/value heads of the sliding-window layers (when not KV)",
        ("swa_num_key_value_heads",),
        (),
        "attention",
    ),
    "Dw": Letter(
        "head width of the sliding-window layers (when not D)",
        ("swa_head_dim",),
        (),
        "attention",
    ),
    "R": Letter(
        "rotary width: the part of a head that is rotated (only when not D)",
        ("rotary_dim", "rotary_ndims", "qk_rope_head_dim", "rotary_emb_dim"),
        ("rotary_ndims", "rotary_dim", "rotary_emb_dim"),
        "rotary",
    ),
    "Dn": Letter(
        "non-rotary head width of latent attention", ("qk_nope_head_dim",), (), "attention"
    ),
    "Dv": Letter("value head width when not D", ("v_head_dim",), (), "attention"),
    "Lq": Letter(
        "query latent rank (multi-head latent attention)", ("q_lora_rank",), (), "attention"
    ),
    "Lkv": Letter("key/value latent rank", ("kv_lora_rank",), (), "attention"),
    "F": Letter(
        "feed-forward width (d_ff)",
        (
            "d_ff",
            "n_inner",
            "intermediate_size",
            "ffn_dim",
            "ffn_hidden_size",
            "dim_feedforward",
            "decoder_ffn_dim",
            "dff",
            "encoder_ffn_dim",
            "dim_ff",
        ),
        ("d_ff", "dim_feedforward", "intermediate_size", "intermediate_dim"),
        "ffn",
    ),
    "FE": Letter("one expert's feed-forward width", ("moe_intermediate_size",), (), "experts"),
    "E": Letter(
        "experts of a mixture of experts",
        ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
        ("num_experts", "num_local_experts", "n_routed_experts"),
        "experts",
    ),
    "K": Letter(
        "experts each token is routed to (top-k)",
        ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts"),
        ("top_k", "num_experts_per_tok"),
        "experts",
    ),
    "Hc": Letter(
        "hyper-connection streams: parallel copies of the residual (DeepSeek-V4)",
        ("hc_mult",),
        ("hc_mult",),
        "streams",
    ),
    "Ng": Letter(
        "n-gram streams: the further tokens predicted at once (ProphetNet)",
        ("ngram",),
        ("ngram",),
        "ngram",
    ),
    "Nb": Letter(
        "relative-position buckets",
        ("num_buckets", "relative_attention_num_buckets"),
        ("num_buckets", "relative_attention_num_buckets"),
        "position",
    ),
    "V": Letter("vocabulary", ("vocab_size", "n_vocab"), ("vocab_size",), "vocab"),
    "N": Letter(
        "context length: rows of a position table",
        ("max_position_embeddings", "n_positions", "n_ctx", "block_size", "max_seq_len"),
        ("block_size", "max_len", "max_seq_len", "max_position_embeddings", "n_positions"),
        "position",
    ),
}
"""Every axis letter a trace can use, in the order names are preferred."""

INPUT_LETTERS = frozenset({"B", "T", "P"})


@dataclass(frozen=True)
class Sized:
    """A letter's size in one trace and the evidence for it (``config.head_dim``)."""

    size: int
    origin: str


# --------------------------------------------------------------------------- expressions

_NAMES = "|".join(sorted(LETTERS, key=len, reverse=True))
_TOKEN = re.compile(rf"\s*(\d+|{_NAMES}|[()+\-·/*])")


def _tokens(name: str) -> list[str] | None:
    out, at = [], 0
    while at < len(name):
        m = _TOKEN.match(name, at)
        if m is None:
            return None
        out.append(m.group(1))
        at = m.end()
    return out


def size_of(name: str, sizes: Mapping[str, int]) -> int | None:
    """The size an axis name stands for, ``None`` when a letter is unknown.

    >>> size_of("KV·D", {"KV": 2, "D": 16})
    32
    >>> size_of("(H+2KV)·D", {"H": 6, "KV": 2, "D": 16})
    160
    >>> size_of("D/2", {"D": 16}), size_of("1", {}), size_of("T+1", {"T": 11})
    (8, 1, 12)
    """
    if name in sizes:
        return sizes[name]
    tokens = _tokens(name)
    if not tokens:
        return None
    try:
        value, rest = _sum(tokens, sizes)
    except (KeyError, ValueError, IndexError, ZeroDivisionError):
        return None
    return value if not rest else None


def _sum(tokens, sizes):
    value, tokens = _product(tokens, sizes)
    while tokens and tokens[0] in "+-":
        sign, (term, tokens) = tokens[0], _product(tokens[1:], sizes)
        value = value + term if sign == "+" else value - term
    return value, tokens


def _product(tokens, sizes):
    value, tokens = _factor(tokens, sizes)
    while tokens and tokens[0] in ("·", "*", "/"):
        op, (factor, tokens) = tokens[0], _factor(tokens[1:], sizes)
        if op == "/":
            if value % factor:
                raise ValueError(f"{value}/{factor}")
            value //= factor
        else:
            value *= factor
    return value, tokens


def _factor(tokens, sizes):
    head, tokens = tokens[0], tokens[1:]
    if head == "(":
        value, tokens = _sum(tokens, sizes)
        if not tokens or tokens[0] != ")":
            raise ValueError("unbalanced")
        tokens = tokens[1:]
    elif head.isdigit():
        value = int(head)
        if tokens and (tokens[0] == "(" or tokens[0][0].isalpha()):  # 3C, 2KV, 2(…)
            factor, tokens = _factor(tokens, sizes)
            value *= factor
    else:
        value = sizes[head]
    return value, tokens


def letters_in(name: str) -> list[str]:
    """The letters an axis name uses: ``letters_in("B·T") == ["B", "T"]``."""
    return [t for t in (_tokens(name) or ()) if t[0].isalpha()]


def expressions(sizes: Mapping[str, int]) -> list[str]:
    """The expressions of letters models use for one axis, where their letters are known.

    Products of a count of heads with a width (``KV·D``, ``H·Dv``), the query heads per
    key/value head (``H/KV``), the fused
    projections (``3C``, ``(H+2KV)·D``, ``2F``), halves (``D/2``, ``R/2``), the part of a
    head that is not rotated (``D-R``), flattened batches (``B·T``, ``B·H``, ``B·T·K``),
    ``2T``, ``T+1`` and ``T-1``, ``Pr+T`` (a learned prompt before the tokens), ``E+1`` (a
    one-hot with a spare class), ``Lkv+R``.
    """
    heads = [c for c in ("H", "KV") if c in sizes]
    widths = [w for w in ("D", "R", "Dn", "Dv") if size_of(w, sizes)]
    out = [f"{c}·{w}" for c in heads for w in widths]
    if sizes.get("KV", 1) > 1:
        out += ["H/KV", "H/KV+2"]  # query heads per key/value head (+ its k and v)
    counts = [c for c in ("H", "KV", "E", "K") if c in sizes]
    out += ["3C", "3D", "2F", "2FE", "(H+2KV)·D", "2KV·D", "D/2", "R/2", "D-R", "Dn+R", "Dn+Dv"]
    out += ["H·(Dn+R)", "H·(Dn+Dv)", "KV·(Dn+Dv)", "Lkv+R", "E+1"]
    out += ["Dn+D", "H·(Dn+D)", "Lkv+D"]  # latent attention whose rotary width is D
    out += ["B·T", "2T", "T+1", "T-1", "T+P", "Pr+T", "Nb·H", "Hw·Dw"]
    out += [f"B·{c}" for c in counts] + [f"B·T·{c}" for c in counts]
    return [e for e in dict.fromkeys(out) if size_of(e, sizes) is not None]


# --------------------------------------------------------------------------- sizes


def _get(source: Any, name: str) -> Any:
    """``source.name`` (or ``source[name]``), ``None`` when absent or when reading it
    raises: a config whose attribute varies per layer refuses a global value (Gemma-4's
    ``head_dim``), and one size for all layers would then be a guess."""
    if isinstance(source, Mapping):
        return source.get(name)
    try:
        return getattr(source, name, None)
    except Exception:  # any config's own refusal
        return None


def _read(source: Any, names: tuple[str, ...]) -> tuple[str, int] | None:
    for name in names:
        value = _get(source, name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def _rotary_from_config(config: Any, head: int | None) -> Sized | None:
    """``rotary_pct`` / ``partial_rotary_factor`` (also inside ``rope_parameters``) of the
    head width, as GPT-NeoX, Phi and others give their rotary width."""
    if config is None or not head:
        return None
    places = [config]
    rope = _get(config, "rope_parameters")
    if isinstance(rope, Mapping):
        places.append(rope)
    for place in places:
        for name in ("rotary_pct", "partial_rotary_factor"):
            value = _get(place, name)
            if isinstance(value, float | int) and not isinstance(value, bool) and 0 < value < 1:
                return Sized(int(head * value), f"config.{name} × D")
    return None


def letter_sizes(
    house: Mapping[str, int], config: Any, model: Any, given: Mapping[str, int] | None
) -> dict[str, Sized]:
    """Every letter with a known size, with its evidence.

    ``house`` is what :func:`tracing.dims.resolve_sizes` found for the tutorial's letters;
    this adds the origins and the letters of :data:`LETTERS` beyond them. ``KV`` is given
    only when it differs from ``H`` and ``R`` only when it differs from ``D``: equal, they
    are the same axis.
    """
    found: dict[str, Sized] = {}
    config = _text_config(config)
    attrs = _module_attributes(model)
    for letter, spec in LETTERS.items():
        if given and letter in given:
            found[letter] = Sized(int(given[letter]), "dims= argument")
            continue
        hit = _read(config, spec.config) if config is not None else None
        if hit is not None:
            found[letter] = Sized(hit[1], f"config.{hit[0]}")
        elif letter in attrs:
            found[letter] = attrs[letter]
    if "F" not in found and "C" in found:  # a layer's shape before the house's 4 × C guess
        width = _ffn_width(model, found["C"].size)
        if width is not None:
            found["F"] = width
    for letter, size in house.items():  # B, T, and what layers or comments gave
        if letter not in found:
            found[letter] = Sized(size, _house_origin(letter, None))
    if "N" not in found:
        table = _position_table(model)
        if table is not None:
            found["N"] = table
    if "F" not in found and "C" in found:
        width = _ffn_width(model, found["C"].size)
        if width is not None:
            found["F"] = width
    head = found["D"].size if "D" in found else None
    if "R" not in found:
        rotary = _rotary_from_config(config, head)
        if rotary is not None:
            found["R"] = rotary
    if "KV" in found and "H" in found and found["KV"].size == found["H"].size:
        del found["KV"]
    if "R" in found and head == found["R"].size:
        del found["R"]
    if "Dv" in found and head == found["Dv"].size:
        del found["Dv"]
    for letter, base in (("Ce", "C"), ("Co", "C"), ("Hw", "H"), ("KVw", "KV"), ("Dw", "D")):
        if letter in found and base in found and found[letter].size == found[base].size:
            del found[letter]  # as wide as the letter it varies: the same axis
    return found


def _text_config(config: Any) -> Any:
    """The decoder's own config of a composite one (``config.text_config``: Gemma-3,
    Mllama...), whose top level may lack the attention sizes; else ``config``."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        with contextlib.suppress(Exception):  # a config whose text part cannot be found
            text = get(decoder=True)
            if text is not None:
                return text
    return config


def _position_table(model: Any) -> Sized | None:
    """``N`` from the rows of a position embedding (an ``Embedding`` named for positions)."""
    modules = getattr(model, "named_modules", None)
    for path, module in modules() if modules is not None else ():
        if type(module).__name__ == "Embedding" and "pos" in path.rsplit(".", 1)[-1].lower():
            return Sized(module.num_embeddings, f"layer shape {path}.num_embeddings")
    return None


_FFN_IN = frozenset({"linear1", "fc1", "c_fc", "up_proj", "w1", "dense_h_to_4h", "fc_in"})


def _ffn_width(model: Any, c: int) -> Sized | None:
    """``F`` from the first feed-forward ``Linear`` out of ``C`` (``linear1``, ``fc1``...)."""
    modules = getattr(model, "named_modules", None)
    for path, module in modules() if modules is not None else ():
        leaf = path.rsplit(".", 1)[-1]
        if type(module).__name__ == "Linear" and leaf in _FFN_IN and module.in_features == c:
            return Sized(module.out_features, f"layer shape {path}.out_features")
    return None


def _house_origin(letter: str, had: Sized | None) -> str:
    if letter == "B":
        return "input: the first input's axis 0"
    if letter == "T":
        return "input: the first input's axis 1"
    if letter == "D":
        return "C / H"
    if letter == "F":
        return "4 × C (the config leaves it unset) or layer shapes"
    return "module attributes, layer shapes or a shape comment"


def _module_attributes(model: Any) -> dict[str, Sized]:
    """Letters from attributes on the modules (outermost first), e.g. ``self.top_k = 2``."""
    out: dict[str, Sized] = {}
    modules = getattr(model, "named_modules", None)
    if modules is None:
        return out
    for path, module in modules():
        attrs = vars(module)
        for letter, spec in LETTERS.items():
            if letter in out or not spec.attrs:
                continue
            hit = _read(attrs, spec.attrs)
            if hit is not None:
                where = f"{path}.{hit[0]}" if path else hit[0]
                out[letter] = Sized(hit[1], f"module attribute {where}")
    return out


def attribute_letters(model: Any) -> dict[str, dict[str, int]]:
    """Per module path, the letters its own attributes give (``{"mlp": {"K": 2}}``): the
    nearest module that declares a size says which of two equal-sized letters it is."""
    out: dict[str, dict[str, int]] = {}
    modules = getattr(model, "named_modules", None)
    if modules is None:
        return out
    for path, module in modules():
        attrs = vars(module)
        mine = {}
        for letter, spec in LETTERS.items():
            hit = _read(attrs, spec.attrs) if spec.attrs else None
            if hit is not None:
                mine[letter] = hit[1]
        if mine:
            out[path] = mine
    return out
