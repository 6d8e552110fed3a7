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
import importlib.util

import torch
from bench_floor import interleaved_medians, print_medians  # this folder, run as a script

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
    print(f"demo model, capture={args.capture}, {args.rounds} rounds (medians)")
    print_medians(interleaved_medians(runs, args.rounds))


if __name__ == "__main__":
    main()
