"""How responsive the desktop debugger is on a big trace.

For a gpt2-small preset (random weights) traced at 256 tokens with capture ``values``:

- **open**: from ``MainWindow.open_path`` until the window is usable (tree, diagram,
  inspector and step 0 shown, pending events processed);
- **step**: the time of each ``go_to(i)`` for every step in order, with the status text,
  diagram highlight, tree selection, source line, shape table and heatmap updated and the
  events that causes processed (which paints what changed).

Targets: open < 3 s, median step < 16 ms, worst step < 100 ms.

Wall time on a shared machine includes waiting for a core, so the CPU time of each step
(``time.process_time``: this process's CPU seconds) is printed beside it, with the load
average before and after the walk.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/app_responsiveness.py [--tokens 256]
    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/app_responsiveness.py --trace T.sft
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def make_trace(path: Path, tokens: int, preset: str) -> float:
    import torch

    import scratchformer
    import tracing

    torch.manual_seed(0)
    model = scratchformer.DecoderOnlyTransformer(scratchformer.ModelConfig.preset(preset)).eval()
    ids = torch.randint(0, 256, (1, tokens))
    start = time.perf_counter()
    trace = tracing.trace(model, ids, capture="values", meta={"tokens": ids[0].tolist()})
    trace.save(path)
    return time.perf_counter() - start


def _load() -> float:
    """The 1-minute load average (NaN where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--trace", type=Path, help="use this trace file instead of making one")
    args = parser.parse_args()

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.theme import apply_theme
    from app.windows.main_window import MainWindow

    apply_theme(app)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace or Path(tmp) / "bench.safetensors"
        if args.trace is None:
            seconds = make_trace(path, args.tokens, args.preset)
            size = path.stat().st_size / 2**20
            print(f"traced {args.preset} at {args.tokens} tokens (values) and saved "
                  f"{size:.0f} MiB in {seconds:.1f} s")  # fmt: skip
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings)
        window.show()
        app.processEvents()

        start = time.perf_counter()
        assert window.open_path(path), "the trace did not open"
        app.processEvents()
        open_s = time.perf_counter() - start
        n = len(window.trace.steps)

        def step_through() -> list[float]:
            window.go_to(0)
            app.processEvents()
            out, cpu = [], []
            for i in range(1, n):
                t0, c0 = time.perf_counter(), time.process_time()
                window.go_to(i)
                app.processEvents()
                out.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            assert window.current == n - 1
            cpu_times.append(cpu)
            return out

        cpu_times: list[list[float]] = []
        load_before = _load()

        times = step_through()
        # the same walk with the inspector standing still: what the other panes cost
        inspector_step = window.inspector.set_step
        window.inspector.set_step = lambda index: None
        others = step_through()
        window.inspector.set_step = inspector_step
        median_ms = statistics.median(times) * 1000
        worst_ms = max(times) * 1000
        p95_ms = sorted(times)[int(0.95 * (len(times) - 1))] * 1000
        slowest = max(range(len(times)), key=times.__getitem__) + 1
        window.close()

    cpu = cpu_times[0]
    cpu_median_ms, cpu_worst_ms = statistics.median(cpu) * 1000, max(cpu) * 1000
    rows = [
        ("open until usable", f"{open_s:.2f} s", "< 3 s", open_s / 3.0),
        ("median step", f"{median_ms:.1f} ms", "< 16 ms", median_ms / 16.0),
        ("95th percentile step", f"{p95_ms:.1f} ms", "", None),
        ("worst step", f"{worst_ms:.1f} ms", "< 100 ms", worst_ms / 100.0),
        ("  median CPU time", f"{cpu_median_ms:.1f} ms", "< 16 ms", cpu_median_ms / 16.0),
        ("  worst CPU time", f"{cpu_worst_ms:.1f} ms", "< 100 ms", cpu_worst_ms / 100.0),
        ("  without inspector", f"{statistics.median(others) * 1000:.1f} ms", "median", None),
        ("  without inspector", f"{max(others) * 1000:.1f} ms", "worst", None),
    ]
    print(f"\nload average {load_before:.1f} before the walk, {_load():.1f} after, on "
          f"{os.cpu_count()} cores (wall times grow with it; CPU times much less)")  # fmt: skip
    print(f"{n} steps; slowest was step {slowest + 1} ({window.trace.steps[slowest].label})")
    print(f"{'measure':<22} {'value':>10} {'target':>10} {'ratio':>7}")
    for name, value, target, ratio in rows:
        r = "" if ratio is None else f"{ratio:.2f}"
        print(f"{name:<22} {value:>10} {target:>10} {r:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
