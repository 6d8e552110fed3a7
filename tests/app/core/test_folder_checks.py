"""A model folder is anyone's: no code of it runs, no pickle in it is read, and a config
that would hang or exhaust the machine is one ``error:`` line in seconds; every command
that takes ``--model`` (trace, patch, generate) on every device."""

from __future__ import annotations

import json
import os
import pickle
import pty
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from helpers.hf_folders import llama_folder

from app.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return llama_folder(tmp_path_factory.mktemp("tiny"))


def _copy(tiny: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    shutil.copytree(tiny, folder)
    return folder


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


COMMANDS = [
    "trace --model {m} --prompt the --quiet -o {out}/t.sft",
    "trace --model {m} --prompt the --quiet --device meta -o {out}/t.sft",
    "trace --model {m}/config.json --prompt the --quiet -o {out}/t.sft",
    "patch --model {m} --clean the --corrupted a --quiet -o {out}/p.csv",
    "generate --model {m} --prompt the --max-new-tokens 1",
]


# --------------------------------------------------------------------------- code


def _with_code(folder: Path, model_type: str) -> Path:
    """``folder`` whose config names its own code (auto_map), which would leave RAN."""
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type=model_type,
        auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"},
    )
    (folder / "config.json").write_text(json.dumps(config))
    # transformers imports a copy from its cache: the marker's path is written out whole
    (folder / "evil.py").write_text(
        f"import pathlib; pathlib.Path({str(folder / 'RAN')!r}).touch()\n"
    )
    return folder


@pytest.mark.parametrize("model_type", ["evil", "llama"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_config_naming_its_own_code_is_refused(tiny, tmp_path, capsys, command, model_type):
    m = _with_code(_copy(tiny, tmp_path), model_type)
    assert main(command.format(m=m, out=tmp_path).split()) == 2
    line = _one_error(capsys)
    assert "auto_map" in line and "never runs" in line, line
    assert not (m / "RAN").exists()
    assert not list(tmp_path.glob("*.sft")) and not list(tmp_path.glob("*.csv"))


def test_an_unknown_model_type_is_refused_saying_why(tiny, tmp_path, capsys):
    m = _copy(tiny, tmp_path)
    config = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**config, "model_type": "nobody-knows"}))
    assert main(["trace", "--model", str(m), "-o", str(tmp_path / "t.sft")]) == 2
    line = _one_error(capsys)
    assert "'nobody-knows' is not an architecture transformers" in line, line
    assert "own code" in line


def test_no_prompt_on_a_terminal_and_no_code_runs_when_answered_yes(tiny, tmp_path):
    """On a terminal, transformers itself would ask "run the custom code? [y/N]"; a
    person answering y (here: typed ahead) must still run nothing."""
    m = _with_code(_copy(tiny, tmp_path), "evil")
    main_fd, child_fd = pty.openpty()
    os.write(main_fd, b"y\ny\n")
    command = [sys.executable, "-m", "app.cli", "trace", "--model", str(m), "--prompt", "the"]
    done = subprocess.run(
        [*command, "-o", str(tmp_path / "t.sft")],
        stdin=child_fd, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    os.close(child_fd)
    os.close(main_fd)
    assert done.returncode == 2, done.stderr
    assert "auto_map" in done.stderr and "Traceback" not in done.stderr
    assert not (m / "RAN").exists()


def test_every_transformers_load_refuses_remote_code(tiny, tmp_path, monkeypatch, capsys):
    import transformers

    seen = []
    for name in ("from_pretrained", "from_config"):
        real = getattr(transformers.AutoModelForCausalLM, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "not passed")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(transformers.AutoModelForCausalLM, name, spy)
    for device in ("cpu", "meta"):  # from_pretrained, then from_config
        argv = ["trace", "--model", str(tiny), "--device", device, "--capture", "shapes"]
        argv += ["--quiet", "--prompt", "the", "-o", str(tmp_path / f"{device}.sft")]
        assert main(argv) == 0, capsys.readouterr()
    assert {name for name, _ in seen} == {"from_pretrained", "from_config"}
    assert all(flag is False for _, flag in seen), seen


# --------------------------------------------------------------------------- pickles


class _Boom:
    """Unpickling this leaves a file named UNPICKLED beside the folder's config."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _pickle(path: Path) -> None:
    path.write_bytes(pickle.dumps(_Boom(path.with_name("UNPICKLED"))))


def _bin_beside(m: Path) -> None:
    _pickle(m / "pytorch_model.bin")


def _pt_beside(m: Path) -> None:
    _pickle(m / "weights.pt")


def _bin_index_empty_safetensors(m: Path) -> None:
    """The case that reached ``torch.load``: an empty ``*.safetensors`` beside a ``.bin``
    index (the pickle itself kept in a subfolder, where no suffix rule sees it)."""
    (m / "model.safetensors").write_bytes(b"")
    (m / "shards").mkdir()
    _pickle(m / "shards" / "pytorch_model-00001-of-00001.bin")
    index = {
        "metadata": {},
        "weight_map": {"lm_head.weight": "shards/pytorch_model-00001-of-00001.bin"},
    }
    (m / "pytorch_model.bin.index.json").write_text(json.dumps(index))


def _safetensors_index_naming_a_bin(m: Path) -> None:
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001.bin"}}
    (m / "model.safetensors.index.json").write_text(json.dumps(index))


def _empty_safetensors(m: Path) -> None:
    (m / "model.safetensors").write_bytes(b"")


@pytest.mark.parametrize(
    "spoil, says",
    [
        (_bin_beside, "pickle weights pytorch_model.bin"),
        (_pt_beside, "pickle weights weights.pt"),
        (_bin_index_empty_safetensors, "not a .safetensors file"),
        (_safetensors_index_naming_a_bin, "'model-00001.bin', not a .safetensors file"),
        (_empty_safetensors, "not a safetensors file (0 bytes"),
    ],
)
def test_no_path_reaches_a_pickle(tiny, tmp_path, capsys, monkeypatch, spoil, says):
    import torch

    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a))
    m = _copy(tiny, tmp_path)
    spoil(m)
    for command in ("trace --model {m} --prompt the -o {out}/t.sft", COMMANDS[3], COMMANDS[4]):
        assert main(command.format(m=m, out=tmp_path).split()) == 2
        line = _one_error(capsys)
        assert says in line, line
    assert loads == [] and not (m / "UNPICKLED").exists()


# --------------------------------------------------------------------------- bounds


def _config(m: Path, **changes) -> None:
    config = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**config, **changes}))


def _deep(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


BOUNDS = [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers is 1,000,000"),
    ({"text_config": {"num_hidden_layers": 10**9}}, "text_config.num_hidden_layers is"),
    ({"n_layer": 5000}, "n_layer is 5,000"),
    ({f"k{i}": i for i in range(60_000)}, "more than 50,000 keys and items"),
    ({"nested": _deep(40)}, "nested more than 32 levels"),
    ({"pad": "x" * (5 * 2**20)}, "more than the 4,194,304 read"),
]


@pytest.mark.parametrize("changes, says", BOUNDS, ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_configs_are_bounded_before_anything_is_built(
    tiny, tmp_path, capsys, changes, says, device
):
    m = _copy(tiny, tmp_path)
    _config(m, **changes)
    start = time.perf_counter()
    argv = ["trace", "--model", str(m / "config.json"), "--device", device]
    assert main([*argv, "-o", str(tmp_path / "t.sft")]) == 2
    assert time.perf_counter() - start < 5
    line = _one_error(capsys)
    assert says in line, line


def test_a_config_nested_past_pythons_recursion_is_one_line(tiny, tmp_path, capsys):
    m = _copy(tiny, tmp_path)
    text = (m / "config.json").read_text().rstrip()
    (m / "config.json").write_text(text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["trace", "--model", str(m), "--device", "meta", "-o", str(tmp_path / "t")]) == 2
    assert "nested too deeply" in _one_error(capsys)


def test_random_weights_larger_than_memory_are_refused(tiny, tmp_path, capsys):
    m = _copy(tiny, tmp_path)
    _config(
        m, vocab_size=2**22, hidden_size=2**16, num_attention_heads=2**8, num_key_value_heads=2**8
    )
    start = time.perf_counter()
    assert main(["trace", "--model", str(m / "config.json"), "-o", str(tmp_path / "t")]) == 2
    line = _one_error(capsys)
    assert "GiB free; --device meta traces its shapes" in line, line
    assert time.perf_counter() - start < 10


def test_a_released_config_is_within_every_bound():
    """The bounds leave real configs alone: the largest layer count released (~130) and
    a label map of a few thousand entries."""
    from app.core import folder_checks

    data = {
        "model_type": "llama",
        "num_hidden_layers": 126,
        "id2label": {str(i): "x" for i in range(5000)},
    }
    folder_checks._check_shape(Path("c.json"), data)
    folder_checks._check_layers(Path("c.json"), data)


def test_the_docs_tables_give_the_bounds_the_code_applies():
    from app.core import folder_checks as fc
    from tracing.capture import structure

    models = (ROOT / "docs" / "models.md").read_text()
    row = next(line for line in models.splitlines() if line.startswith("| a `config.json` over"))
    assert f"{fc.MAX_CONFIG_BYTES // 2**20} MiB" in row and f"{fc.MAX_CONFIG_DEPTH} levels" in row
    assert f"{fc.MAX_CONFIG_ENTRIES:,} keys" in row
    assert f"over {fc.MAX_LAYERS:,} |" in models
    trace_file = (ROOT / "docs" / "trace-file.md").read_text()
    kept = (
        f"({structure.CONFIG_KEPT_CHARS // 2**20} MiB of JSON, {structure.CONFIG_KEPT_DEPTH} levels"
    )
    assert kept in trace_file


def test_a_huge_tokenizer_is_one_line_in_a_second(tiny, tmp_path, capsys):
    m = _copy(tiny, tmp_path)
    with open(m / "tokenizer.json", "r+b") as f:
        f.truncate(300 * 2**20)  # sparse: 300 MB that cost no disk
    start = time.perf_counter()
    argv = ["trace", "--model", str(m), "--device", "meta", "--prompt", "the"]
    assert main([*argv, "-o", str(tmp_path / "t.sft")]) == 2
    assert "more than the 268,435,456 read" in _one_error(capsys)
    assert time.perf_counter() - start < 5
