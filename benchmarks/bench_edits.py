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

Part ``cells`` interleaves finer, for a machine whose load drifts: one plain forward and
one patched run (a random head) alternated ABBA, and the sweep's fixed setup timed once;
the sweep's ratio is estimated from the two medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_floor import interleaved_medians, print_medians  # this folder, run as a script

import tracing
from tracing.capture.edits import Edit, Scale, Zero
from tracing.runs.patching import sweep


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
    model, clean, corrupted = _gpt2_small(tokens)
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


def bench_cells(pairs: int, tokens: int) -> None:
    """Finer than whole sweeps: one plain forward and one patched run of a random head,
    alternated ABBA, plus the sweep's fixed setup (shapes trace, clean run, corrupted run)
    timed once; the ratio of a 12 x 12 sweep is estimated from the medians."""
    import random

    from tracing.capture.edits import EditPlan, Patch
    from tracing.runs.edit_run import run_edited
    from tracing.runs.patching import _Keep, head_sites

    model, clean, corrupted = _gpt2_small(tokens)
    with torch.no_grad():
        start = time.perf_counter()
        sites = head_sites(tracing.trace(model, clean, capture="shapes"))
        store: dict = {}
        keep = EditPlan.of([Edit(s, _Keep(store), output=k) for s, k in sites])
        run_edited(model, clean, edits=keep)
        model(corrupted)
        setup = time.perf_counter() - start
        heads = model.config.n_heads
        source = Patch(store)
        plans = [
            EditPlan.of([Edit(s, source, head=h, output=k)]) for s, k in sites for h in range(heads)
        ]
        plain, patched = [], []
        rng = random.Random(0)
        for i in range(pairs):
            for which in (0, 1) if i % 2 == 0 else (1, 0):  # ABBA: load drift cancels
                start = time.perf_counter()
                if which == 0:
                    model(corrupted)
                    plain.append(time.perf_counter() - start)
                else:
                    run_edited(model, corrupted, edits=rng.choice(plans))
                    patched.append(time.perf_counter() - start)
    p, q = statistics.median(plain), statistics.median(patched)
    n = len(plans)
    print(
        f"patched run vs plain forward: gpt2-small preset, {tokens} tokens, "
        f"{torch.get_num_threads()} threads, {pairs} ABBA pairs"
    )
    print(f"  plain forward {p * 1e3:.1f} ms, patched run {q * 1e3:.1f} ms ({q / p:.3f}x)")
    print(f"  sweep setup (shapes trace, clean run, corrupted run) {setup:.2f} s")
    print(
        f"  estimated sweep of {n} / {n} plain forwards = ({n} x {q:.3f} + {setup:.2f}) / "
        f"({n} x {p:.3f}) = {(n * q + setup) / (n * p):.3f}x"
    )


def _gpt2_small(tokens: int):
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset("gpt2-small")).eval()
    clean = torch.randint(0, model.config.vocab_size, (1, tokens))
    corrupted = clean.clone()
    corrupted[0, tokens // 2] = (corrupted[0, tokens // 2] + 1) % model.config.vocab_size
    return model, clean, corrupted


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("trace", "sweep", "cells", "both"), default="both")
    parser.add_argument("--pairs", type=int, default=30, help="cells part: ABBA pairs")
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
    if args.part == "cells":
        bench_cells(args.pairs, args.tokens)


if __name__ == "__main__":
    main()
