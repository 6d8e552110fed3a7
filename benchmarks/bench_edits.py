"""What edits cost: a trace with one edit against the same trace without, and a head
patching sweep against the same number of plain forwards.

    .venv/bin/python benchmarks/bench_edits.py                   # both parts
    .venv/bin/python benchmarks/bench_edits.py --part trace --rounds 200 --threads 1
    .venv/bin/python benchmarks/bench_edits.py --part sweep --sweep-rounds 3 --threads 2

Part ``trace`` (demo model, demo prompt): ``tracing.trace`` at ``stats`` with no edit, with
one module-site edit (zero one head of the attention core's output) and with one op-site
edit (scale the softmax of block 1 by 1.0), interleaved round by round, each call after an
untimed ``gc.collect()``; the ratios are medians over the plain trace's median. Target:
one edit costs at most 5% more than the trace without it.

Part ``sweep`` (the ``gpt2-small`` preset, random weights, 64 tokens): ``tracing.patching
.sweep(over="heads")`` (12 x 12 = 144 patched runs, plus the shapes trace that finds the
sites, the clean run and the corrupted run) against 144 plain forwards of the corrupted
input, alternated; each figure is the median over ``--sweep-rounds``. Target: <= 1.3x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_floor import interleaved_medians, print_medians  # this folder, run as a script

import tracing
from tracing.edits import Edit, Scale, Zero
from tracing.patching import sweep


def bench_trace(rounds: int) -> None:
    from scratchformer import DEMO_PROMPT, ByteTokenizer, demo_model

    model = demo_model().eval()
    ids = torch.tensor([ByteTokenizer().encode(DEMO_PROMPT)])
    head = [Edit("blocks.1.self_attn.attention", Zero(), head=2)]
    softmax = [Edit("blocks.1.self_attn.attention:softmax#0", Scale(1.0))]
    runs = {
        "plain": lambda: tracing.trace(model, ids, capture="stats"),
        "module edit": lambda: tracing.trace(model, ids, capture="stats", edits=head),
        "op edit": lambda: tracing.trace(model, ids, capture="stats", edits=softmax),
    }
    print(
        f"trace with one edit: demo model, {ids.shape[1]} tokens, capture stats, "
        f"{torch.get_num_threads()} threads, {rounds} rounds (median; 'plain' = the trace "
        "without edits)"
    )
    print_medians(interleaved_medians(runs, rounds))


def bench_sweep(rounds: int, tokens: int) -> None:
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset("gpt2-small")).eval()
    clean = torch.randint(0, model.config.vocab_size, (1, tokens))
    corrupted = clean.clone()
    corrupted[0, tokens // 2] = (corrupted[0, tokens // 2] + 1) % model.config.vocab_size
    n = model.config.n_layers * model.config.n_heads
    print(
        f"head sweep: gpt2-small preset, {tokens} tokens, {n} patched runs vs {n} plain "
        f"forwards, {torch.get_num_threads()} threads, {rounds} rounds alternated"
    )
    plain_times, sweep_times = [], []
    with torch.no_grad():
        model(corrupted)  # warm up
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(n):
                model(corrupted)
            plain_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            result = sweep(model, clean, corrupted, over="heads")
            sweep_times.append(time.perf_counter() - start)
            assert result.runs == n
            print(
                f"  round {len(sweep_times)}: plain {plain_times[-1]:.2f} s, sweep "
                f"{sweep_times[-1]:.2f} s, {sweep_times[-1] / plain_times[-1]:.3f}x",
                flush=True,
            )
    plain, swept = statistics.median(plain_times), statistics.median(sweep_times)
    print(f"  {n} plain forwards {plain:7.2f} s   (each round: {_list(plain_times)})")
    print(f"  sweep over heads  {swept:7.2f} s   (each round: {_list(sweep_times)})")
    print(f"  ratio {swept / plain:.3f}x")


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("trace", "sweep", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=150, help="trace part rounds")
    parser.add_argument("--sweep-rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.part in ("trace", "both"):
        bench_trace(args.rounds)
    if args.part in ("sweep", "both"):
        bench_sweep(args.sweep_rounds, args.tokens)


if __name__ == "__main__":
    main()
