"""How fast the inspector follows the step: ``Inspector.set_step`` over every step of a trace.

    .venv/bin/python benchmarks/bench_inspector.py                   # gpt2-small, 256 tokens
    .venv/bin/python benchmarks/bench_inspector.py --preset demo --tokens 24
    .venv/bin/python benchmarks/bench_inspector.py --trace saved.safetensors

Builds the model from its preset with random weights (nothing is downloaded), traces one
forward pass at capture ``values`` (or opens ``--trace``), then steps through every step
twice, once with the Tensors tab on show and once with the Attention tab, timing

- ``set_step`` alone (table, heatmap pixels, attention layer), and
- ``set_step`` plus the event-loop turn that paints what changed (``processEvents``),
  which is what a person waits for.

Targets (issue 4): median < 16 ms, worst < 100 ms. Runs offscreen unless a display is set.
On a shared machine wall time includes waiting for a core; the CPU time line (this
process's CPU seconds, torch threads included) shows the work itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--trace", help="open this trace file instead of tracing a model")
    parser.add_argument("--width", type=int, default=620)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args()

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import torch
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication

    import tracing
    from app.panels.inspector import Inspector

    app = QApplication.instance() or QApplication([])

    # ---- the trace
    start = time.perf_counter()
    if args.trace:
        trace = tracing.load(args.trace)
        what = args.trace
    else:
        from scratchformer import ByteTokenizer, DecoderOnlyTransformer, ModelConfig

        torch.manual_seed(0)
        model = DecoderOnlyTransformer(ModelConfig.preset(args.preset)).eval()
        text = ("The quick brown fox jumps over the lazy dog. " * 20)[: args.tokens]
        ids = ByteTokenizer().encode(text)
        trace = tracing.trace(
            model, torch.tensor([ids]), capture="values", meta={"tokens": ids, "text": text}
        )
        what = f"{args.preset}, {len(ids)} tokens, capture values"
    n_values = sum(1 for r in trace.tensors if r.value_key is not None)
    print(f"trace: {what}: {len(trace)} steps, {len(trace.tensors)} tensors "
          f"({n_values} with values) in {time.perf_counter() - start:.1f} s")  # fmt: skip

    # ---- the widget
    inspector = Inspector()
    inspector.resize(args.width, args.height)
    inspector.show()
    app.processEvents()
    start = time.perf_counter()
    inspector.set_trace(trace)
    inspector.repaint()
    print(f"set_trace + first paint: {(time.perf_counter() - start) * 1000:.0f} ms")

    def run(tab: int) -> tuple[list[float], list[float], list[float]]:
        inspector.tabs.setCurrentIndex(tab)
        app.processEvents()
        alone, painted, cpu = [], [], []
        for index in range(len(trace)):
            c0, t0 = time.process_time(), time.perf_counter()
            inspector.set_step(index)
            t1 = time.perf_counter()
            app.processEvents()  # the paint of what changed, as one event-loop turn
            t2, c2 = time.perf_counter(), time.process_time()
            alone.append((t1 - t0) * 1000)
            painted.append((t2 - t0) * 1000)
            cpu.append((c2 - c0) * 1000)
        return alone, painted, cpu

    def report(name: str, times: list[float]) -> None:
        worst = max(range(len(times)), key=times.__getitem__)
        step = trace.steps[worst]
        print(f"  {name:<24} median {statistics.median(times):6.2f} ms   "
              f"p95 {sorted(times)[int(0.95 * len(times))]:6.2f} ms   "
              f"worst {times[worst]:6.2f} ms (step {worst}: {step.label})")  # fmt: skip

    for tab, name in ((Inspector.TENSORS_TAB, "Tensors"), (Inspector.ATTENTION_TAB, "Attention")):
        alone, painted, cpu = run(tab)
        print(f"{name} tab, {len(trace)} steps:")
        report("set_step", alone)
        report("set_step + paint", painted)
        report("  (CPU time of that)", cpu)

    inspector.close()
    inspector.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
