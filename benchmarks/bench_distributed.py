"""Tracing under torch.distributed: per-rank overhead against the untraced forward, and
what the rank files cost in bytes.

    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py                 # gpt2-small
    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py --preset demo --rounds 50

Every rank holds the model wrapped in ``DistributedDataParallel`` (replicas; its forward
broadcasts the buffers, so ranks meet once per pass, as in training) and runs, round by
round and interleaved (``bench_floor.interleaved_medians``): the plain distributed
forward, ``tracing.trace`` at ``shapes`` and at ``stats``. Each rank reports its medians
and ratios; rank 0 prints them all, then the size of each capture level's rank files
against the same model without DDP, traced and written the same way.

``--step`` times a training step instead: forward, cross-entropy loss, backward (DDP's
gradient all-reduces) and an SGD step, plain against ``tracing.trace_step`` at
``shapes`` and ``stats`` (which records the backward, each bucket's all-reduce included).
``--clock cpu`` counts each rank's CPU time instead of wall time (a shared machine).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from bench_floor import interleaved_medians  # this folder, run as a script
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import tracing
from scratchformer import DecoderOnlyTransformer, ModelConfig
from tracing.capture.distributed import join_from_environment, output_path, rank_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--step", action="store_true", help="time a training step")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    if not join_from_environment():
        raise SystemExit("launch with torchrun --nproc_per_node N (see the docstring)")
    torch.set_num_threads(args.threads)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset(args.preset)).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens))
    ddp = DistributedDataParallel(model)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.step:
        step_runs(ddp, ids, args, clock)
        return
    runs = {
        "plain": lambda: ddp(ids),
        "shapes": lambda: tracing.trace(ddp, ids, capture="shapes"),
        "stats": lambda: tracing.trace(ddp, ids, capture="stats"),
    }
    medians = interleaved_medians(runs, args.rounds, warmup=2, clock=clock)
    folder = Path(tempfile.mkdtemp(prefix="bench_dist_"))
    sizes = {}
    for level in ("shapes", "stats", "values"):
        tracing.trace(ddp, ids, capture=level, out=folder / f"{level}.sft")
        sizes[level] = rank_path(folder / f"{level}.sft", rank).stat().st_size
    single = {}
    if rank == 0:  # the same model without DDP, for the bytes
        for level in ("shapes", "stats", "values"):
            path = folder / f"single.{level}.sft"
            tracing.trace(model, ids, capture=level, out=path)  # written as the ranks write
            single[level] = output_path(path).stat().st_size
    gathered = [None] * world
    dist.all_gather_object(gathered, (rank, medians, sizes))
    if rank == 0:
        print_ranks(gathered, args, "forward")
        print("bytes of one rank's file vs the model alone (no DDP), written the same way:")
        for level in sizes:
            per_rank = [s[level] for _, _, s in gathered]
            print(
                f"  {level:7s} rank files {', '.join(f'{b:,}' for b in per_rank)}"
                f"  (sum {sum(per_rank):,});  model alone {single[level]:,}"
            )
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    leave()


def step_runs(ddp: DistributedDataParallel, ids: torch.Tensor, args, clock) -> None:
    """Plain and traced training steps of ``ddp``, interleaved; each rank's own batch."""
    rank = dist.get_rank()
    ids = (ids + rank) % ddp.module.config.vocab_size  # data parallel: its own batch
    sgd = torch.optim.SGD(ddp.parameters(), lr=1e-4)

    def loss_fn(logits, targets):
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def plain():
        sgd.zero_grad()
        with torch.enable_grad():
            loss_fn(ddp(ids), ids).backward()
        sgd.step()

    def traced(capture):
        sgd.zero_grad()
        tracing.trace_step(ddp, ids, loss_fn, sgd, targets=ids, capture=capture)

    runs = {"plain": plain, "shapes": lambda: traced("shapes"), "stats": lambda: traced("stats")}
    medians = interleaved_medians(runs, args.rounds, warmup=2, clock=clock)
    buckets = len(_backward(ddp, ids, loss_fn))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (rank, medians, None))
    if rank == 0:
        print_ranks(gathered, args, f"training step, {buckets} bucket all-reduces")
    leave()


def _backward(ddp, ids, loss_fn) -> list:
    trace = tracing.trace_step(ddp, ids, loss_fn, targets=ids, capture="shapes")
    ddp.zero_grad()
    return [c for c in trace.meta["distributed"]["collectives"] if c.get("phase") == "backward"]


def print_ranks(gathered: list, args, what: str) -> None:
    print(
        f"{args.preset}, {args.tokens} tokens, {len(gathered)} ranks (gloo, DDP), {what}, "
        f"{args.rounds} rounds, {args.threads} thread(s) per rank, {args.clock} clock"
    )
    for r, med, _ in gathered:
        line = "  ".join(
            f"{name} {t * 1e3:7.1f} ms {t / med['plain']:5.2f}x" for name, t in med.items()
        )
        print(f"rank {r}: {line}")


def leave() -> None:
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
