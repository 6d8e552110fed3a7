"""``generate`` prints what a model and a stranger's tokenizer produce through the one
inert filter (``tracing.safe_text``): an ESC or BEL it generates is shown escaped, never
sent to the terminal, while newlines stay newlines. transformers' own warnings, which may
quote a folder's config, go through it too."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from app.cli import main

ALWAYS = """
import torch
class Always(torch.nn.Module):
    '''Predicts token {token} after anything (an embedding, and a bias that wins).'''
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding({vocab}, 4)
        self.out = torch.nn.Linear(4, {vocab})
        with torch.no_grad():
            self.out.weight.zero_()
            self.out.bias.zero_()
            self.out.bias[{token}] = 10.0
    def forward(self, x):
        return self.out(self.emb(x))
"""

RAW = ("\x1b", "\x07", "\x9b")


def _model(tmp_path: Path, token: int, vocab: int) -> str:
    (tmp_path / "always.py").write_text(ALWAYS.format(token=token, vocab=vocab))
    return f"{tmp_path / 'always.py'}:Always"


def test_generated_bytes_are_inert(tmp_path, capsys):
    argv = ["generate", "--model", _model(tmp_path, 27, 256), "--prompt", "hi\n"]
    assert main([*argv, "--temperature", "0", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in RAW), repr(out)
    assert out == "hi\n" + "\\x1b" * 3 + "\n"  # the prompt's newline kept, ESC shown


def test_a_strangers_tokenizer_cannot_retitle_the_terminal(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from helpers.hf_folders import train_tokenizer
    from tokenizers import AddedToken, Tokenizer

    path = train_tokenizer(tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.add_tokens([AddedToken("\x1b]0;pwned\x07\x1b[2J", normalized=False)])
    tok.save(str(path))
    evil = tok.get_vocab_size() - 1
    model = _model(tmp_path, evil, tok.get_vocab_size())
    for trace in ([], ["--trace", str(tmp_path / "run.gen")]):
        argv = ["generate", "--model", model, "--tokenizer", str(path), "--prompt", "the cat"]
        assert main([*argv, "--temperature", "0", "--max-new-tokens", "2", *trace]) == 0
        out = capsys.readouterr().out
        assert not any(c in out for c in RAW), repr(out)
        assert out.count("\\x1b]0;pwned\\x07\\x1b[2J") == 2, repr(out)


def test_transformers_messages_are_inert():
    pytest.importorskip("transformers")
    from app.core.model_sources import _transformers

    transformers = _transformers()
    handlers = logging.getLogger("transformers").handlers
    streams = [h for h in handlers if isinstance(h, logging.StreamHandler)]
    assert streams
    stream = io.StringIO()
    old = [h.setStream(stream) for h in streams]
    try:
        logger = transformers.utils.logging.get_logger("transformers.models.llama")
        logger.warning("a config key \x1b]0;pwned\x07 %s", "\x9b2J")
    finally:
        for h, was in zip(streams, old):
            h.setStream(was)
    err = stream.getvalue()
    assert not any(c in err for c in RAW), repr(err)
    assert "a config key \\x1b]0;pwned\\x07 \\x9b2J" in err, repr(err)
