"""Two versions of the tracer on one model, side by side in one process.

    git show 39db2f2:tracing/capture.py > tracing/_capture_before.py
    .venv/bin/python benchmarks/bench_versions.py tracing/_capture_before.py --rounds 250
    .venv/bin/python benchmarks/bench_versions.py tracing/_capture_before.py \\
        --preset gpt2-small --tokens 256 --rounds 15 --threads 1 --clock cpu

Put the old copy inside ``tracing/`` (say ``tracing/_capture_before.py``, not committed):
the source-line lookup skips frames of files in ``tracing/``, and a copy elsewhere would
walk (and pay for) frames the real tracer skips. On a shared machine, ``--clock cpu``
counts this process's CPU time only.

Loads the given ``capture.py`` as a module of its own next to the installed
``tracing.capture`` and times the plain forward, the old tracer and the current one in
turn, each after an untimed full garbage collection (the protocol of ``scratchformer
bench``). Prints each median and its ratio to the plain forward. Machine noise moves all
three alike, so the old/new comparison holds even when the absolute figures wander.
The model is the bundled demo model, or a preset (``--preset gpt2-small``) with random
weights.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import torch
from bench_floor import interleaved_medians, print_medians  # this folder, run as a script

import tracing.capture as current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", help="path of another version of tracing/capture.py")
    parser.add_argument("--rounds", type=int, default=250)
    parser.add_argument("--capture", default="shapes", choices=["shapes", "stats", "values"])
    parser.add_argument("--preset", default="demo", help="demo (bundled weights) or a preset")
    parser.add_argument("--tokens", type=int, default=256, help="tokens for a preset")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--clock", default="wall", choices=["wall", "cpu"], help="cpu: this process's CPU time"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = importlib.util.spec_from_file_location("capture_under_test", args.old)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)

    from scratchformer import (
        DEMO_PROMPT,
        ByteTokenizer,
        DecoderOnlyTransformer,
        ModelConfig,
        demo_model,
    )

    if args.preset == "demo":
        model = demo_model().eval()
        ids = torch.tensor([ByteTokenizer().encode(DEMO_PROMPT)])
    else:
        torch.manual_seed(0)
        config = ModelConfig.preset(args.preset)
        model = DecoderOnlyTransformer(config).eval()
        tokens = min(args.tokens, config.block_size)
        ids = torch.randint(0, config.vocab_size, (1, tokens))
    runs = {
        "plain": lambda: model(ids),
        "old": lambda: old.trace(model, ids, capture=args.capture),
        "current": lambda: current.trace(model, ids, capture=args.capture),
    }
    print(
        f"{args.preset} model, {ids.shape[1]} tokens, capture={args.capture}, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds, {args.clock} clock (medians)"
    )
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    medians = interleaved_medians(runs, args.rounds, clock=clock)
    print_medians(medians)
    print(f"  current / old  {medians['current'] / medians['old']:.3f}")


if __name__ == "__main__":
    main()
