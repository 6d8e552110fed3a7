"""Opening a trace takes memory linear in its steps, and little per step (issue 26).

Measured with ``tracemalloc`` in this process (no timing: machines are noisy): traces of
N and 2N steps are saved and loaded, and the further N steps must cost what the first N
did, at the peak of loading and in what the loaded trace holds, each within a bound per
step. The bounds are about 1.4 times what loading takes now (Python 3.11: a step with
its tensor record peaks at about 1,650 bytes while the manifest is decoded and holds
about 880 after) and below what it took before (2,950 and 1,790: every record with its
own ``__dict__`` and its own copy of each repeated string, beside the whole JSON), so
that coming back fails here. ``benchmarks/bench_report_memory.py`` measures the same at
the sizes of the issue, in whole processes.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import tracing
from tracing.file import saving
from tracing.record import ModuleInfo, SourceLocation, Step, TensorRecord, Trace

PEAK_PER_STEP = 2_400
"""Bytes loading may allocate at its peak per step (with its tensor record)."""

HELD_PER_STEP = 1_300  # was 1,200 before each tensor record kept its axes' proofs (why)
"""Bytes a loaded trace may hold per step (with its tensor record)."""

OPS = ("linear", "view", "transpose", "matmul", "softmax", "matmul", "add", "layer_norm")


def long_trace(n_blocks: int) -> Trace:
    """A trace of ``n_blocks`` module calls (four modules in turn) of ``len(OPS)`` ops
    each, inside one root call: shapes and names repeat, as in a long real trace."""
    modules = {"": ModuleInfo("", "Net", None, tuple(f"blocks.{k}" for k in range(4)), 0, 64)}
    for k in range(4):
        modules[f"blocks.{k}"] = ModuleInfo(f"blocks.{k}", "Block", "", (), 16, 16)
    sources = [
        SourceLocation("/src/model.py", 10 + i, f"x = {op}(x)", "forward")
        for i, op in enumerate(OPS)
    ]
    n_steps = 1 + n_blocks * (1 + len(OPS))
    steps = [Step(0, "module", "", "Net", None, (0,), (), ("x",), (), 0, None, n_steps - 1)]
    tensors = [TensorRecord(0, (1, 8, 16), "float32", dims=("B", "T", "C"), role="input")]
    for b in range(n_blocks):
        block = len(steps)
        path = f"blocks.{b % 4}"
        steps.append(
            Step(block, "module", path, "Block", None, (len(tensors) - 1,), (), ("x",), (),
                 1, 0, block + len(OPS), b // 4)
        )  # fmt: skip
        for i, op in enumerate(OPS):
            tid = len(tensors)
            tensors.append(
                TensorRecord(tid, (1, 8, 16), "float32", dims=("B", "T", "C"), producer=len(steps))
            )
            steps.append(
                Step(len(steps), "op", path, op, sources[i], (tid - 1,), (tid,), ("self",),
                     ("output",), 2, block)
            )  # fmt: skip
    return Trace(steps=steps, modules=modules, tensors=tensors, meta={"capture": "shapes"})


def load_allocations(path: Path) -> tuple[int, int]:
    """(peak, held): bytes allocated at the peak of ``tracing.load(path)``, and held by
    the trace it returns."""
    gc.collect()
    tracemalloc.start()
    try:
        trace = tracing.load(path)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    trace.values.close()
    return peak, held


@pytest.mark.skipif(tracemalloc.is_tracing(), reason="tracemalloc is already in use")
def test_loading_takes_memory_linear_in_the_steps(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(saving, "graph_data", lambda trace: None)  # the file without its graph
    paths = {}
    for n in (10, 300, 600):  # blocks: a warm-up, then about 2,700 and 5,400 steps
        paths[n] = tmp_path / f"long{n}.sft"
        long_trace(n).save(paths[n])
    load_allocations(paths[10])  # the first load imports what loading needs
    (peak1, held1), (peak2, held2) = load_allocations(paths[300]), load_allocations(paths[600])
    steps1, steps2 = (1 + n * (1 + len(OPS)) for n in (300, 600))

    for name, one, two, bound in (
        ("peak", peak1, peak2, PEAK_PER_STEP),
        ("held", held1, held2, HELD_PER_STEP),
    ):
        average = one / steps1
        further = (two - one) / (steps2 - steps1)
        # the further steps cost what the first ones did (a cost growing with the trace,
        # quadratic or worse, would make them dearer), and each stays within its bound
        assert 0.75 < further / average < 1.33, (name, one, two)
        assert further < bound, f"{name}: {further:.0f} bytes per step, more than {bound}"


def test_a_report_of_a_shapes_trace_imports_no_torch(tmp_path: Path):
    """Importing torch is most of what a report's process costs beyond its trace (over
    200 MB and 2 s): a trace file's manifest and records are read, and reported in every
    format, without it (the command line's report included)."""
    path = tmp_path / "t.sft"
    long_trace(3).save(path)
    out = str(tmp_path / "r.")
    code = (
        "import sys\n"
        "from app.cli import main\n"
        "for fmt in ('md', 'csv', 'json', 'html'):\n"
        f"    main(['report', {str(path)!r}, '--format', fmt, '-o', {out!r} + fmt])\n"
        "print('torch' in sys.modules, 'networkx' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert done.stdout.split() == ["False", "False"], done.stdout + done.stderr
