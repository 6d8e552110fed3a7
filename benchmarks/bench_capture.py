"""Overhead of tracing.trace() against the plain forward, measured side by side.

    .venv/bin/python benchmarks/bench_capture.py                  # demo prompt; gpt2-small 256 tok
    .venv/bin/python benchmarks/bench_capture.py --model demo --repeat 21
    .venv/bin/python benchmarks/bench_capture.py --model hf-gpt2 --levels shapes

Each round runs the plain forward and every capture level once, in turn, so that load from
other processes hits all of them alike; the figure is the median over rounds of the traced
time divided by that round's plain time. Everything runs under ``torch.no_grad()`` on the
CPU, in eval mode, as ``tracing.trace`` does.

Figures measured before, quoted from the code they explain (rerun to check them):
``tracing/stats.py``: on a tensor of a few thousand elements, ``aminmax``, a sum, a dot
product and their reads cost ~14 us (50 us masked), a ``clone`` ~1.5 us, torch's
``segment_reduce`` and row-wise ``aminmax`` ~15x the NumPy segment reductions;
``tracing/record.py`` (``built``): a frozen dataclass's ``__init__`` costs ~2.5x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import tracing


def build(name: str) -> tuple[torch.nn.Module, int]:
    """(model, vocab size) for a benchmark model name. ``demo`` is the bundled demo model
    (``scratchformer.demo_model()``), run on ``DEMO_PROMPT`` as ``scratchformer bench`` does."""
    if name == "demo":
        from scratchformer import demo_model

        model = demo_model()
        return model.eval(), model.config.vocab_size
    if name in ("nano", "gpt2-small"):
        from scratchformer import DecoderOnlyTransformer, ModelConfig

        config = ModelConfig.preset(name)
        return DecoderOnlyTransformer(config).eval(), config.vocab_size
    if name == "hf-gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(attn_implementation="eager")
        return GPT2LMHeadModel(config).eval(), config.vocab_size
    raise SystemExit(f"unknown model {name!r}")


def bench(
    name: str, tokens: int, levels: list[str], repeat: int, warmup: int, clock=time.perf_counter
) -> dict:
    model, vocab = build(name)
    if name == "demo":  # the demo prompt, not random tokens (as `scratchformer bench`)
        from scratchformer import DEMO_PROMPT, ByteTokenizer

        ids = torch.tensor([ByteTokenizer().encode(DEMO_PROMPT)])
        tokens = ids.shape[1]
    else:
        block = getattr(getattr(model, "config", None), "block_size", tokens)
        tokens = min(tokens, block or tokens)
        ids = torch.randint(0, vocab, (1, tokens))
    times: dict[str, list[float]] = {"plain": []}
    times.update({level: [] for level in levels})
    extra: dict[str, str] = {}
    with torch.no_grad():
        for round_ in range(warmup + repeat):
            start = clock()
            model(ids)
            plain = clock() - start
            if round_ >= warmup:
                times["plain"].append(plain)
            for level in levels:
                start = clock()
                t = tracing.trace(model, ids, capture=level)
                elapsed = clock() - start
                if round_ >= warmup:
                    times[level].append(elapsed / plain)
                if level == "values":
                    kept = sum(v.numel() * v.element_size() for v in t.values.values())
                    extra["values"] = f"{kept / 2**20:.1f} MiB kept"
                extra.setdefault(f"{level}-steps", f"{len(t.steps)} steps")
                del t
    plain_ms = statistics.median(times["plain"]) * 1e3
    print(f"\n{name}: {tokens} tokens, plain forward median {plain_ms:.1f} ms ({repeat} rounds)")
    for level in levels:
        ratios = times[level]
        print(
            f"  {level:7s} median {statistics.median(ratios):.3f}x  "
            f"(min {min(ratios):.3f}x, max {max(ratios):.3f}x)  "
            f"{extra.get(level + '-steps', '')}  {extra.get(level, '')}"
        )
    return {level: statistics.median(times[level]) for level in levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="demo, nano, gpt2-small, hf-gpt2")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--levels", default="shapes,stats,values")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this process's CPU time (steadier on a loaded machine)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    levels = [s for s in args.levels.split(",") if s]
    for name in args.model or ["demo", "gpt2-small"]:
        clock = time.perf_counter if args.clock == "wall" else time.process_time
        bench(name, args.tokens, levels, args.repeat, args.warmup, clock)


if __name__ == "__main__":
    main()
