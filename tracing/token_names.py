"""Token ids as the strings a person reads, from a trace's meta: one namer for every axis.

A trace of a model with its own tokenizer carries ``meta["token_labels"]`` (the prompt's
tokens as text, ``" world"``) and ``meta["tokenizer"]`` (the ``tokenizer.json`` they came
from); our own models' traces carry bytes. :func:`token_namer` turns that into one
``name(id) -> str`` for any id (a prompt token, a predicted one): the prompt's own label,
else the tokenizer file's (when it is still there and ``tokenizers`` is installed), else
the byte label (``'a'``, ``'␣'``, ``'0xc3'``; ``#50256`` beyond the bytes).

Labels are short and printable: a space shows as ``␣``, a newline as ``\\n``, control
and bidi characters are made inert.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tracing.safe_text import inert

_BYTE_ESCAPES = {9: "\\t", 10: "\\n", 13: "\\r", 32: "␣"}
MAX_LABEL = 40


def byte_label(token: int) -> str:
    """One byte token: ``'a'``, ``'␣'``, ``'\\n'``, ``'0xc3'``; beyond the bytes ``#50256``."""
    if token in _BYTE_ESCAPES:
        return _BYTE_ESCAPES[token]
    if 33 <= token < 127:
        return chr(token)
    if 0 <= token < 256:
        return f"0x{token:02x}"
    return f"#{token}"


def text_label(text: str) -> str:
    """A token's text, printable on one axis tick: spaces ``␣``, ``\\n``, inert."""
    shown = text.replace(" ", "␣").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    shown = inert(shown)
    return shown if len(shown) <= MAX_LABEL else shown[: MAX_LABEL - 1] + "…"


def prompt_tokens(meta: Mapping[str, Any]) -> list[int] | None:
    """The traced prompt's ids (the first row of a batch), or None."""
    tokens = meta.get("tokens")
    if not tokens or not isinstance(tokens, (list, tuple)):
        return None
    if isinstance(tokens[0], (list, tuple)):
        tokens = tokens[0]
    try:
        return [int(t) for t in tokens]
    except (TypeError, ValueError, OverflowError):
        return None


def prompt_labels(meta: Mapping[str, Any]) -> list[str] | None:
    """The prompt's tokens as axis labels (``meta["token_labels"]`` where they match the
    tokens, else byte labels), or None without tokens."""
    tokens = prompt_tokens(meta)
    if tokens is None:
        return None
    labels = meta.get("token_labels")
    if _labels_fit(labels, tokens) and meta.get("tokenizer"):
        return [text_label(str(s)) for s in labels]
    return [byte_label(t) for t in tokens]


def _labels_fit(labels: Any, tokens: Sequence[int]) -> bool:
    return (
        isinstance(labels, (list, tuple))
        and len(labels) == len(tokens)
        and all(isinstance(s, str) for s in labels)
    )


@lru_cache(maxsize=4)
def _tokenizer_file(path: str):
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(path)
    except Exception:  # not installed, gone, or not a tokenizer: the prompt's labels only
        return None


def token_namer(meta: Mapping[str, Any]) -> Callable[[int], str]:
    """``name(id)`` for the tokens of this trace (see the module doc)."""
    path = meta.get("tokenizer")
    if not path or not isinstance(path, str):
        return byte_label
    known: dict[int, str] = {}
    tokens = prompt_tokens(meta)
    labels = meta.get("token_labels")
    if tokens is not None and _labels_fit(labels, tokens):
        known = {t: text_label(s) for t, s in zip(tokens, labels)}
    tok = _tokenizer_file(path) if Path(path).is_file() else None

    def name(token: int) -> str:
        token = int(token)
        if token in known:
            return known[token]
        if tok is not None:
            text = tok.decode([token], skip_special_tokens=False)
            if not text or text == "\ufffd":
                text = tok.id_to_token(token) or ""
            if text:
                known[token] = text_label(text)
                return known[token]
        return f"#{token}"

    return name
