"""SIGTERM at any moment of ``scratchformer trace`` keeps what was recorded and says
where: after the forward (while the axes are named, while the streamed file is checked
and closed) and while a trace is saved; and a training replay that calls ``sys.exit``
keeps its trace and says so. (During the forward: tests/tracing/file/test_faults.py.)

The signals are real, sent to a real ``scratchformer`` process. To land one inside a
given stage every time, the child wraps that stage's function so that it first sends
SIGTERM to its own process and then goes on; the handler runs where it would for a
signal from outside (the next bytecode of the main thread)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tracing

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import importlib, os, signal, sys

def sigterm_during(where):
    module_name, name = where.rsplit(".", 1)
    module = importlib.import_module(module_name)
    real = getattr(module, name)
    sent = []
    def wrapped(*args, **kwargs):
        if not sent:  # one signal, the first time the stage runs
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the middle of it
        return real(*args, **kwargs)
    setattr(module, name, wrapped)

sigterm_during(sys.argv[1])
from app.cli import main
sys.argv = ["scratchformer", *sys.argv[2:]]
sys.exit(main())
"""


def _trace_with_sigterm_during(where: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = ["trace", "--capture", "values", "-o", str(out), "--quiet", *extra]
    return subprocess.run([sys.executable, "-c", CHILD, where, *argv], env=env, cwd=out.parent,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("where", "stage"),
    [
        ("tracing.capture.tracer.name_trace", "naming the axes"),
        ("tracing.file.writer.header_metadata", "checking and writing the header"),
    ],
)
def test_sigterm_after_the_forward_keeps_the_whole_forward_in_the_named_file(
    tmp_path, demo_steps, where, stage
):
    out = tmp_path / "demo.sft"
    done = _trace_with_sigterm_during(where, out)
    assert done.returncode == 143, (stage, done.stderr)
    assert f"partial trace was saved to {out}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    trace = tracing.load(out)  # before: a 0-byte NAME.PID-TID.partial that nothing opens
    assert len(trace.steps) == demo_steps  # the forward had ended: all of it
    kept = [r for r in trace.tensors if r.value_key is not None]
    assert kept and all(trace.value(r.id) is not None for r in kept)
    trace.values.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.sft"]  # no leftovers


def test_sigterm_while_saving_finishes_the_file_then_ends(tmp_path, demo_steps):
    out = tmp_path / "demo.sft"
    done = _trace_with_sigterm_during("tracing.file.saving.write_safetensors", out, "--no-stream")
    assert done.returncode == 143, done.stderr
    assert f"interrupted while saving: the trace was saved to {out}" in done.stderr
    trace = tracing.load(out)
    assert trace.error is None and len(trace.steps) == demo_steps
    trace.values.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.sft"]


@pytest.fixture(scope="module")
def demo_steps() -> int:
    """The steps of the demo model's whole forward, traced here (the reference)."""
    import torch

    from scratchformer import DEMO_PROMPT, ByteTokenizer, demo_model

    tokens = torch.tensor([ByteTokenizer().encode(DEMO_PROMPT)])
    return len(tracing.trace(demo_model(), tokens).steps)


EXITING = """
import sys, torch

class Net(torch.nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, x):
        Net.calls += 1
        if Net.calls == 2:  # the replay of step 1
            sys.exit(3)
        return self.head(torch.sqrt(self.emb(x) * 0))  # sqrt at 0: an infinite gradient

def get_batch(step):
    x = torch.randint(0, 16, (2, 5))
    return x, x
"""


def test_a_training_replay_that_exits_keeps_its_trace_and_says_so(tmp_path, capsys):
    from app.cli import main

    model = tmp_path / "exiting.py"
    model.write_text(EXITING)
    out = tmp_path / "bad.sft"
    argv = ["train", "--model", f"{model}:Net", "--data", f"{model}:get_batch", "--steps", "3",
            "--trace-on-nonfinite", "-o", str(out), "--quiet"]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 3  # the model's own exit, as it asked
    said = capsys.readouterr().out
    assert f"wrote training-step trace {out}" in said, said
    assert "the replay stopped: SystemExit: 3" in said
    trace = tracing.load(out)  # before: nothing on disk
    assert trace.meta["watch"]["step"] == 1
    assert "SystemExit: 3" in trace.error
    assert any(s.module == "" for s in trace.steps)
