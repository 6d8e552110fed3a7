"""Faults end in one ``error:`` line and a usable partial trace: a forward that calls
``sys.exit``, raises a ``BaseException`` or an exception whose ``__str__`` raises; SIGTERM
ends a capture as Ctrl-C does; threads a ``--model`` leaves running do not keep the
command alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tracing
from app.cli import main

ROOT = Path(__file__).resolve().parents[1]

MODELS = """
import sys, threading, time
import torch

class Custom(BaseException):
    pass

class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")

class Net(torch.nn.Module):
    how = None
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
    def forward(self, x):
        x = self.a(x)
        if self.how == "exit":
            sys.exit(3)
        if self.how == "base":
            raise Custom("custom stop")
        if self.how == "unprintable":
            raise Unprintable()
        if self.how == "slow":
            while True:
                x = torch.tanh(self.b(x))
                time.sleep(0.01)
        return self.b(x)

def exiting():
    net = Net(); net.how = "exit"; return net

def based():
    net = Net(); net.how = "base"; return net

def unprintable():
    net = Net(); net.how = "unprintable"; return net

def slow():
    net = Net(); net.how = "slow"; return net

def threaded():
    threading.Thread(target=time.sleep, args=(600,), name="stray").start()
    return Net()
"""


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "faulty.py"
    path.write_text(MODELS)
    return path


def _argv(models: Path, name: str, out: Path) -> list[str]:
    return ["trace", "--model", f"{models}:{name}", "--input-shape", "2,4", "--input-dtype",
            "float", "--capture", "values", "-o", str(out), "--quiet"]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("exiting", "SystemExit: 3"),
        ("based", "Custom: custom stop"),
        ("unprintable", "Unprintable: <Unprintable: its message cannot be shown>"),
    ],
)
def test_a_forward_that_exits_or_raises_oddly_keeps_the_partial_trace(
    models, tmp_path, capsys, name, words
):
    out = tmp_path / f"{name}.sft"
    assert main(_argv(models, name, out)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0], err
    partial = tracing.load(out)
    assert partial.error and words in partial.error
    assert any(s.module == "a" for s in partial.steps)  # what ran before is there


def _run(argv: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen")
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", *argv],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def _wait_for_steps(out: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the streamed file (a hidden partial beside ``out``) has grown a little."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        grown = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
        if grown and grown[0].stat().st_size > 200_000:
            return
        time.sleep(0.1)
    raise AssertionError("the capture never got going")


def test_sigterm_ends_a_streaming_capture_as_ctrl_c_does(models, tmp_path):
    out = tmp_path / "slow.sft"
    proc = _run(_argv(models, "slow", out))
    _wait_for_steps(out, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "partial trace was saved" in err and "Traceback" not in err
    partial = tracing.load(out)
    assert "interrupted" in (partial.error or "")
    assert len(partial.steps) > 10
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing hidden


def test_threads_a_model_leaves_running_do_not_keep_the_command_alive(models, tmp_path):
    out = tmp_path / "threaded.sft"
    proc = _run(_argv(models, "threaded", out))
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "not waiting for 1 thread" in err
    assert len(tracing.load(out).steps) > 2
