"""What find costs: build the index of a 50,000-step trace once, then answer queries.

    .venv/bin/python benchmarks/bench_find.py                 # 8,334 loop calls: 50,005 steps
    .venv/bin/python benchmarks/bench_find.py --calls 20000 --rounds 20

The trace is ``bench_diagram_scale.Loop`` (a Linear cell called in a Python loop: six steps
a call) at capture ``stats``. Prints the time to build :class:`tracing.analysis.find.FindIndex`
(median of ``--builds``) and, for each query, the median time of ``search`` plus walking
its steps (what F3 needs), over ``--rounds``. Target: every query under 100 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_diagram_scale import Loop  # this folder, run as a script

import tracing
from tracing.analysis.find import FindIndex

QUERIES = ("tanh", "cell.lin", "#412", "(B, T, ?)", "bench_diagram_scale.py:52", "h", "nan", "zzz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8334)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--builds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    trace = tracing.trace(Loop(args.calls), torch.randn(1, 4, 8), capture="stats")
    print(f"traced {len(trace.steps):,} steps in {time.perf_counter() - t0:.2f} s")
    builds = []
    for _ in range(args.builds):
        t0 = time.perf_counter()
        index = FindIndex(trace)
        builds.append(time.perf_counter() - t0)
    print(f"build FindIndex: {statistics.median(builds) * 1000:.0f} ms (median of {args.builds})")
    worst = 0.0
    for query in QUERIES:
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            result = index.search(query)
            n = len(result.steps)
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1000
        worst = max(worst, ms)
        print(f"  {query!r:32} {len(result.entries):3} entries {n:7,} steps  {ms:6.2f} ms")
    print(f"slowest query {worst:.1f} ms: {'OK' if worst < 100 else 'OVER'} (target < 100 ms)")


if __name__ == "__main__":
    main()
