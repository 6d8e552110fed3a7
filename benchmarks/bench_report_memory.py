"""Peak memory and time of ``report --format json`` and ``tracing.load`` on a long trace.

    python benchmarks/bench_report_memory.py            # 100,000 steps (issue 26's case)
    python benchmarks/bench_report_memory.py --steps 20000

Targets (issue 26): the 100,000-step JSON report within 400 MB, a load within 600 MB and
5 s. Each measurement runs in a fresh process; its peak is that process's max RSS.
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
REPORT = "from app.cli import main; main(['report', {p!r}, '--format', 'json', '-o', {o!r}])"
LOAD = "import tracing; t = tracing.load({p!r}); print(len(t.steps))"
PEAK = (
    "\nimport resource; print('peak_mb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
)


def run(code: str, *args: str) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code + PEAK, *args], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    seconds = time.perf_counter() - start
    peak = float(done.stdout.split("peak_mb")[-1])
    return peak, seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "long.sft")
        run(MAKE.format(n=args.steps - 1), trace)
        size = os.path.getsize(trace) / 1e6
        base, _ = run("import tracing")
        peak, secs = run(LOAD.format(p=trace))
        print(f"trace: {args.steps:,} steps, {size:.1f} MB; python + import tracing {base:.0f} MB")
        print(f"load:          peak {peak:.0f} MB, {secs:.1f} s (process incl. imports)")
        peak, secs = run(REPORT.format(p=trace, o=os.path.join(tmp, "r.json")))
        print(f"report json:   peak {peak:.0f} MB, {secs:.1f} s")


if __name__ == "__main__":
    main()
