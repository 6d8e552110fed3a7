"""Tracing under torch.distributed: per-rank overhead against the untraced forward, and
what the rank files cost in bytes.

    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py                 # gpt2-small
    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py --preset demo --rounds 50

Every rank holds the model wrapped in ``DistributedDataParallel`` (replicas; its forward
broadcasts the buffers, so ranks meet once per pass, as in training) and runs, round by
round and interleaved (``bench_floor.interleaved_medians``): the plain distributed
forward, ``tracing.trace`` at ``shapes`` and at ``stats``. Each rank reports its medians
and ratios; rank 0 prints them all, then the size of each capture level's rank files
against the same model traced in one process.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from bench_floor import interleaved_medians  # this folder, run as a script
from torch.nn.parallel import DistributedDataParallel

import tracing
from scratchformer import DecoderOnlyTransformer, ModelConfig
from tracing.distributed import join_from_environment, rank_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not join_from_environment():
        raise SystemExit("launch with torchrun --nproc_per_node N (see the docstring)")
    torch.set_num_threads(args.threads)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset(args.preset)).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens))
    ddp = DistributedDataParallel(model)
    runs = {
        "plain": lambda: ddp(ids),
        "shapes": lambda: tracing.trace(ddp, ids, capture="shapes"),
        "stats": lambda: tracing.trace(ddp, ids, capture="stats"),
    }
    medians = interleaved_medians(runs, args.rounds, warmup=2)
    folder = Path(tempfile.mkdtemp(prefix="bench_dist_"))
    sizes = {}
    for level in ("shapes", "stats", "values"):
        tracing.trace(ddp, ids, capture=level, out=folder / f"{level}.sft")
        sizes[level] = rank_path(folder / f"{level}.sft", rank).stat().st_size
    single = {}
    if rank == 0:  # the same model alone in one process, for the bytes
        for level in ("shapes", "stats", "values"):
            path = folder / f"single.{level}.sft"
            tracing.save(tracing.trace(model, ids, capture=level), path)
            single[level] = path.stat().st_size
    gathered = [None] * world
    dist.all_gather_object(gathered, (rank, medians, sizes))
    if rank == 0:
        print(f"{args.preset}, {args.tokens} tokens, {world} ranks (gloo, DDP), "
              f"{args.rounds} rounds, {args.threads} thread(s) per rank")  # fmt: skip
        for r, med, _ in gathered:
            line = "  ".join(
                f"{name} {t * 1e3:7.1f} ms {t / med['plain']:5.2f}x" for name, t in med.items()
            )
            print(f"rank {r}: {line}")
        print("bytes of one rank's file vs the model traced alone in one process:")
        for level in sizes:
            per_rank = [s[level] for _, _, s in gathered]
            print(
                f"  {level:7s} rank files {', '.join(f'{b:,}' for b in per_rank)}"
                f"  (sum {sum(per_rank):,});  one process {single[level]:,}"
            )
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
