"""Two versions of the tracer on the demo model, side by side in one process.

    git show b18c47e:tracing/capture.py > /tmp/old_capture.py
    .venv/bin/python benchmarks/bench_versions.py /tmp/old_capture.py --rounds 250

Loads the given ``capture.py`` as a module of its own next to the installed
``tracing.capture`` and times the plain forward, the old tracer and the current one in
turn, each after an untimed full garbage collection (the protocol of ``scratchformer
bench``). Prints each median and its ratio to the plain forward. Machine noise moves all
three alike, so the old/new comparison holds even when the absolute figures wander.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import time

import torch

import tracing.capture as current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", help="path of another version of tracing/capture.py")
    parser.add_argument("--rounds", type=int, default=250)
    parser.add_argument("--capture", default="shapes", choices=["shapes", "stats", "values"])
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("capture_under_test", args.old)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)

    from scratchformer import DEMO_PROMPT, ByteTokenizer, demo_model

    model = demo_model().eval()
    ids = torch.tensor([ByteTokenizer().encode(DEMO_PROMPT)])
    runs = {
        "plain": lambda: model(ids),
        "old": lambda: old.trace(model, ids, capture=args.capture),
        "current": lambda: current.trace(model, ids, capture=args.capture),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for round_ in range(3 + args.rounds):
            for name, run in runs.items():
                gc.collect()
                start = time.perf_counter()
                run()
                if round_ >= 3:
                    times[name].append(time.perf_counter() - start)
    plain = statistics.median(times["plain"])
    print(f"demo model, capture={args.capture}, {args.rounds} rounds (medians)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:8s} {median * 1e3:6.2f} ms  {median / plain:5.2f}x")


if __name__ == "__main__":
    main()
