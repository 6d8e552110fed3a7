"""A traced training step against the plain one, and a watched loop against a plain loop.

    .venv/bin/python benchmarks/bench_training_step.py                     # gpt2-small, 256 tokens
    .venv/bin/python benchmarks/bench_training_step.py --preset demo --tokens 64 --rounds 20
    .venv/bin/python benchmarks/bench_training_step.py --memory-only --threads 1   # peak RSS

The protocol and the targets are those of ``scratchformer bench`` (its training section,
``app/commands/bench_training.py``): interleaved rounds, median of per-round ratios.
Then the peak resident set of a traced step against the plain one, each in its own
process (``--no-memory`` to skip).
"""

from __future__ import annotations

import argparse
import time

import torch

from app.commands.bench_training import report, report_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS part")
    parser.add_argument("--memory-only", action="store_true", help="only the peak-RSS part")
    parser.add_argument("--tmp", help="folder for the streamed trace file (default: system)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.manual_seed(0)
    config = ModelConfig.preset(args.preset)
    model = DecoderOnlyTransformer(config)
    tokens = min(args.tokens, config.block_size)
    ids = torch.randint(0, config.vocab_size, (1, tokens))
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    threads = torch.get_num_threads()
    print(f"{args.preset}, {tokens} tokens, {threads} threads, {args.rounds} rounds")
    if not args.memory_only:
        report(print, model, ids, f"{args.preset} preset", args.rounds, 1, clock)
    if not args.no_memory:
        del model
        report_memory(print, args.preset, tokens, threads, args.tmp)


if __name__ == "__main__":
    main()
