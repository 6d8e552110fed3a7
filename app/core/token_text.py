"""One token of a ``tokenizer.json`` as the text it stands for, and the strings a trace keeps.

Decoding a single token is not the same as reading it. A byte-level BPE token (GPT-2,
Llama 3, Qwen) may hold only part of a UTF-8 character (``"âĢ"`` is the bytes
``e2 80``): ``decode([id])`` turns it into ``"�"``, and the vocabulary entry is the
byte-to-letter disguise. A SentencePiece token (Llama 2, Phi-3, Mistral) starts with
``"▁"`` for its space, which ``decode`` strips from a lone token (``"▁n"`` decodes to
``"n"``). So :func:`token_text` reads the vocabulary entry the way the tokenizer's own
decoder would, one token at a time, as ``convert_ids_to_tokens`` plus the decoder does in
``transformers``:

- byte-level: the entry's letters back to its bytes, decoded as UTF-8; bytes that are
  not a whole character stay visible as ``\\xe2``;
- SentencePiece: ``"▁"`` is the space it encodes; a byte-fallback token ``<0x41>`` is that
  byte (``"A"``), kept as ``<0xE2>`` where it is part of a longer character;
- special tokens (``<s>``) as the tokenizer writes them; anything else as ``decode``.

:func:`recorded_strings` is what a trace keeps in ``meta["token_strings"]`` so a viewer
never has to open the tokenizer again (see :mod:`tracing.token_names`): the text of every
id of the vocabulary as a list (index = id), bounded (:data:`MAX_TOKEN_STRINGS` ids,
:data:`MAX_TOKEN_CHARS` characters each), else ``{"id": text}`` for the prompt's ids.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

MAX_TOKEN_STRINGS = 262_144
"""A vocabulary up to this size travels whole in the trace (Gemma's 256k fits)."""

MAX_TOKEN_CHARS = 48
"""Characters kept of one token's text (a label never shows more than 40)."""

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in letter for each byte, inverted (letter -> byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    letters, extra = {}, 0
    for b in range(256):
        if b in printable:
            letters[chr(b)] = b
        else:
            letters[chr(256 + extra)] = b
            extra += 1
    return letters


def decoder_kind(tokenizer: Any) -> str:
    """``"byte_level"``, ``"metaspace"`` or ``"other"``: how the ``tokenizers.Tokenizer``'s
    decoder turns entries into text (read from its JSON state)."""
    decoder = getattr(tokenizer, "decoder", None)
    state = decoder.__getstate__() if decoder is not None else b""
    state = state.decode("utf-8", "replace") if isinstance(state, bytes) else str(state)
    if '"ByteLevel"' in state:
        return "byte_level"
    if '"Metaspace"' in state or "▁" in state:
        return "metaspace"
    return "other"


def token_text(tokenizer: Any, token: int, kind: str, special: frozenset[int]) -> str:
    """The text of one token id (see the module doc); ``#id`` for an id it does not have."""
    piece = tokenizer.id_to_token(int(token))
    if piece is None:
        return f"#{token}"
    if token in special:
        return piece
    return piece_text(piece, kind) or _decoded(tokenizer, int(token), piece)


def piece_text(piece: str, kind: str) -> str | None:
    """The text of a vocabulary entry of a ``byte_level`` or ``metaspace`` tokenizer;
    None where the entry does not read that way (then ``decode`` says it)."""
    if kind == "byte_level":
        raw = piece.translate(_byte_table())
        if raw.isascii():
            return raw  # plain ASCII (most entries): as it is
        try:
            return raw.encode("latin-1").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a letter outside the byte alphabet: not byte-level
            return None
    if kind == "metaspace":
        byte = _BYTE_FALLBACK.fullmatch(piece)
        if byte is not None:
            value = int(byte.group(1), 16)
            return chr(value) if value < 0x80 else piece
        return piece.replace("▁", " ")
    return None


def _decoded(tokenizer: Any, token: int, piece: str) -> str:
    text = tokenizer.decode([token], skip_special_tokens=False)
    return text if text and "\ufffd" not in text else piece


@functools.cache
def _byte_table() -> dict[int, str]:
    """``str.translate`` table: each stand-in letter to the byte it stands for (as a
    latin-1 character, so the result encodes back to those bytes)."""
    return {ord(letter): chr(byte) for letter, byte in _byte_decoder().items()}


def recorded_strings(
    tokenizer: Any, kind: str, special: frozenset[int], prompt: Iterable[int] = ()
) -> list[str] | dict[str, str]:
    """``meta["token_strings"]``: the text of every id (a list, index = id) when the
    vocabulary has at most :data:`MAX_TOKEN_STRINGS` ids, else ``{"id": text}`` for the
    ``prompt``'s ids; each text cut to :data:`MAX_TOKEN_CHARS` characters."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > MAX_TOKEN_STRINGS:
        return {
            str(i): token_text(tokenizer, i, kind, special)[:MAX_TOKEN_CHARS]
            for i in sorted(set(map(int, prompt)))
        }
    texts = []
    for i in range(size):  # (id_to_token per id is quicker than get_vocab's dict)
        piece = tokenizer.id_to_token(i)
        if piece is None:
            text = f"#{i}"
        elif i in special:
            text = piece
        else:
            text = piece_text(piece, kind)
            if text is None:
                text = _decoded(tokenizer, i, piece)
        texts.append(text[:MAX_TOKEN_CHARS])
    return texts
