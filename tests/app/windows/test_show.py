"""``tracing.show``: a model (traced first, a failure included), a Trace or a file opens in
the app in a child process, and the call returns when its window closes."""

from __future__ import annotations

import subprocess

import pytest
import torch
from helpers.own_models import TUTORIAL, load

import tracing
from tracing import show_app as show_mod

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def launched(monkeypatch):
    """The child processes show would start, with the trace each was given (read back)."""
    seen: list[tuple[list[str], tracing.Trace]] = []

    def fake_run(command, env, check):
        seen.append((command, tracing.load(command[-1])))
        assert env["PYTHONPATH"].split(":")[0].endswith("11-own-model") or env["PYTHONPATH"]
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(show_mod.subprocess, "run", fake_run)
    # the fallback: no in-process viewer (an installed one is found by its entry point)
    monkeypatch.setattr(show_mod, "_live_viewer", lambda: (None, None))
    return seen


def test_show_a_failing_model_opens_its_partial_trace(launched, capsys):
    loaded = load(TUTORIAL, "TutorialLM", shape=(1, 5))
    trace = tracing.show(loaded.model, *loaded.args)
    assert trace is not None and trace.failure is not None
    ((command, shown),) = launched
    assert command[1:4] == ["-m", "app.cli", "app"]
    assert shown.failure == trace.failure and shown.meta["capture"] == "values"
    assert "NameError" in capsys.readouterr().err
    assert not __import__("pathlib").Path(command[-1]).exists()  # the temporary file is gone


def test_show_a_trace_or_a_file(launched, tmp_path):
    trace = tracing.trace(torch.nn.Linear(3, 2), torch.randn(1, 3))
    assert tracing.show(trace) is trace
    trace.save(tmp_path / "t.sft")
    assert tracing.show(tmp_path / "t.sft") is None
    assert [len(t.steps) for _, t in launched] == [len(trace.steps)] * 2
    with pytest.raises(FileNotFoundError):
        tracing.show(tmp_path / "missing.sft")
    with pytest.raises(TypeError):
        tracing.show(42)


@pytest.mark.gui
@pytest.mark.slow
def test_show_really_opens_the_app_and_returns(monkeypatch, capfd):
    """The real child process, offscreen, told to close its window after a moment."""
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    monkeypatch.setenv("SCRATCHFORMER_QUIT_AFTER_MS", "1500")
    loaded = load(TUTORIAL, "TutorialLM", shape=(1, 5))
    trace = tracing.show(loaded.model, *loaded.args, capture="stats")
    out = capfd.readouterr().out
    step = trace.steps[trace.failure.step]
    assert f"shown: step {step.index + 1} / {len(trace.steps)} · {step.label}" in out
