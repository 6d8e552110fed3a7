"""``train --model M --text FILE``: the text's bytes are the token ids, so a model whose
vocabulary is smaller than the largest byte is one ``error:`` line naming both sizes and
what to pass instead, before training, never an ``IndexError`` traceback at step 1."""

from __future__ import annotations

from app.cli import main

SMALL = """
import torch
class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 8)
        self.out = torch.nn.Linear(8, 100)
    def forward(self, x):
        return self.out(self.emb(x))
"""


def _run(tmp_path, text: str) -> int:
    (tmp_path / "small.py").write_text(SMALL)
    (tmp_path / "corpus.txt").write_text(text * 40)
    model, text_file = f"{tmp_path / 'small.py'}:Small", str(tmp_path / "corpus.txt")
    argv = ["train", "--model", model, "--text", text_file, "--steps", "1", "--quiet"]
    argv += ["--batch-size", "2", "--block-size", "8", "--trace-step", "1"]
    return main([*argv, "-o", str(tmp_path / "step.sft")])


def test_a_vocabulary_smaller_than_the_texts_bytes_is_one_line(tmp_path, capsys):
    assert _run(tmp_path, "the cat sat on the mat. ") == 2  # 't' is 116
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --text corpus.txt"), err
    assert "up to 116" in err[0] and "has 100 entries" in err[0], err
    assert "--data FILE.py:NAME" in err[0] and "256" in err[0]
    assert not (tmp_path / "step.sft").exists()


def test_a_text_within_the_vocabulary_trains(tmp_path, capsys):
    assert _run(tmp_path, "ABC 123 XYZ. ") == 0, capsys.readouterr().err  # up to 'Z' (90)
    assert (tmp_path / "step.sft").is_file()
