"""Faults end in one ``error:`` line and a usable partial trace: a forward that calls
``sys.exit``, raises a ``BaseException`` or an exception whose ``__str__`` raises; SIGTERM
ends a capture as Ctrl-C does; threads a ``--model`` leaves running do not keep the
command alive."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tracing
from app.cli import main
from tracing.file.writer import HEADER_RESERVE

ROOT = Path(__file__).resolve().parents[3]

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

def wide():
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(40)])

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
    """Until the streamed file (``NAME.PID-TID.partial`` beside ``out``) holds values: it
    grows past its header's reserve (the start of which is written when it opens)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        grown = [
            p
            for p in out.parent.iterdir()
            if p.name.startswith(f"{out.name}.") and p.name.endswith(".partial")
        ]
        if grown and grown[0].stat().st_size > HEADER_RESERVE + 4_000:
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


def test_a_file_size_limit_while_streaming_is_named_and_the_partial_trace_kept(models, tmp_path):
    out = tmp_path / "wide.sft"
    argv = _argv(models, "wide", out)
    argv[argv.index("2,4")] = "64,256"

    def limit() -> None:  # RLIMIT_FSIZE: the write fails with EFBIG (SIGXFSZ is ignored)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3_000_000, 3_000_000))

    proc = _run(argv, preexec_fn=limit)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "File too large" in lines[0] and "truncate of closed file" not in lines[0]
    partial = tracing.load(out)
    assert "File too large" in partial.error
    kept = [r for r in partial.tensors if r.value_key is not None]
    assert kept and all(partial.value(r.id) is not None for r in kept)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_api_raises_trace_file_error_with_the_partial_trace(tmp_path):
    code = f"""
import resource, torch, tracing
from tracing.errors import TraceFileError
resource.setrlimit(resource.RLIMIT_FSIZE, (2_200_000, 2_200_000))
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(40)])
try:
    tracing.trace(model, torch.randn(64, 256), capture="values", out={str(tmp_path / "api.sft")!r})
except TraceFileError as e:
    print("partial", len(e.trace.steps), e)
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("partial") and "File too large" in done.stdout
    assert len(tracing.load(tmp_path / "api.sft").steps) >= 1
