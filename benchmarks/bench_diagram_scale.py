"""Opening, stepping and expanding in the app on three 50,000-step traces.

The shapes that used to make the diagram slow (issue 14), each about 50,000 steps:

- ``loop``: a small cell called 8,000 times in a Python loop at the top level;
- ``stack``: a 1,000-layer narrow decoder stack (attention with split heads, an MLP);
- ``ops``: one module whose forward runs 50,000 tensor ops in a loop, no submodules.

For each: **open** (``MainWindow.open_path`` until pending events are processed), **step**
(``go_to`` for 400 consecutive steps from the middle plus 200 random ones, events processed),
**expand** (double-click equivalent on a collapsed box, and on a folded run). Targets: open
< 2 s, step median < 16 ms, worst < 100 ms, expand < 200 ms. Ratios printed against them.

The trace is written by this process and opened by a fresh one, as a user opens a file in
the app (a process that has just traced a 50,000-step model has a fragmented heap and
caches that make the same open 20-40 % slower; ``--in-process`` measures it there).

    QT_QPA_PLATFORM=offscreen python benchmarks/bench_diagram_scale.py [--shape loop] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import torch
from torch import nn

import tracing

# --------------------------------------------------------------------------- the shapes


class Cell(nn.Module):
    """Six steps a call: the cell, its Linear, linear, tanh, mul, add."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, h):
        return torch.tanh(self.lin(h)) * 0.5 + h


class Loop(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.cell = Cell()
        self.n = n

    def forward(self, x):
        h = x
        for _ in range(self.n):
            h = self.cell(h)
        return h


class Attention(nn.Module):
    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)


class Block(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = Attention(d)
        self.norm2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(torch.relu(self.up(self.norm2(x))))


class Stack(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Ops(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x):
        for _ in range(self.n):
            x = x * 1.0001 + 0.0001
        return x


def build(shape: str, scale: float = 1.0) -> nn.Module:
    if shape == "loop":
        return Loop(int(8000 * scale))
    if shape == "stack":
        return Stack(int(1000 * scale))
    return Ops(int(25000 * scale))


SHAPES = ("loop", "stack", "ops")

# --------------------------------------------------------------------------- measuring


def measure(shape: str, scale: float, tmp: Path, in_process: bool = False) -> dict[str, float]:
    """Trace ``shape`` to a file, then open, step and expand it in the app (in a fresh
    process unless ``in_process``)."""
    torch.manual_seed(0)
    path = tmp / f"{shape}.sft"
    t0 = time.perf_counter()
    tracing.trace(build(shape, scale), torch.randn(1, 4, 8)).save(path)
    trace_s = time.perf_counter() - t0
    if in_process:
        result = measure_app(path, tmp)
    else:
        done = subprocess.run(
            [sys.executable, __file__, "--open", str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"the app measurement failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"trace_s": trace_s, **result}


def measure_app(path: Path, tmp: Path) -> dict[str, float]:
    """Open ``path`` in a main window; time the open, steps and expands."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.windows.main_window import MainWindow

    app = QApplication.instance()
    settings = QSettings(str(tmp / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    window.resize(1400, 900)
    window.show()
    app.processEvents()
    t0, c0 = time.perf_counter(), time.process_time()
    trace = tracing.load(path)
    load_s, load_cpu = time.perf_counter() - t0, time.process_time() - c0
    del trace
    t0, c0 = time.perf_counter(), time.process_time()
    assert window.open_path(path), "the trace did not open"
    app.processEvents()
    open_s, open_cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(window.trace.steps)

    def timed(index: int) -> float:
        t = time.perf_counter()
        window.go_to(index)
        app.processEvents()
        return time.perf_counter() - t

    mid = n // 2
    steps = [timed(i) for i in range(mid, min(n, mid + 400))]
    rng = random.Random(0)
    steps += [timed(rng.randrange(n)) for _ in range(200)]

    view = window.diagram
    expands = []
    for key in list(view.expandable_keys())[:5]:
        t = time.perf_counter()
        view.toggle(key)
        app.processEvents()
        expands.append(time.perf_counter() - t)
        view.toggle(key)
        app.processEvents()
    window.close()
    return {
        "steps": n,
        "open_s": open_s,
        "open_cpu": open_cpu,
        "load_s": load_s,
        "load_cpu": load_cpu,
        "step_median_ms": statistics.median(steps) * 1000,
        "step_worst_ms": max(steps) * 1000,
        "expand_worst_ms": max(expands, default=0.0) * 1000,
        "boxes": len(view.items_by_key),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, action="append")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 50,000 steps")
    parser.add_argument(
        "--in-process", action="store_true", help="open in the process that traced (not fresh)"
    )
    parser.add_argument("--open", metavar="FILE", help=argparse.SUPPRESS)  # the fresh process
    args = parser.parse_args()
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.theme import apply_theme

    apply_theme(app)
    torch.set_num_threads(1)
    if args.open:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure_app(Path(args.open), Path(tmp))))
        return 0
    print(f"{'shape':<6} {'steps':>6} {'measure':<12} {'value':>10} {'target':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shape or SHAPES:
            r = measure(shape, args.scale, Path(tmp), args.in_process)
            rows = [
                ("open", r["open_s"] * 1000, 2000.0),
                ("step median", r["step_median_ms"], 16.0),
                ("step worst", r["step_worst_ms"], 100.0),
                ("expand worst", r["expand_worst_ms"], 200.0),
            ]
            for name, value, target in rows:
                print(f"{shape:<6} {r['steps']:>6} {name:<12} {value:>8.1f}ms {target:>7.0f}ms "
                      f"{value / target:>6.2f}")  # fmt: skip
            print(f"{shape:<6} {r['steps']:>6} open: {r['open_cpu']:.2f} s CPU, of which reading "
                  f"the file alone {r['load_s']:.2f} s ({r['load_cpu']:.2f} s CPU)")  # fmt: skip
            print(f"{shape:<6} {r['steps']:>6} traced in {r['trace_s']:.1f} s, "
                  f"{r['boxes']} boxes drawn")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times grow "
          "with it; CPU times much less)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
