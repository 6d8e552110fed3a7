"""One token as text, the way its tokenizer's own decoder reads it, and the strings a
trace keeps so that opening it never reads the tokenizer file again.

The reference for a token's text is the tokenizer itself: ``decode([anchor, id])`` minus
``decode([anchor])`` (the decoder's own reading of the token in the middle of a text,
where no first-token rule strips its space)."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

from helpers.hf_folders import sentencepiece_tokenizer, train_tokenizer
from tokenizers import Tokenizer

from app.core.token_text import MAX_TOKEN_CHARS, decoder_kind, recorded_strings, token_text
from tracing.token_names import text_label, token_namer


def _read(tok: Tokenizer):
    return decoder_kind(tok), frozenset(tok.get_added_tokens_decoder())


def _in_context(tok: Tokenizer, anchor: int, token: int) -> str:
    before = tok.decode([anchor], skip_special_tokens=False)
    return tok.decode([anchor, token], skip_special_tokens=False)[len(before) :]


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_file(str(train_tokenizer(tmp_path_factory.mktemp("bl") / "t.json")))


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory) -> Tokenizer:
    path = sentencepiece_tokenizer(tmp_path_factory.mktemp("sp") / "t.json")
    return Tokenizer.from_file(str(path))


def test_byte_level_tokens_read_as_the_decoder_reads_them(byte_level):
    tok = byte_level
    kind, special = _read(tok)
    assert kind == "byte_level"
    anchor = tok.token_to_id("t")
    whole = 0
    for i in range(tok.get_vocab_size()):
        if i in special:
            assert token_text(tok, i, kind, special) == tok.id_to_token(i)  # "<s>"
            continue
        text = _in_context(tok, anchor, i)
        if "\ufffd" not in text:  # a whole character or more: exactly the decoder's text
            assert token_text(tok, i, kind, special) == text
            whole += 1
        else:  # a part of one: its bytes, escaped
            assert token_text(tok, i, kind, special).startswith("\\x")
    assert whole > 150


def test_a_byte_of_a_longer_character_shows_as_that_byte_not_a_latin_letter(byte_level):
    """The em dash is three byte tokens here; each is its byte, and together they are the
    bytes of the dash (``decode`` alone gives ``"�"``; the vocabulary entry ``"â"``)."""
    tok = byte_level
    kind, special = _read(tok)
    ids = tok.encode("a—b").ids[1:]  # after the BOS
    texts = [token_text(tok, i, kind, special) for i in ids]
    assert texts == ["a", "\\xe2", "\\x80", "\\x94", "b"]
    assert tok.id_to_token(ids[1]) == "â" and tok.decode([ids[1]]) == "\ufffd"
    escaped = "".join(texts).encode("latin-1").decode("unicode_escape")
    assert escaped.encode("latin-1") == "a—b".encode()  # the dash's three bytes


def test_sentencepiece_tokens_keep_their_space_and_bytes(metaspace):
    """Phi-3's ``'c' ' n' 're'``: a ``▁`` is the space it encodes (``decode`` of a lone
    ``▁n`` strips it); ``<0x06>`` is that byte; a byte of a longer character keeps the
    tokenizer's own ``<0xE2>``."""
    tok = metaspace
    kind, special = _read(tok)
    assert kind == "metaspace"
    c = tok.token_to_id("c")
    for piece, expected in [("c", "c"), ("▁n", " n"), ("re", "re"), ("<0x06>", "\x06")]:
        i = tok.token_to_id(piece)
        assert token_text(tok, i, kind, special) == expected == _in_context(tok, c, i)
    assert tok.decode([tok.token_to_id("▁n")]) == "n"  # what a lone decode would show
    assert token_text(tok, tok.token_to_id("<0xE2>"), kind, special) == "<0xE2>"
    assert token_text(tok, tok.token_to_id("<s>"), kind, special) == "<s>"


def test_the_recorded_strings_are_the_vocabulary_bounded(byte_level, monkeypatch):
    tok = byte_level
    kind, special = _read(tok)
    table = recorded_strings(tok, kind, special, prompt=[5, 7])
    assert table == [token_text(tok, i, kind, special) for i in range(tok.get_vocab_size())]
    assert all(len(text) <= MAX_TOKEN_CHARS for text in table)
    assert table[tok.token_to_id("Ġdog")] == " dog"
    import app.core.token_text as module

    monkeypatch.setattr(module, "MAX_TOKEN_STRINGS", 100)  # a vocabulary over the bound
    texts = recorded_strings(tok, kind, special, prompt=[7, 5, 7])
    assert texts == {"5": token_text(tok, 5, kind, special), "7": token_text(tok, 7, kind, special)}


def test_opening_a_trace_never_reads_the_tokenizer_it_names(tmp_path):
    """An older trace that names a tokenizer file (and carries only its prompt's labels):
    ids beyond the prompt are ``#id``, even with that file right there to read."""
    path = train_tokenizer(tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    ids = tok.encode("the cat").ids
    meta = {
        "tokens": ids,
        "token_labels": [tok.id_to_token(i) for i in ids],
        "tokenizer": str(path),
    }
    name = token_namer(meta)
    dog = tok.token_to_id("Ġdog")
    assert name(dog) == f"#{dog}"
    assert name(ids[1]) == text_label(tok.id_to_token(ids[1]))


def test_a_strangers_token_strings_are_inert_and_bounded():
    meta = {
        "tokenizer": "x",
        "token_strings": {"5": "\x1b]0;title\x07", "6": "a" * 500, "bad": "x", "7": 3},
    }
    for table in (meta["token_strings"], ["", "", "", "", "", "\x1b]0;title\x07", "a" * 500, 3]):
        name = token_namer({**meta, "token_strings": table})
        assert "\x1b" not in name(5) and "\x07" not in name(5)
        assert len(name(6)) <= 40
        assert name(7) == "#7" and name(8) == "#8" and name(-1) == "#-1"
