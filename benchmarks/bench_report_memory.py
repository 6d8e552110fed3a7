"""Peak memory and time of ``report`` and ``tracing.load`` on long traces.

    python benchmarks/bench_report_memory.py            # issue 26's cases
    python benchmarks/bench_report_memory.py --steps 20000 --short 10000 --entries 50000

Cases: a trace of ``--steps`` steps (100,000) loaded and reported as JSON; reports (md,
csv, json) of a ``--short`` trace (60,000 steps: 1.3 million cells of CSV) and of a
``values`` trace of one 1000×1000 tensor through 20 ops (20 million values); a file of
``--entries`` (249,000) empty entries (58 MB of header) loaded, and loaded with every
value read and held (``dict(trace.values)``). Targets (issues 26 and 32): the
100,000-step JSON report within 400 MB, the 249,000 entries (with every value too)
within 600 MB and 5 s, the reports within 5 s. Each measurement runs in a fresh
process; its peak is that process's max RSS and its time includes starting Python and
the imports. Each line says the peak beside the file's size (their ratio includes the
fixed cost of Python and the imports, about 35 MB: high for small files), the wall
time, the CPU time (user + system: on a shared, loaded machine the wall time is
mostly waiting for a core; the CPU time is what the code costs) and marks each target
``pass`` or ``MISS`` (time targets by the wall time).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAKE = """
import sys, torch, tracing
class Loop(torch.nn.Module):
    def forward(self, x):
        for _ in range({n}):
            x = x + 1
        return x
tracing.trace(Loop(), torch.zeros(2), capture="shapes", out=sys.argv[1])
"""
# a small trace, and beside its values 249,000 empty entries with long names
ENTRIES = """
import sys, torch, tracing
from tracing.file.saving import header_metadata, write_safetensors
class Loop(torch.nn.Module):
    def forward(self, x):
        for _ in range(100):
            x = x + 1
        return x
trace = tracing.trace(Loop(), torch.zeros(2), capture="values")
metadata, extra = header_metadata(trace, 2**20)
tensors = dict(trace.values)
empty = torch.empty(0, dtype=torch.uint8)
for i in range({n}):
    tensors[f"empty{{i:06d}}_" + "x" * 64] = empty
write_safetensors(tensors, sys.argv[1], metadata)
"""
# one tensor of a million cells through 20 ops, every value kept (issue 26's 1M-cell case)
CELLS = """
import sys, torch, tracing
class Chain(torch.nn.Module):
    def forward(self, x):
        for _ in range(20):
            x = torch.tanh(x)
        return x
tracing.trace(Chain(), torch.randn(1000, 1000), capture="values", value_cap=None, out=sys.argv[1])
"""
REPORT = "from app.cli import main; main(['report', {p!r}, '--format', {f!r}, '-o', {o!r}])"
LOAD = "import tracing; t = tracing.load({p!r}); print(len(t.steps))"
LOAD_ALL = "import tracing; t = tracing.load({p!r}); held = dict(t.values); print(len(held))"
PEAK = (
    "\nimport resource; r = resource.getrusage(resource.RUSAGE_SELF)"
    "\nprint('cpu_s', r.ru_utime + r.ru_stime, 'peak_mb', r.ru_maxrss / 1024)"
)


def run(code: str, *args: str) -> tuple[float, float, float]:
    """(peak MB, wall seconds, CPU seconds) of ``code`` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code + PEAK, *args], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    seconds = time.perf_counter() - start
    words = done.stdout.split()
    cpu = float(words[words.index("cpu_s") + 1])
    peak = float(words[words.index("peak_mb") + 1])
    return peak, seconds, cpu


def line(what: str, peak: float, secs: float, cpu: float, size: float, mb: float | None = None,
         seconds: float | None = None) -> str:  # fmt: skip
    """One case: its peak beside the file's size, its times, and each target it has."""
    text = (
        f"  {what:<13} peak {peak:4.0f} MB ({peak / size:4.1f}x the file), {secs:4.1f} s "
        f"(cpu {cpu:4.1f} s)"
    )
    targets = []
    if mb is not None:
        targets.append(f"<= {mb:.0f} MB {'pass' if peak <= mb else 'MISS'}")
    if seconds is not None:
        targets.append(f"<= {seconds:.0f} s {'pass' if secs <= seconds else 'MISS'}")
    return text + (f"   target {', '.join(targets)}" if targets else "")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--short", type=int, default=60_000)
    p.add_argument("--entries", type=int, default=249_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "long.sft")
        run(MAKE.format(n=args.steps - 1), trace)
        size = os.path.getsize(trace) / 1e6
        base, secs, cpu = run("import tracing")
        print(f"python + import tracing: {base:.0f} MB, {secs:.1f} s (cpu {cpu:.1f} s)")
        print(f"trace: {args.steps:,} steps, file {size:.1f} MB")
        print(line("load:", *run(LOAD.format(p=trace)), size))
        report = REPORT.format(p=trace, f="json", o=os.path.join(tmp, "r.json"))
        print(line("report json:", *run(report), size, mb=400))
        for name, make, what in (
            ("short.sft", MAKE.format(n=args.short - 1), f"trace: {args.short:,} steps"),
            ("cells.sft", CELLS, "trace: a 1000x1000 tensor through 20 ops, values"),
        ):
            path = os.path.join(tmp, name)
            run(make, path)
            size = os.path.getsize(path) / 1e6
            print(f"{what}, file {size:.1f} MB")
            for fmt in ("md", "csv", "json"):
                report = REPORT.format(p=path, f=fmt, o=os.path.join(tmp, f"r.{fmt}"))
                print(line(f"report {fmt}:", *run(report), size, seconds=5))
        entries = os.path.join(tmp, "entries.sft")
        run(ENTRIES.format(n=args.entries), entries)
        size = os.path.getsize(entries) / 1e6
        print(f"file: {args.entries:,} empty entries, file {size:.1f} MB")
        print(line("load:", *run(LOAD.format(p=entries)), size, mb=600, seconds=5))
        peak, secs, cpu = run(LOAD_ALL.format(p=entries))
        print(line("every value:", peak, secs, cpu, size, mb=600, seconds=5))


if __name__ == "__main__":
    main()
