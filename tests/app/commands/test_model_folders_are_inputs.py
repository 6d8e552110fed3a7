"""Every file a command reads is an input, and no output may be one: a model folder is
read whole (config, weights, tokenizer), a ``config.json`` brings the tokenizer beside it,
``--tokenizer`` is read too. An output that is one of them, or lies inside an input
folder (by any spelling: a symlink, a hard link), is refused with one ``error:`` line
before anything is loaded, on every command and ``--device``, and in the app's saves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from helpers.hf_folders import llama_folder

from app.cli import main

MODEL = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(300, 8)
        self.out = torch.nn.Linear(8, 300)
    def forward(self, x):
        return self.out(self.emb(x))
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("folders")
    (root / "tl").mkdir()
    llama_folder(root / "tl")
    (root / "m.py").write_text(MODEL)
    (root / "helper.py").write_text("SIZE = 8\n")  # a module m.py could import
    (root / "corpus.txt").write_text("the cat sat on the mat. " * 20)
    os.symlink(root / "tl", root / "link")
    os.link(root / "tl" / "model.safetensors", root / "hard.safetensors")
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


TL = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
P = "--prompt the --quiet"
CASES = [
    f"trace --model tl {P} -o tl/model.safetensors",
    f"trace --model tl {P} --device meta -o tl/model.safetensors",
    f"trace --model tl {P} -o tl/tokenizer.json",
    f"trace --model tl {P} --device meta -o tl/generation_config.json",
    f"trace --model tl {P} -o tl/new-file.sft",  # a new file inside the folder too
    f"trace --model tl/config.json {P} --device meta -o tl/tokenizer.json",
    f"trace --model ./tl/ {P} -o link/model.safetensors",  # another spelling, a symlink
    f"trace --model tl {P} -o hard.safetensors",  # a hard link to the weights
    f"trace --model m.py:Net --tokenizer tl {P} -o tl/tokenizer.json",
    f"trace --model m.py:Net --tokenizer tl/tokenizer.json {P} -o tl/tokenizer.json",
    f"trace --model m.py:Net {P} -o helper.py",
    "patch --model tl --clean the --corrupted a --quiet -o tl/config.json",
    "patch --model tl --clean the --corrupted a --quiet -o ok.csv --png tl/heads.png",
    "generate --model tl --prompt the --max-new-tokens 1 --trace tl",
    "generate --model tl --prompt the --max-new-tokens 1 --trace tl/run.gen",
    "generate --model tl --prompt the --max-new-tokens 1 --trace link",
    "bench --model tl --quick --tmp tl",  # its scratch folder
    "bench --model tl --quick --tmp link",
    "train --model m.py:Net --text corpus.txt --steps 1 --trace-step 1 -o m.py",
    "train --model m.py:Net --text corpus.txt --steps 1 --trace-step 1 -o corpus.txt",
    "train --model m.py:Net --text corpus.txt --steps 1 --trace-step 1 -o helper.py",
]


@pytest.mark.parametrize("command", CASES)
def test_nothing_a_command_reads_is_written(made, command, capsys, monkeypatch):
    monkeypatch.chdir(made)
    before = _files(made)
    assert main(command.split()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write"), err
    assert "input" in err[0], err
    assert _files(made) == before  # nothing replaced, nothing added
    assert sorted(p.name for p in (made / "tl").iterdir()) == sorted(TL)
    assert not (made / "ok.csv").exists()


def test_generate_into_a_folder_that_holds_an_input_is_refused(made, capsys, monkeypatch):
    monkeypatch.chdir(made)
    command = "generate --model tl/config.json --prompt the --max-new-tokens 1 --trace ."
    assert main(command.split()) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write into .: it holds tl/config.json"), err


def test_outputs_beside_the_folder_are_written(made, tmp_path, capsys):
    out = tmp_path / "t.sft"
    argv = ["trace", "--model", str(made / "tl"), "--device", "meta", "-o", str(out)]
    assert main([*argv, "--prompt", "the", "--quiet"]) == 0, capsys.readouterr().err
    assert out.stat().st_size > 0


def test_the_app_saves_nothing_into_the_model_folder(made, qtbot, errors, tmp_path):
    from app.core import session
    from app.windows.main_window import MainWindow

    window = MainWindow()
    qtbot.addWidget(window)
    source = session.ModelSource("file", model=str(made / "tl"), device="meta")
    request = session.TraceRequest(prompt="the", source=source, capture="shapes")
    window._pending_request = request
    window._on_trace_finished(session.run_trace(request))
    assert window.trace is not None
    before = _files(made)
    tl = made / "tl"
    assert not window.save_to(tl / "model.safetensors")
    assert not window.export_report(tl / "tokenizer.json", "md")
    assert not window.export_diagram(tl / "diagram.png")
    assert not window.export_heatmap(made / "link" / "heatmap.png")
    assert [t for t, _ in errors] == [
        "Cannot save trace",
        "Cannot export report",
        "Cannot export diagram",
        "Cannot export heatmap",
    ]
    assert all("inside the input folder" in text for _, text in errors), errors
    assert _files(made) == before
    assert window.save_to(tmp_path / "ok.sft") and (tmp_path / "ok.sft").is_file()
    # the trace file just saved is now what the window reads: no export replaces it
    assert not window.export_report(tmp_path / "ok.sft", "md")
    assert "it is an input" in errors[-1][1]


def test_the_sweep_dialog_saves_nothing_into_the_model_folder(made, qtbot, errors, tmp_path):
    from app.core import session
    from app.windows.sweep_dialog import SweepDialog

    dialog = SweepDialog()
    qtbot.addWidget(dialog)
    dialog.request = session.TraceRequest(
        prompt="the", source=session.ModelSource("file", model=str(made / "tl"))
    )
    written = []
    assert not dialog.save_checked(made / "tl" / "config.json", written.append)
    assert written == [] and "inside the input folder" in errors[-1][1]
    assert dialog.save_checked(tmp_path / "sweep.csv", written.append)
    assert written == [tmp_path / "sweep.csv"]
