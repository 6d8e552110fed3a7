"""``ByteTokenizer``: text <-> token ids as raw UTF-8 bytes (vocabulary of 256).

No vocabulary file, nothing to download, and any string round-trips exactly: every
character becomes its 1-4 UTF-8 bytes. The price is longer sequences than a BPE tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable


class ByteTokenizer:
    """Encode text as UTF-8 bytes; decode ids back, replacing invalid byte sequences."""

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """'hé' -> [104, 195, 169]."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes back to text; a cut-off multi-byte character shows as U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise ValueError(f"byte tokenizer ids must be in 0..255, got {bad[:5]}")
        return bytes(ids).decode("utf-8", errors="replace")

    def token_str(self, token_id: int) -> str:
        """A printable label for one token (for axis labels): 'a', '␣', '\\n', '0xc3'."""
        if token_id == 32:
            return "␣"
        if 33 <= token_id < 127:
            return chr(token_id)
        if token_id == 10:
            return "\\n"
        return f"0x{token_id:02x}"

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"
