"""After SIGKILL, what was streamed can be found and opened (issue 26, item 2): a streamed
capture keeps a journal beside its visible partial file, ``tracing.load`` opens the
leftover as a partial trace up to the last checkpoint, and ``scratchformer recover``
writes it out as an ordinary file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import tracing
from app.cli import main
from tracing.file import journal

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[3]

# the same model, input and capture in the child and here
SETUP = """
import os, signal, sys, time
import torch
import tracing
from tracing.file import journal
from scratchformer import DecoderOnlyTransformer, ModelConfig

torch.set_num_threads(1)
torch.manual_seed(0)
config = ModelConfig(vocab_size=50, block_size=16, d_model=32, n_heads=4, n_layers=3, d_ff=64)
model = DecoderOnlyTransformer(config).eval()
ids = torch.randint(0, 50, (1, 9))
"""

EVERY_MODULE = """
journal.JOURNAL_SECONDS = journal.JOURNAL_COST_RATIO = 0  # a checkpoint at every module end
"""

KILL_AFTER_BLOCK = """
def kill(module, args, output):
    os.kill(os.getpid(), signal.SIGKILL)
model.blocks[1].register_forward_hook(kill)
tracing.trace(model, ids, capture="values", value_cap=None, out=sys.argv[1])
"""

KILLED_FROM_OUTSIDE = """
def slow(module, args, output):
    print("block", flush=True)
    time.sleep(0.2 if module is not model.blocks[2] else 60)
for block in model.blocks:
    block.register_forward_hook(slow)
tracing.trace(model, ids, capture="values", value_cap=None, out=sys.argv[1])
"""


def _reference() -> tracing.Trace:
    """The unkilled trace of the same run."""
    scope: dict = {}
    exec(SETUP, scope)
    return tracing.trace(scope["model"], scope["ids"], capture="values", value_cap=None)


def _child(code: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", SETUP + EVERY_MODULE + code, str(out)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _same_prefix(recovered: tracing.Trace, full: tracing.Trace) -> None:
    """Steps, records and values of ``recovered`` equal ``full``'s up to where it stops;
    the module calls still open there end at its last step."""
    n = len(recovered.steps)
    assert 0 < n < len(full.steps)
    for a, b in zip(recovered.steps[1:], full.steps[1:n]):
        if b.kind == "module" and b.end >= n:  # open when the checkpoint was taken
            assert a.end == n - 1 and a.outputs == ()
            a, b = replace(a, end=b.end, outputs=b.outputs, output_names=b.output_names), b
        assert a == b
    assert recovered.steps[0].end == n - 1  # the root call, open
    assert len(recovered.tensors) <= len(full.tensors)
    kept = 0
    for ra in recovered.tensors:
        rb = full.tensors[ra.id]
        assert (ra.shape, ra.dtype, ra.stats, ra.role) == (rb.shape, rb.dtype, rb.stats, rb.role)
        va, vb = recovered.value(ra.id), full.value(rb.id)
        assert (va is None) == (vb is None), ra
        if va is not None:
            assert torch.equal(va, vb), ra
            kept += 1
    assert kept > 10


def _leftover(folder: Path) -> Path:
    names = sorted(os.listdir(folder))
    assert [n for n in names if n.startswith(".")] == []  # nothing hidden
    (partial,) = [folder / n for n in names if n.endswith(".partial")]
    assert journal.journal_of(partial).exists()
    return partial


def test_a_capture_killed_mid_stream_opens_up_to_its_last_checkpoint(tmp_path):
    out = tmp_path / "t.sft"
    child = _child(KILL_AFTER_BLOCK, out)
    child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL
    partial = _leftover(tmp_path)
    recovered = tracing.load(partial)
    assert not recovered.complete and "last checkpoint" in recovered.error
    full = _reference()
    _same_prefix(recovered, full)
    # the checkpoint was the last module call's end before the kill: block 1's inside
    assert recovered.steps[-1].module.startswith("blocks.1")
    # the journal's own path opens it too; the final name says where the leftover is
    assert len(tracing.load(journal.journal_of(partial)).steps) == len(recovered.steps)
    with pytest.raises(tracing.TraceFileError, match=r"left t\.sft\.\d+-\d+\.partial"):
        tracing.load(out)
    recovered.values.close()


def test_sigkill_from_outside_then_recover_writes_an_ordinary_file(tmp_path, capsys):
    out = tmp_path / "t.sft"
    child = _child(KILLED_FROM_OUTSIDE, out)
    seen = 0
    while seen < 3:  # the third block is running (and sleeping): kill it
        assert child.stdout.readline() == "block\n"
        seen += 1
    time.sleep(0.1)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    partial = _leftover(tmp_path)
    assert main(["recover", str(partial)]) == 0
    assert "wrote" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["t.sft"]  # the leftover is gone
    recovered = tracing.load(out)
    _same_prefix(recovered, _reference())
    assert recovered.steps[-1].module.startswith("blocks.2")
    recovered.values.close()


def test_recover_refuses_a_capture_still_running_and_a_name_taken(tmp_path):
    path = tmp_path / "t.sft"
    from tracing.file.writer import TraceWriter

    writer = TraceWriter(path)
    writer.add("t0", torch.arange(10.0))
    partial = writer._tmp
    assert not partial.name.startswith(".")
    with pytest.raises(tracing.TraceFileError, match=r"before its first checkpoint|no checkpoint"):
        tracing.load(partial)
    with pytest.raises(tracing.TraceFileError, match="still writing"):
        journal.recover(partial)
    writer.abort()
    assert os.listdir(tmp_path) == []


def test_a_finished_capture_leaves_no_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "JOURNAL_SECONDS", 0.0)
    monkeypatch.setattr(journal, "JOURNAL_COST_RATIO", 0)
    scope: dict = {}
    exec(SETUP, scope)
    trace = tracing.trace(scope["model"], scope["ids"], capture="values", out=tmp_path / "t.sft")
    assert sorted(os.listdir(tmp_path)) == ["t.sft"]
    assert trace.complete
    trace.values.close()
