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
    family: str = ""  # input, attention, experts, rotary, ffn, vocab, model, position, ssm,
    # linear (attention), chunk


LETTERS: dict[str, Letter] = {
    "B": Letter(
        "batch: the first input's axis 0 (1 where it is laid out tokens first)", family="input"
    ),
    "T": Letter("time: tokens of the first input (its axis 1, or 0 tokens first)", family="input"),
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
    "hidden_size_per_layer_input": Letter(
        "width of the per-layer input embeddings (Gemma-3n, Gemma-4)",
        ("hidden_size_per_layer_input",),
        (),
        "vocab",
    ),
    "vocab_size_per_layer_input": Letter(
        "vocabulary of the per-layer input embeddings (only when not V)",
        ("vocab_size_per_layer_input",),
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
            "heads",
        ),
        (
            "num_heads",
            "n_head",
            "n_heads",
            "nhead",
            "num_attention_heads",
            "num_attn_heads",
            "heads",
        ),
        "attention",
    ),
    "KV": Letter(
        "key/value heads (grouped-query attention; shown only when not H)",
        (
            "num_key_value_heads",
            "num_kv_heads",
            "n_head_kv",
            "n_kv_heads",
            "kv_heads",
            "n_query_groups",
        ),
        (
            "num_key_value_heads",
            "num_kv_heads",
            "n_kv_heads",
            "n_head_kv",
            "kv_heads",
            "n_query_groups",
        ),
        "attention",
    ),
    "D": Letter(
        "head width (d_head)",
        ("head_dim", "d_head", "head_size", "d_k", "kv_channels", "dim_head"),
        ("d_head", "head_dim", "d_k", "head_size", "dim_head"),
        "attention",
    ),
    "Hw": Letter(
        "query heads of the sliding-window layers (only when not H)",
        ("swa_num_attention_heads",),
        (),
        "attention",
    ),
    "KVw": Letter(
        "key/value heads of the sliding-window layers (only when not KV)",
        ("swa_num_key_value_heads",),
        (),
        "attention",
    ),
    "Dw": Letter(
        "head width of the sliding-window layers (only when not D)",
        ("swa_head_dim",),
        (),
        "attention",
    ),
    "global_head_dim": Letter(
        "head width of the full-attention layers, where each layer has its own (Gemma-4)",
        (),
        (),
        "attention",
    ),
    "d_rel": Letter(
        "relative-position features per head (Inkling's learned relative logits)",
        ("d_rel",),
        (),
        "attention",
    ),
    "rel_extent": Letter(
        "relative distances a full-attention head scores", ("rel_extent",), (), "position"
    ),
    "Nw": Letter("sliding-window length", ("sliding_window_size",), (), "position"),
    "Hi": Letter(
        "heads of a sparse-attention indexer (DeepSeek-V3.2's lightning indexer)",
        ("index_n_heads", "indexer_n_heads"),
        (),
        "attention",
    ),
    "Di": Letter(
        "head width of a sparse-attention indexer",
        ("index_head_dim", "indexer_head_dim"),
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
    "FS": Letter(
        "the shared expert's feed-forward width",
        (
            "shared_expert_intermediate_size",
            "shared_intermediate_size",
            "moe_shared_expert_intermediate_size",
        ),
        (),
        "experts",
    ),
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
    "n_shared_experts": Letter(
        "shared experts beside the routed ones (only when more than one)",
        ("n_shared_experts", "num_shared_experts"),
        ("n_shared_experts", "num_shared_experts"),
        "experts",
    ),
    "I": Letter(
        "inner width of a state-space mixer (Mamba's expand × C)",
        ("mamba_d_ssm", "d_inner", "mamba_intermediate_size"),
        ("d_inner", "mamba_d_ssm"),
        "ssm",
    ),
    "S": Letter(
        "state size of a state-space mixer (SSM state)",
        ("state_size", "ssm_state_size", "mamba_d_state", "d_state"),
        ("ssm_state_size", "d_state", "state_size"),
        "ssm",
    ),
    "Dt": Letter(
        "rank of a state-space mixer's time step (dt) projection",
        ("time_step_rank", "mamba_dt_rank", "dt_rank"),
        ("time_step_rank", "dt_rank"),
        "ssm",
    ),
    "Hs": Letter(
        "heads of a state-space mixer (Mamba-2 in a hybrid)",
        ("mamba_n_heads", "mamba_num_heads", "n_mamba_heads"),
        (),
        "ssm",
    ),
    "Ds": Letter(
        "head width of a state-space mixer",
        ("mamba_d_head", "mamba_head_dim", "mamba_headdim"),
        (),
        "ssm",
    ),
    "G": Letter(
        "groups that share a state-space mixer's B and C projections",
        ("n_groups", "mamba_n_groups", "mamba_ngroups"),
        ("n_groups",),
        "ssm",
    ),
    "Q": Letter(
        "chunk length of a chunked scan",
        ("chunk_size", "mamba_chunk_size"),
        ("chunk_size",),
        "chunk",
    ),
    "W": Letter(
        "kernel width of a short causal convolution",
        (
            "conv_kernel",
            "mamba_d_conv",
            "d_conv",
            "linear_conv_kernel_dim",
            "conv1d_width",
            "conv_L_cache",
            "short_conv_kernel_size",
            "conv_kernel_size",
            "sconv_kernel_size",
        ),
        ("conv_kernel_size", "d_conv", "conv1d_width", "L_cache"),
        "ssm",
    ),
    "Hk": Letter(
        "key heads of linear attention (gated delta rule, KDA)",
        ("linear_num_key_heads", "linear_num_heads"),
        (),
        "linear",
    ),
    "Hv": Letter(
        "value heads of linear attention (shown only when not Hk)",
        ("linear_num_value_heads",),
        (),
        "linear",
    ),
    "Dk": Letter(
        "key head width of linear attention",
        ("linear_key_head_dim", "linear_head_dim"),
        (),
        "linear",
    ),
    "Dvl": Letter(
        "value head width of linear attention (shown only when not Dk)",
        ("linear_value_head_dim",),
        (),
        "linear",
    ),
    "U": Letter("width of a recurrent (RG-LRU) block", ("lru_width",), ("lru_width",), "ssm"),
    "hc_mult": Letter(
        "hyper-connection streams: parallel copies of the residual (DeepSeek-V4)",
        ("hc_mult",),
        ("hc_mult",),
        "streams",
    ),
    "ngram": Letter(
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
    "V": Letter(
        "vocabulary",
        ("padded_vocab_size", "vocab_size", "n_vocab"),  # litgpt's table has the padded rows
        ("vocab_size",),
        "vocab",
    ),
    "Tk": Letter(
        "tokens an attention attends over (its keys), where no input's tokens give them: a"
        " vision transformer's patches and class token",
        family="position",
    ),
    "N": Letter(
        "context length: rows of a position table",
        ("max_position_embeddings", "n_positions", "n_ctx", "block_size", "max_seq_len", "max_len"),
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
_TOKEN = re.compile(rf"\s*(\d+|[a-z][a-z0-9]*_[a-z0-9_]*|{_NAMES}|[()+\-·/*])")
"""A number, a config knob's name (``hc_count``: an axis named after a knob no letter
spells), a letter, or an operator."""


def _tokens(name: str) -> tuple[str, ...] | None:
    """``name`` split into letters, numbers and operators (``None``: not an axis name);
    kept per name (a trace asks again for the same few dozen names thousands of times)."""
    try:
        return _TOKENS[name]
    except KeyError:
        pass
    out, at = [], 0
    while at < len(name):
        m = _TOKEN.match(name, at)
        if m is None:
            out = None
            break
        out.append(m.group(1))
        at = m.end()
    found = None if out is None else tuple(out)
    if len(_TOKENS) < 4096:
        _TOKENS[name] = found
        own = (name,) if found is None and name.isidentifier() else ()  # patch_size
        _LETTERS_IN[name] = tuple(t for t in (found or own) if t[0].isalpha())
    return found


_TOKENS: dict[str, tuple[str, ...] | None] = {}
_LETTERS_IN: dict[str, tuple[str, ...]] = {}


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


STATE_SPACE_EXPRESSIONS = [
    # Mamba: in_proj makes x and z (2I), x_proj the time step and B, C (Dt+2S)
    "2I", "Dt+2S", "Dt+2G·S",
    # Mamba-2: in_proj makes z, x, B, C and dt; the convolution runs over x, B, C
    "2I+2G·S+Hs", "2I+2G·S+H", "I+2G·S", "2G·S", "G·S", "Hs·Ds", "Hs/G", "H/G",
    # linear attention: q, k (Hk·Dk each), v, z (Hv·Dvl each), b and a (Hv each)
    "Hk·Dk", "Hv·Dvl", "Hk·Dvl", "Hv·Dk", "2Hk·Dk+2Hv·Dvl", "2Hk·Dk+Hv·Dvl", "2Hv", "Hv/Hk",
    "2Dk+2(Hv/Hk)·Dvl", "2(Hv/Hk)", "(Hv/Hk)·Dvl", "3Hk·Dk", "2Hk·Dk",
    # a causal convolution's output before it is cut back to T
    "T+W-1",
]  # fmt: skip
"""Expressions of the state-space and linear-attention letters (fused projections)."""


def letters_in(name: str) -> list[str]:
    """The letters an axis name uses: ``letters_in("B·T") == ["B", "T"]``; a name after a
    constructor's argument (``patch_size``) is its own."""
    found = _LETTERS_IN.get(name)
    if found is None:
        tokens = _tokens(name)
        if tokens is None and name.isidentifier():
            return [name]
        found = tuple(t for t in (tokens or ()) if t[0].isalpha())
    return list(found)


def expressions(sizes: Mapping[str, int]) -> list[str]:
    """The expressions of letters models use for one axis, where their letters are known.

    Products of a count of heads with a width (``KV·D``, ``H·Dv``), the query heads per
    key/value head (``H/KV``), the fused
    projections (``3C``, ``(H+2KV)·D``, ``2F``), halves (``D/2``, ``R/2``), the part of a
    head that is not rotated (``D-R``), flattened batches (``B·T``, ``B·H``, ``B·T·K``),
    ``2T``, ``T+1`` and ``T-1``, ``Pr+T`` (a learned prompt before the tokens),
    ``E+n_shared_experts`` (routed and shared experts' scores), ``E+1`` (a
    one-hot with a spare class), ``Lkv+R``.
    """
    heads = [c for c in ("H", "KV") if c in sizes]
    widths = [w for w in ("D", "R", "Dn", "Dv", "d_rel") if size_of(w, sizes)]
    out = [f"{c}·{w}" for c in heads for w in widths]
    if sizes.get("KV", 1) > 1:
        out += ["H/KV", "H/KV+2"]  # query heads per key/value head (+ its k and v)
    sliding = [c for c in ("Hw", "KVw") if c in sizes]  # sliding-window layers' own heads
    out += [f"{c}·{w}" for c in sliding for w in ("Dw", "D", "d_rel") if w in sizes]
    out += ["Hw/KVw", "Hw/KV", "H/KVw"]
    counts = [c for c in ("H", "KV", "E", "K") if c in sizes]
    out += [
        "3C",
        "3D",
        "2F",
        "2FE",
        "2FS",
        "(H+2KV)·D",
        "2KV·D",
        "D/2",
        "R/2",
        "D-R",
        "Dn+R",
        "Dn+Dv",
    ]
    out += ["H·(Dn+R)", "H·(Dn+Dv)", "KV·(Dn+Dv)", "Lkv+R", "E+1", "E+n_shared_experts"]
    out += ["Dn+D", "H·(Dn+D)", "Lkv+D"]  # latent attention whose rotary width is D
    out += STATE_SPACE_EXPRESSIONS
    if not {"F", "I"} & set(sizes):  # a feed-forward width fixed in code, none in the config
        out += ["2C", "4C", "8C"]
    out += ["B·T", "2T", "T+1", "T-1", "T+P", "Pr+T", "Nb·H", "Hw·Dw"]
    out += [
        "hc_mult·hc_mult",
        "(hc_mult+2)·hc_mult",
        "hc_mult·C",
    ]  # hyper-connections: pre, post and the mixing
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


def house_sizes(
    config: Any, model: Any, first_input_shape: tuple[int, ...] | None
) -> dict[str, int]:
    """The sizes the tutorial's letters take where no spelling of :data:`LETTERS` gives them
    directly: ``B`` and ``T`` from the first input's shape (``(B, T)`` ids or ``(B, T, C)``
    embeddings; of an image ``(B, 3, H, W)`` only ``B``: its channels are no positions),
    ``D = C / H`` where the config or modules give both but no head width, ``F = 4C`` where
    the config leaves its feed-forward width unset (GPT-2's ``n_inner=None``), and ``V``,
    ``C`` from the token embedding's shape (the first ``Embedding`` not named for
    positions). :func:`letter_sizes` adds the spellings, with their origins."""
    sizes: dict[str, int] = {}
    text = text_config(config)
    c = _read(text, LETTERS["C"].config) if text is not None else None
    h = _read(text, LETTERS["H"].config) if text is not None else None
    f_unset = text is not None and any(
        _has(text, name) and _get(text, name) is None for name in LETTERS["F"].config
    )
    if c is None or h is None:
        attrs = _module_attributes(model)
        c = c or (("", attrs["C"].size) if "C" in attrs else None)
        h = h or (("", attrs["H"].size) if "H" in attrs else None)
    embedding = _token_embedding(model)
    if embedding is not None:
        sizes["V"] = embedding.num_embeddings
        c = c or ("", embedding.embedding_dim)
    if c is not None:
        sizes["C"] = c[1]
        if f_unset:
            sizes["F"] = 4 * c[1]
    if c is not None and h is not None and h[1] > 0 and c[1] % h[1] == 0:
        sizes["D"] = c[1] // h[1]
    elif c is None and h is not None:  # heads and their width declared, no width: H·D
        d = _module_attributes(model).get("D")
        if d is not None:
            sizes["C"] = h[1] * d.size
    if first_input_shape is not None and len(first_input_shape) in (2, 3):
        sizes["B"], sizes["T"] = int(first_input_shape[0]), int(first_input_shape[1])
    elif first_input_shape is not None and len(first_input_shape) > 3:
        sizes["B"] = int(first_input_shape[0])  # an image, a volume: no axis of it is T
    return sizes


def _has(source: Any, name: str) -> bool:
    if isinstance(source, Mapping):
        return name in source
    try:
        return hasattr(source, name)
    except Exception:  # a config's own refusal (a per-layer attribute)
        return True


def _token_embedding(model: Any) -> Any:
    """The first ``Embedding`` not named for positions: the token table, ``(V, C)``."""
    found = _token_embedding_path(model)
    return found[1] if found is not None else None


def _token_embedding_path(model: Any) -> tuple[str, Any] | None:
    modules = getattr(model, "named_modules", None)
    for path, module in modules() if modules is not None else ():
        if type(module).__name__ == "Embedding" and "pos" not in path.lower():
            return path, module
    return None


_TABLE_AXES = {"V": "num_embeddings", "C": "embedding_dim"}
"""The token table's letters and the attributes that size them: its rows and its width."""


def letter_sizes(
    house: Mapping[str, int],
    config: Any,
    model: Any,
    given: Mapping[str, int] | None,
    merge_same: bool = True,
) -> dict[str, Sized]:
    """Every letter with a known size, with its evidence.

    ``house`` is what :func:`house_sizes` found for the tutorial's letters;
    this adds the origins and the letters of :data:`LETTERS` beyond them. ``KV`` is given
    only when it differs from ``H`` and ``R`` only when it differs from ``D``: equal, they
    are the same axis.
    """
    found: dict[str, Sized] = {}
    config = text_config(config)
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
    table = _token_embedding_path(model)
    for letter, size in house.items():  # B, T, and what layers or comments gave
        if letter not in found:
            found[letter] = Sized(size, _house_origin(letter, None))
            if table is not None and letter in _TABLE_AXES:
                path, module = table
                attr = _TABLE_AXES[letter]
                if getattr(module, attr, None) == size:  # the token table's own shape
                    found[letter] = Sized(size, f"layer shape {path}.{attr}")
    if "N" not in found:
        table = _position_table(model)
        if table is not None:
            found["N"] = table
    if "F" not in found and "C" in found:
        width = _ffn_width(model, found["C"].size)
        if width is not None:
            found["F"] = width
    if "I" not in found and "C" in found:
        inner = _inner_from_config(config, found["C"].size)
        if inner is not None:
            found["I"] = inner
    head = found["D"].size if "D" in found else None
    if "global_head_dim" not in found:
        per_layer = _per_layer_head_dim(config, head)
        if per_layer is not None:
            found["global_head_dim"] = per_layer
    if "R" not in found:
        rotary = _rotary_from_config(config, head)
        if rotary is not None:
            found["R"] = rotary
    for letter, same in SAME_AXIS.items() if merge_same else ():  # one axis, one letter
        if letter in found and same in found and found[letter].size == found[same].size:
            del found[letter]
    shared = found.get("n_shared_experts")
    if shared is not None and shared.size <= 1:  # one shared expert: no axis of them (its
        del found["n_shared_experts"]  # weights are a plain MLP's)
    return found


SAME_AXIS = {
    "KV": "H", "R": "D", "Dv": "D", "Hv": "Hk", "Dvl": "Dk", "F": "I",
    "Hw": "H", "KVw": "KV", "Dw": "D", "Ce": "C", "Co": "C", "vocab_size_per_layer_input": "V",
}  # fmt: skip
"""A letter that is given only when its size differs from its partner's: equal, they are
one axis (all heads are key/value heads; the whole head is rotated; Mamba's
``intermediate_size`` is its inner width, expand × C)."""


def _per_layer_head_dim(config: Any, head: int | None) -> Sized | None:
    """``global_head_dim``: the one head width that ``config.per_layer_config`` gives some
    layers (Gemma-4's full-attention layers, 512 wide where the sliding ones are 256), when it
    is not ``D``."""
    per_layer = _get(config, "per_layer_config") if config is not None else None
    if per_layer is None or head is None:
        return None
    layers = per_layer.values() if isinstance(per_layer, Mapping) else per_layer
    widths = set()
    with contextlib.suppress(Exception):  # a config's own view of its layers, read as given
        for layer in layers:
            widths.add(_get(layer, "head_dim"))
    widths.discard(head)
    if len(widths) != 1:
        return None
    width = widths.pop()
    if not isinstance(width, int) or isinstance(width, bool) or width <= 0:
        return None
    return Sized(width, "config.per_layer_config[…].head_dim")


def _inner_from_config(config: Any, c: int) -> Sized | None:
    """``I``, a state-space mixer's inner width, from ``expand`` (``mamba_expand``) × ``C``."""
    for name in ("expand", "mamba_expand"):
        value = _get(config, name) if config is not None else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            inner = int(value * c)
            if inner == value * c:
                return Sized(inner, f"config.{name} × C")
    return None


def text_config(config: Any) -> Any:
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
        if _ATTRIBUTE_NAMES.isdisjoint(attrs):
            continue  # most modules (a Linear, a norm) declare no size of a letter
        mixer = _is_mixer(module)
        for letter, spec in LETTERS.items():
            if letter in out or not spec.attrs or (mixer and spec.family == "attention"):
                continue
            hit = _read(attrs, spec.attrs)
            if hit is not None:
                where = f"{path}.{hit[0]}" if path else hit[0]
                out[letter] = Sized(hit[1], f"module attribute {where}")
    return out


_ATTRIBUTE_NAMES = frozenset(name for spec in LETTERS.values() for name in spec.attrs)
"""Every module attribute a letter is read from: a module with none of them is skipped."""

_MIXERS = ("mamba", "mixer", "ssm", "gateddelta", "linearattention", "recurrent", "rglru")


def _is_mixer(module: Any) -> bool:
    """A state-space or linear-attention mixer, whose ``num_heads``/``head_dim`` are its own
    heads (Falcon-H1's Mamba-2 beside its attention), not the attention's ``H``/``D``."""
    name = type(module).__name__.lower()
    return any(word in name for word in _MIXERS)


def attribute_letters(model: Any) -> dict[str, dict[str, int]]:
    """Per module path, the letters its own attributes give (``{"mlp": {"K": 2}}``): the
    nearest module that declares a size says which of two equal-sized letters it is."""
    out: dict[str, dict[str, int]] = {}
    modules = getattr(model, "named_modules", None)
    if modules is None:
        return out
    for path, module in modules():
        attrs = vars(module)
        if _ATTRIBUTE_NAMES.isdisjoint(attrs):
            continue
        mine = {}
        for letter, spec in LETTERS.items():
            hit = _read(attrs, spec.attrs) if spec.attrs else None
            if hit is not None:
                mine[letter] = hit[1]
        if mine:
            out[path] = mine
    return out
