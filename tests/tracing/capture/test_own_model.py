"""Your own model in the tool: ``--model FILE.py:NAME`` (instance, class, function), its
inputs, one-line errors naming file and line, a failure kept as a post-mortem (the
tutorial forgets ``import torch.nn.functional as F``), and the sources carried along."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers.own_models import HF_GPT2, NANOGPT, TUTORIAL, TUTORIAL_FIXED, load

import tracing
from app.cli import main
from app.core.user_model import InputSpec, ModelSpec, UserCodeError, import_file

pytestmark = pytest.mark.usefixtures("one_thread")
SEED = Path("/work/shared/seed/000_277636e56d5b7886.txt")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.skipif(not SEED.is_file(), reason="the tutorial text is not on this machine")
def test_the_fixture_is_the_tutorial_verbatim():
    """Every line of the tutorial's code (classes and function) stands in the fixture."""
    seed = SEED.read_text(encoding="utf-8")
    fixture = TUTORIAL.read_text(encoding="utf-8")
    code = fixture.split('"""', 2)[2].split("# --- the reader's completion")[0].strip("\n")
    blocks = re.split(r"\n\n(?=class MultiHeadAttention|class PositionWiseFeedForward)", code)
    assert len(blocks) == 3
    for block in blocks:
        assert block in seed
    assert "\nimport torch.nn.functional" not in fixture  # the tutorial's bug, kept


def test_name_may_be_an_instance_a_class_or_a_function(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "import torch.nn as nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(20, 8)\n"
        "    def forward(self, x):\n"
        "        return self.emb(x)\n"
        "net = Net()\n"
        "def make():\n"
        "    return Net()\n"
    )
    for name in ("net", "Net", "make"):
        loaded = load(path, name, shape=(2, 5))
        assert isinstance(loaded.model, torch.nn.Module) and not loaded.model.training
        (x,) = loaded.args
        assert x.shape == (2, 5) and x.dtype == torch.long and int(x.max()) < 20
    floats = load(path, "net", shape=(3, 4), dtype="float").args[0]
    assert floats.dtype == torch.float32 and floats.shape == (3, 4)


def test_inputs_prompt_then_shape_then_example_inputs():
    by_prompt = load(TUTORIAL_FIXED, "TutorialLM", prompt="hi!")
    assert by_prompt.args[0].tolist() == [[104, 105, 33]]
    assert by_prompt.meta["text"] == "hi!" and by_prompt.meta["tokens"] == [104, 105, 33]
    assert load(TUTORIAL_FIXED, "TutorialLM", shape=(1, 3)).args[0].shape == (1, 3)
    example = load(TUTORIAL_FIXED, "TutorialLM")
    assert example.args[0].shape == (2, 10) and example.meta["inputs"] == "example_inputs"
    with pytest.raises(UserCodeError, match="embedding has only 96"):
        load(NANOGPT, "gpt", prompt="é")  # byte 195 >= vocab 96


def test_a_reimport_reads_the_edited_file(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import torch.nn as nn\nnet = nn.Linear(2, 3)\n")
    assert import_file(path).net.out_features == 3
    path.write_text("import torch.nn as nn\nnet = nn.Linear(2, 5)\n")
    assert import_file(path).net.out_features == 5


def test_a_sibling_module_is_importable_and_reread(tmp_path):
    (tmp_path / "layers_x.py").write_text("WIDTH = 3\n")
    path = tmp_path / "m.py"
    path.write_text(
        "import torch.nn as nn\nfrom layers_x import WIDTH\nnet = nn.Linear(2, WIDTH)\n"
    )
    assert import_file(path).net.out_features == 3
    (tmp_path / "layers_x.py").write_text("WIDTH = 7\n")
    assert import_file(path).net.out_features == 7
    assert str(tmp_path) not in __import__("sys").path


@pytest.mark.parametrize(
    ("source", "name", "words"),
    [
        ("import torch\ndef f(:\n", "f", ["m.py:2", "SyntaxError"]),
        ("import torch\n\nx = undefined_thing\n", "x", ["m.py:3", "NameError", "undefined_thing"]),
        (
            "import torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        raise ValueError('bad width')\n",
            "M",
            ["m.py:5", "ValueError", "bad width"],
        ),
        ("import torch.nn as nn\nclass M(nn.Module):\n    pass\n", "Nope", ["no 'Nope'", "M"]),
        ("x = 3\n", "x", ["x is a int"]),
        (
            "import torch.nn as nn\nclass M(nn.Module):\n    def __init__(self, width):\n"
            "        super().__init__()\n",
            "M",
            ["M() needs arguments"],
        ),
    ],
)
def test_import_and_build_failures_are_one_error_line(capsys, tmp_path, source, name, words):
    path = tmp_path / "m.py"
    path.write_text(source)
    rc, out, err = run_cli(capsys, "trace", "--model", f"{path}:{name}", "-o", tmp_path / "o.sft")
    assert rc == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "o.sft").exists()


def test_bad_model_and_shape_arguments(capsys, tmp_path):
    for argv, word in [
        (["--model", "no_colon.py"], "FILE.py:NAME"),
        (["--model", f"{tmp_path / 'gone.py'}:X"], "no such model file"),
        (["--model", f"{NANOGPT}:gpt", "--input-shape", "2,a"], "--input-shape"),
    ]:
        rc, _, err = run_cli(capsys, "trace", *argv, "-o", tmp_path / "o.sft")
        assert rc == 2 and word in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("path", "name", "steps_at_least"),
    [(TUTORIAL_FIXED, "TutorialLM", 90), (NANOGPT, "gpt", 60), (HF_GPT2, "tiny_gpt2", 100)],
)
def test_cli_traces_each_kind_of_model(capsys, tmp_path, path, name, steps_at_least):
    out_file = tmp_path / "t.sft"
    rc, _out, err = run_cli(
        capsys, "trace", "--model", f"{path}:{name}", "--input-shape", "1,6", "-o", out_file
    )
    assert rc == 0, err
    trace = tracing.load(out_file)
    assert len(trace.steps) >= steps_at_least and trace.complete and trace.failure is None
    assert trace.meta["model_file"] == str(path) and trace.meta["model_name"] == name
    assert trace.steps[0].source is None  # the CLI called the model: no user line
    assert all("/app/" not in s.source.file for s in trace.steps if s.source is not None)
    files = {Path(f).name for f in trace.sources}
    assert files & {"tutorial.py", "nanogpt.py", "modeling_gpt2.py"}  # where the ops ran


def test_tutorial_failure_is_saved_as_a_post_mortem(capsys, tmp_path):
    out_file = tmp_path / "t.sft"
    rc, _out, err = run_cli(capsys, "trace", "--model", f"{TUTORIAL}:TutorialLM", "-o", out_file)
    assert rc == 1 and "NameError" in err and "partial trace was saved" in err
    trace = tracing.load(out_file)
    failure = trace.failure
    assert failure.type == "NameError" and failure.message == "name 'F' is not defined"
    assert trace.steps[failure.step].module == "blocks.0.self_attn"
    line = failure.location
    assert line.file == str(TUTORIAL) and line.function == "scaled_dot_product_attention"
    assert line.text == "attention_weights = F.softmax(scores, dim=-1)"
    assert TUTORIAL.read_text().splitlines()[line.line - 1].strip() == line.text
    assert trace.sources[str(TUTORIAL)] == TUTORIAL.read_text()
    assert trace.steps[-1].op == "masked_fill"  # recorded up to the line before


def test_failing_op_is_the_failure_step_and_its_line():
    class Mismatch(torch.nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)  # (2, 3) @ (4, 5)

    with pytest.raises(tracing.TraceError) as info:
        tracing.trace(Mismatch(), torch.randn(2, 3), torch.randn(4, 5))
    trace = info.value.trace
    step = trace.steps[trace.failure.step]
    assert step.op == "matmul" and step.error and trace.failure.type == "RuntimeError"
    assert trace.failure.location.text.startswith("return torch.matmul(a, b)")
    assert [trace.tensor(i).shape for i in step.inputs] == [(2, 3), (4, 5)]
    from tracing.analysis.postmortem import failure_lines

    lines = failure_lines(trace)
    assert lines[0].startswith("RuntimeError: ") and "cannot be multiplied" in lines[0]
    assert lines[1].startswith("at test_own_model.py:") and "in forward" in lines[1]
    assert lines[-1] == "inputs:  input (B=2, T=3)  ·  arg1 (4, 5)"  # the operands, side by side
    assert failure_lines(trace, 0) == []  # only on the failing step


def test_root_step_source_is_the_callers_line_never_the_tool():
    model = torch.nn.Linear(3, 2)
    trace = tracing.trace(model, torch.randn(1, 3))
    assert trace.steps[0].source.file == __file__  # this test called it
    assert re.search(r"tracing\.trace\(model", trace.steps[0].source.text)
    from app.core import session

    outcome = session.demo_trace("shapes")
    assert outcome.trace.steps[0].source is None  # session.py called it, not the user


def test_sources_survive_save_and_load_and_old_files_still_open(tmp_path):
    loaded = load(NANOGPT, "gpt", shape=(1, 4))
    trace = tracing.trace(loaded.model, *loaded.args)
    assert set(trace.sources) == {str(NANOGPT), __file__}  # the model, and the root call here
    trace.save(tmp_path / "a.sft")
    again = tracing.load(tmp_path / "a.sft")
    assert again.sources == trace.sources and again.failure is None
    # a file written before these fields existed
    import json

    from tracing.file.manifest import encode_manifest
    from tracing.file.validate import validate

    manifest = encode_manifest(trace)
    del manifest["failure"], manifest["source_files"]
    old = validate(json.loads(json.dumps(manifest)), None)
    assert old.sources == {} and old.failure is None


def test_sources_are_capped():
    from tracing.capture.postmortem import embed_sources

    loaded = load(NANOGPT, "gpt", shape=(1, 4))
    trace = tracing.trace(loaded.model, *loaded.args)
    assert embed_sources(trace.steps, cap=10) == {}


def test_a_copied_tutorial_edited_and_retraced(tmp_path):
    """The loop a user runs: trace, read the failure, add the import, trace again."""
    mine = tmp_path / "tutorial.py"
    shutil.copy(TUTORIAL, mine)
    with pytest.raises(tracing.TraceError):
        loaded = load(mine, "TutorialLM", shape=(1, 5))
        tracing.trace(loaded.model, *loaded.args)
    text = mine.read_text().replace(
        "import math\n", "import math\nimport torch.nn.functional as F\n"
    )
    mine.write_text(text)
    loaded = load(mine, "TutorialLM", shape=(1, 5))
    trace = tracing.trace(loaded.model, *loaded.args)
    assert trace.complete and trace.sources[str(mine)] == text
    assert ModelSpec.parse(f"{mine}:TutorialLM").name == "TutorialLM"
    assert InputSpec.parse_shape("2x10") == (2, 10)


def test_app_command_checks_the_model_argument_before_opening_a_window(capsys, tmp_path):
    for argv, word in [
        (["app", "--model", f"{tmp_path / 'gone.py'}:X"], "no such model file"),
        (["app", "--model", "nocolon.py"], "FILE.py:NAME"),
    ]:
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and word in err and len(err.strip().splitlines()) == 1


def test_a_streamed_partial_trace_keeps_its_failure_and_sources(tmp_path):
    loaded = load(TUTORIAL, "TutorialLM", shape=(1, 5))
    with pytest.raises(tracing.TraceError):
        tracing.trace(loaded.model, *loaded.args, capture="values", out=tmp_path / "s.sft")
    trace = tracing.load(tmp_path / "s.sft")
    assert trace.failure.type == "NameError" and str(TUTORIAL) in trace.sources
