"""An output path that is one of the command's inputs is refused with one ``error:``
line and the input is left as it was: the same file by device and inode (a symlink, a
hard link, another spelling), the model file, or its folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from golden.handmade import handmade_trace

from app.cli import main
from app.commands.checks import PathProblem, output_file, replace_atomically

MODEL = """
import torch
class Big(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.l(x)
"""


@pytest.fixture
def files(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    handmade_trace().save(tmp_path / "T.sft")
    handmade_trace().save(tmp_path / "U.sft")
    os.link(tmp_path / "T.sft", tmp_path / "hard.sft")
    os.symlink(tmp_path / "T.sft", tmp_path / "soft.sft")
    (tmp_path / "m.py").write_text(MODEL)
    return tmp_path


CASES = [
    "report T.sft --format md -o T.sft",
    "report T.sft --format md -o ./T.sft",
    "report T.sft --format md -o hard.sft",
    "report T.sft --format md -o soft.sft",
    "report T.sft --format md -o .",
    "diff T.sft U.sft -o T.sft",
    "diff T.sft U.sft -o ../{name}/U.sft",
    "trace --model m.py:Big --input-shape 2,4 --input-dtype float -o m.py",
    "trace --model m.py:Big --input-shape 2,4 --input-dtype float -o .",
    "train --text m.py -o m.py --steps 1",
    "train --task copy -o c.safetensors --steps 1 --trace-step 1 --trace-out c.safetensors",
]


@pytest.mark.parametrize("template", CASES)
def test_an_input_is_never_an_output(files, template, capsys):
    before = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    argv = template.format(name=files.name).split()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write"), err
    assert "input" in err[0] or "folder of" in err[0]
    after = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    assert after == before


def test_another_output_is_written(files, capsys):
    assert main(["report", "T.sft", "--format", "md", "-o", "R.md"]) == 0
    assert (files / "R.md").read_text().startswith("#")


def test_replace_atomically_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        replace_atomically(target, fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]  # no leftover
    replace_atomically(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new"


def test_output_file_compares_inodes_not_spellings(tmp_path):
    src = tmp_path / "a.sft"
    src.write_text("x")
    with pytest.raises(PathProblem, match="input"):
        output_file(tmp_path / "." / "a.sft", inputs=[src])
    assert output_file(tmp_path / "b.sft", inputs=[src]) == tmp_path / "b.sft"
