"""``scratchformer train --model FILE.py:NAME`` on your own training code, the default
loss, and the worked nanoGPT example: the loss goes NaN, the trace is saved, one N in
the app lands on the op that made it."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import tracing
from app.cli import main
from app.core import own_training, session
from tracing.breakpoints import first_nonfinite_gradient

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "nanogpt_nan"
MODEL = f"{EXAMPLE / 'model.py'}:GPT"
DATA = f"{EXAMPLE / 'data.py'}:get_batch"


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    """The README's walk-through, through the command line: the file and what it printed."""
    out = tmp_path_factory.mktemp("nan") / "bad.sft"
    args = ["train", "--model", MODEL, "--data", DATA, "--lr", "1e14", "--steps", "6"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*args, "--trace-on-nonfinite", "-o", str(out), "--quiet"]) == 0
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def bad_trace(bad_run):
    return bad_run[0]


def test_the_nanogpt_example_goes_nan_and_the_origin_is_the_attention_call(bad_trace):
    trace = tracing.load(bad_trace)
    assert trace.meta["watch"]["step"] <= 3  # within a few steps
    first = session.next_nonfinite(trace, -1)
    step = trace.steps[first]
    assert (step.kind, step.op) == ("op", "scaled_dot_product_attention")
    assert "F.scaled_dot_product_attention(q, k, v" in step.source.text
    assert step.source.file.endswith("model.py")
    # independently of the breakpoint code: its inputs are finite, its output is not,
    # and no op before it made a NaN or an Inf
    assert all(not trace.tensor(t).stats.has_nonfinite for t in step.inputs)
    assert trace.tensor(step.outputs[0]).stats.nan > 0
    before = [s for s in trace.steps[:first] if s.kind == "op"]
    assert all(not trace.tensor(t).stats.has_nonfinite for s in before for t in s.outputs)
    hit = first_nonfinite_gradient(trace)
    assert hit.step == first and "forward was already non-finite" in hit.reason
    # every backward output has stats (the loss's LogSoftmaxBackward0 too)
    backward = [s for s in trace.steps if s.kind == "backward"]
    assert backward and all(trace.tensor(r).stats is not None for s in backward for r in s.outputs)


@pytest.mark.gui
def test_one_press_of_n_in_the_app_lands_on_it(bad_trace, qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from app.windows.main_window import MainWindow

    w = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    assert w.open_path(bad_trace)
    w.go_to(0)
    assert "N" in [k.toString() for k in w.nan_action.shortcuts()]
    w.nan_action.trigger()  # N, once
    step = w.trace.steps[w.current]
    assert step.op == "scaled_dot_product_attention" and step.module == "transformer.h.0.attn"
    assert "scaled_dot_product_attention" in w.statusBar().currentMessage()
    # its line in red in the source pane, as the line of a forward that raised is
    assert w.source_view.failed_line and "scaled_dot_product_attention" in (
        w.source_view.highlighted_text()
    )
    w.go_to(0)
    assert not w.source_view.failed_line  # an ordinary step's line: the usual colour


def test_the_default_loss_says_what_shape_it_expected():
    logits, targets = torch.randn(2, 1, 7), torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(own_training.LossShapeError) as e:
        own_training.next_token_loss(logits, targets)
    text = str(e.value)
    assert "(B, T, V) = (2, 5, 7)" in text and "(2, 1, 7)" in text and "\n" not in text
    # (B, T, V) logits: the cross-entropy, as torch computes it
    logits = torch.randn(2, 5, 7)
    want = torch.nn.functional.cross_entropy(logits.reshape(10, 7), targets.reshape(10))
    assert torch.equal(own_training.next_token_loss(logits, targets), want)
    assert torch.equal(own_training.next_token_loss((logits, None), targets), want)
    loss = torch.tensor(3.0)
    assert own_training.next_token_loss(type("Out", (), {"loss": loss})(), targets) is loss


LAST_ONLY = '''
import torch
from torch import nn


class LastOnly(nn.Module):
    """Returns only the last position's logits, and takes no targets."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(256, 8)
        self.head = nn.Linear(8, 256)

    def forward(self, idx):
        return self.head(self.emb(idx))[:, -1:, :]


def loss(output, targets):
    return nn.functional.cross_entropy(output[:, -1], targets[:, -1])
'''


def test_a_model_that_does_not_fit_gets_one_message_and_loss_fixes_it(tmp_path, capsys):
    (tmp_path / "m.py").write_text(LAST_ONLY)
    (tmp_path / "t.txt").write_text("hello world, " * 20)
    spec = f"{tmp_path / 'm.py'}:LastOnly"
    args = ["train", "--model", spec, "--text", str(tmp_path / "t.txt"), "--block-size", "8"]
    args += ["--batch-size", "2", "--steps", "2", "--trace-step", "2", "--quiet"]
    out = tmp_path / "s.sft"
    assert main([*args, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "(B, T, V) = (2, 8, 256)" in err and "(2, 1, 256)" in err and len(err.splitlines()) == 1
    assert main([*args, "--loss", f"{tmp_path / 'm.py'}:loss", "-o", str(out)]) == 0
    trace = tracing.load(out)
    assert trace.modules["loss"].type == "loss" and trace.backward_start is not None


def test_the_apps_training_step_uses_the_model_files_loss():
    source = session.ModelSource("file", model=MODEL)
    request = session.TraceRequest("hello there, general", source, "stats", True)
    outcome = session.run_trace(request)
    assert outcome.status == "complete", outcome.message
    trace = outcome.trace
    assert trace.meta["loss_from"].startswith("the model's own loss")
    # nanoGPT's own cross-entropy: its log_softmax is among the model's steps
    assert any(s.op in ("cross_entropy", "log_softmax") for s in trace.steps if s.kind == "op")
    assert trace.backward_start is not None


def test_gradient_norms_group_by_repeated_layers_and_keep_nan(bad_trace):
    import math

    from tracing.analysis.gradients import layer_grad_norms, layer_of

    assert layer_of("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert layer_of("transformer.h.1.attn.c_attn.weight") == "transformer.h.1"
    assert layer_of("blocks.0.ff.fc1.weight") == "blocks.0"
    assert layer_of("lm_head.weight") == "lm_head"
    trace = tracing.load(bad_trace)
    norms = layer_grad_norms(trace)
    assert {"transformer.h.0", "transformer.h.1"} <= set(norms)
    for layer, norm in norms.items():  # NaN exactly where a parameter's gradient holds one
        bad = any(
            trace.param_grad(n).stats.nan for n in trace.meta["param_grads"] if layer_of(n) == layer
        )
        assert math.isnan(norm) == bad, layer
    assert any(math.isnan(v) for v in norms.values())


@pytest.mark.gui
def test_the_step_train_names_is_the_step_the_app_opens_on(bad_run, qtbot, tmp_path, capsys):
    """One step numbering (issue 33): the number ``train`` prints, typed into Ctrl+G, lands
    on the op it named; ``report`` and ``find "#N"`` name the same step by the same number."""
    from PySide6.QtCore import QSettings, Qt

    from app.windows.main_window import MainWindow

    path, printed = bad_run
    said = re.search(r"went non-finite at trace step (\d+): (.+?): ", printed)
    assert said, printed
    number, label = int(said[1]), said[2]
    assert main(["report", str(path), "--format", "md"]) == 0
    report = capsys.readouterr().out
    assert f"forward: first non-finite**: step {number} {label}:" in report
    assert main(["find", str(path), f"#{number}"]) == 0
    assert f"#{number} {label}  ·  1 × #{number}" in capsys.readouterr().out

    w = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow, timeout=3000)  # shortcuts go to the active window
    assert w.open_path(path)
    qtbot.keyClick(w, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)  # go to step
    qtbot.keyClicks(w.finder.field, str(number))
    qtbot.keyClick(w.finder.field, Qt.Key.Key_Return)
    step = w.trace.steps[w.current]
    assert step.label == label and step.op == "scaled_dot_product_attention"
    assert w.status_text().startswith(f"step {number} / {len(w.trace.steps)} · {label}")
    assert w.inspector._title.text().startswith(f"Step {number} / ")
