"""``scratchformer trace`` under ``torchrun``: join the process group, one file per rank.

    torchrun --nproc_per_node 2 -m app.cli trace --ddp -o trace.sft
    torchrun --nproc_per_node 2 -m app.cli trace --model tp.py:build -o trace.sft
    # -> trace.rank0.sft, trace.rank1.sft ; then: scratchformer report trace.sft

Launched by ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment), the command joins
the process group before it loads the model, so a ``--model`` factory can build a
``DeviceMesh`` and parallelize itself; ``--ddp`` wraps the model in
``DistributedDataParallel`` (replicas). Each rank writes ``<stem>.rank<N><suffix>``;
only rank 0 shows progress.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("under torchrun (one trace file per rank)")
    group.add_argument(
        "--ddp", action="store_true", help="wrap the model in DistributedDataParallel"
    )
    group.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        help="process group backend (default: nccl with CUDA, else gloo)",
    )


def join(args: argparse.Namespace, output: Path) -> tuple[Path, bool]:
    """``(file this process writes, whether it stays quiet)``: joins the process group
    when launched by ``torchrun``; otherwise the output as given and ``args.quiet``."""
    import torch

    from app.cli import UserError
    from tracing.capture.distributed import join_from_environment, rank_path

    if not join_from_environment(args.backend):
        if args.ddp:
            raise UserError("--ddp needs several processes: launch with torchrun")
        return output, args.quiet
    rank = torch.distributed.get_rank()
    if torch.distributed.get_world_size() == 1:
        return output, args.quiet
    return rank_path(output, rank), args.quiet or rank != 0


def wrap(model, args: argparse.Namespace):
    """The model, in ``DistributedDataParallel`` with ``--ddp``."""
    if not args.ddp:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def leave() -> None:
    """Leave the process group this command joined (all ranks meet first)."""
    import torch

    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
