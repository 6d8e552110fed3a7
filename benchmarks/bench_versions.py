"""Two versions of the tracer on one model, side by side in one process.

    git show b18c47e:tracing/capture.py > /tmp/old_capture.py
    .venv/bin/python benchmarks/bench_versions.py /tmp/old_capture.py --rounds 250
    .venv/bin/python benchmarks/bench_versions.py /tmp/old_capture.py --preset gpt2-small \\
        --tokens 256 --rounds 15 --threads 2

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
        f"{torch.get_num_threads()} threads, {args.rounds} rounds (medians)"
    )
    print_medians(interleaved_medians(runs, args.rounds))


if __name__ == "__main__":
    main()
