"""Token ids as the strings a person reads, from a trace's meta: one namer for every axis.

A trace of a model with its own tokenizer carries the tokenizer's strings itself:
``meta["token_labels"]`` (the prompt's tokens as text, ``" world"``) and
``meta["token_strings"]`` (the text of every id of its vocabulary as a list, bounded,
else ``{"id": text}`` for the prompt's; written by ``app.core.token_text``); our own
models' traces carry bytes. :func:`token_namer` turns that into one ``name(id) -> str``
for any id (a prompt token, a predicted one): the recorded string, else ``#50256``; the
byte label (``'a'``, ``'␣'``, ``'0xc3'``) only for a trace of a byte-level model.

Opening a trace never reads another file: ``meta["tokenizer"]`` (where the tokenizer was,
kept so a re-trace can find it) is only a name here. An older trace that has that path
and no ``token_strings`` shows its prompt's labels and ``#id`` for the rest.

Labels are short and printable: a space shows as ``␣``, a newline as ``\\n``, control
and bidi characters are made inert.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    if _labels_fit(labels, tokens) and has_tokenizer(meta):
        return [text_label(str(s)) for s in labels]
    return [byte_label(t) for t in tokens]


def has_tokenizer(meta: Mapping[str, Any]) -> bool:
    """Whether the trace's tokens came from a tokenizer of their own (not bytes)."""
    return bool(meta.get("tokenizer") or meta.get("token_strings"))


def _labels_fit(labels: Any, tokens: Sequence[int]) -> bool:
    return (
        isinstance(labels, (list, tuple))
        and len(labels) == len(tokens)
        and all(isinstance(s, str) for s in labels)
    )


def _recorded(table: Any, token: int) -> Any:
    """Token ``token``'s entry of ``meta["token_strings"]``: a list (index = id) or
    ``{"id": text}``; None where it has none."""
    if isinstance(table, (list, tuple)):
        return table[token] if 0 <= token < len(table) else None
    if isinstance(table, Mapping):
        return table.get(str(token))
    return None


def token_namer(meta: Mapping[str, Any]) -> Callable[[int], str]:
    """``name(id)`` for the tokens of this trace (see the module doc)."""
    if not has_tokenizer(meta):
        return byte_label
    table = meta.get("token_strings")
    prompt: dict[int, str] = {}
    tokens = prompt_tokens(meta)
    labels = meta.get("token_labels")
    if tokens is not None and _labels_fit(labels, tokens):
        prompt = dict(zip(tokens, labels))
    shown: dict[int, str] = {}  # labels made on first use: a vocabulary is 10^5 strings

    def name(token: int) -> str:
        token = int(token)
        label = shown.get(token)
        if label is None:
            text = _recorded(table, token)
            text = prompt.get(token) if text is None else text
            label = text_label(text) if isinstance(text, str) else f"#{token}"
            shown[token] = label
        return label

    return name
