"""Two CPU ranks over gloo for the distributed tests: a spawner and the scenarios they run.

:func:`run_ranks` starts ``world_size`` processes (``spawn``, so nothing of the test's
process leaks in), joins them under a deadline and kills them if it passes. Ranks meet
through a file store in the test's temporary folder, so no port is ever taken. Each
scenario is a function ``(rank, world_size, folder)`` that writes its rank files there.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

SEED = 0
IN, HIDDEN, OUT = 8, 16, 8


def run_ranks(scenario, folder: Path, world_size: int = 2, timeout: float = 120.0) -> None:
    """Run ``scenario`` on ``world_size`` gloo ranks; raise if one fails or time runs out."""
    ctx = mp.start_processes(
        _rank_main, args=(world_size, scenario, str(folder)), nprocs=world_size,
        join=False, start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{scenario.__name__}: ranks still running after {timeout}s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)


def _rank_main(rank: int, world_size: int, scenario, folder: str) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("LOCAL_RANK", str(rank))
    store = Path(folder) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world_size)  # fmt: skip
    try:
        scenario(rank, world_size, Path(folder))
        dist.barrier()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- models


def mlp() -> nn.Sequential:
    """The MLP every scenario splits: Linear -> ReLU -> Linear, seeded."""
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))


def mlp_input() -> torch.Tensor:
    return torch.randn(3, IN, generator=torch.Generator().manual_seed(1))


class RowParallelLinear(nn.Module):
    """``full`` split by input features across ranks: each rank multiplies its slice of
    the input by its slice of the weight, then ``dist.all_reduce`` adds the partial sums."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int):
        super().__init__()
        k = full.in_features // world_size
        self.start, self.stop = rank * k, (rank + 1) * k
        self.weight = nn.Parameter(full.weight.detach()[:, self.start : self.stop].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = x[..., self.start : self.stop] @ self.weight.T
        dist.all_reduce(partial)
        return partial + self.bias


class PassAlong(nn.Module):
    """Rank 0 sends its activations to rank 1 (``send``/``recv``, then ``isend``/``irecv``
    waited on), with a ``barrier`` between: point-to-point traffic in a forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * (dist.get_rank() + 1)
        if dist.get_rank() == 0:
            dist.send(y, dst=1)
        else:
            dist.recv(y, src=0)
        dist.barrier()
        z = torch.empty_like(y)
        work = dist.isend(y, dst=1) if dist.get_rank() == 0 else dist.irecv(z, src=0)
        work.wait()
        return y + z


def demo_model():
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.manual_seed(SEED)
    cfg = ModelConfig.preset("demo", n_layers=2, block_size=16)
    return DecoderOnlyTransformer(cfg).eval()


DEMO_TOKENS = torch.tensor([[1, 5, 9, 2, 7, 3, 8, 4]])


# --------------------------------------------------------------------------- scenarios


def row_parallel(rank: int, world_size: int, folder: Path) -> None:
    import tracing

    layer = RowParallelLinear(mlp()[0], rank, world_size)
    tracing.trace(layer, mlp_input(), capture="values", out=folder / "row.sft")


def tensor_parallel(rank: int, world_size: int, folder: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import tracing

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    model = parallelize_module(mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    tracing.trace(model, mlp_input(), capture="values", out=folder / "tp.sft")


def data_parallel(rank: int, world_size: int, folder: Path) -> None:
    """The demo model under DDP, traced twice: as is, then with rank 1's weight nudged."""
    from torch.nn.parallel import DistributedDataParallel

    import tracing

    ddp = DistributedDataParallel(demo_model())
    tracing.trace(ddp, DEMO_TOKENS, capture="stats", out=folder / "ddp.sft")
    if rank == 1:  # after DDP's start-up broadcast, as a real drift would be
        with torch.no_grad():
            ddp.module.blocks[1].feed_forward.linear1.weight[3, 5] += 0.5
    tracing.trace(ddp, DEMO_TOKENS, capture="stats", out=folder / "drift.sft")


def demo_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def rank_tokens(rank: int) -> torch.Tensor:
    """Each rank's own batch (data parallel: ranks see different data)."""
    return (DEMO_TOKENS * (rank + 1) + rank) % 32


def ddp_training_step(rank: int, world_size: int, folder: Path) -> None:
    """One SGD step of the DDP demo model traced with ``trace_step``, next to the same step
    untraced on a twin: both twins' gradients and weights are saved for the test. A first
    untraced step lets DDP rebuild its buckets in gradient order (small buckets: several
    all-reduces, interleaved with the backward). Then gradient accumulation: a traced
    micro-step under ``no_sync()`` and a traced synchronized one, again beside a twin."""
    from safetensors.torch import save_file
    from torch.nn.parallel import DistributedDataParallel

    import tracing
    from tracing.capture.distributed import output_path

    traced, plain = (DistributedDataParallel(demo_model(), bucket_cap_mb=0.02) for _ in "ab")
    sgd = {id(m): torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (traced, plain)}
    x = rank_tokens(rank)

    def plain_step(model, tokens, sync=True):
        with contextlib.nullcontext() if sync else model.no_sync():
            demo_loss(model(tokens), tokens).backward()

    for model in (traced, plain):  # warm-up: DDP rebuilds its buckets
        plain_step(model, x)
        sgd[id(model)].step()
        sgd[id(model)].zero_grad()
    plain_step(plain, x)
    sgd[id(plain)].step()
    tracing.trace_step(traced, x, demo_loss, sgd[id(traced)], targets=x, capture="values",
                       out=folder / "ddp_step.sft")  # streamed, one file per rank  # fmt: skip
    _save_twins(folder / f"ddp_step_grads.rank{rank}.safetensors", traced, plain, save_file)
    # gradient accumulation: a local micro-step, then the synchronized one
    for model in (traced, plain):
        sgd[id(model)].zero_grad()
    y = rank_tokens(rank + 2)
    plain_step(plain, y, sync=False)
    plain_step(plain, x)
    with traced.no_sync():
        local = tracing.trace_step(traced, y, demo_loss, targets=y, capture="values")
    local.save(output_path(folder / "ddp_local.sft"))
    synced = tracing.trace_step(traced, x, demo_loss, targets=x, capture="values")
    synced.save(output_path(folder / "ddp_sync.sft"))
    _save_twins(folder / f"ddp_sync_grads.rank{rank}.safetensors", traced, plain, save_file)
    # nothing left attached: no comm hook, no module hook, and untraced steps after it
    # (the synchronized step's update first) go on exactly like the twin's
    attached = {
        "comm_hook": traced._get_ddp_logging_data().get("comm_hook"),
        "comm_hooks": len(traced._comm_hooks),
        "module_hooks": sum(
            len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            for m in traced.modules()
        ),
    }
    (folder / f"ddp_attached.rank{rank}.json").write_text(json.dumps(attached))
    for model in (traced, plain):
        sgd[id(model)].step()
        for _ in range(2):
            sgd[id(model)].zero_grad()
            plain_step(model, x)
            sgd[id(model)].step()
    _save_twins(folder / f"ddp_after_grads.rank{rank}.safetensors", traced, plain, save_file)


def _save_twins(path: Path, traced, plain, save_file) -> None:
    """Both twins' gradients and weights (a DTensor's whole tensor: every rank calls this)."""
    tensors = {}
    for (name, p), q in zip(traced.named_parameters(), plain.parameters()):
        tensors[f"traced.grad.{name}"] = p.grad
        tensors[f"plain.grad.{name}"] = q.grad
        tensors[f"traced.{name}"] = p.detach()
        tensors[f"plain.{name}"] = q.detach()
    whole = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in tensors.items()}
    save_file({k: v.contiguous() for k, v in whole.items()}, str(path))


def point_to_point(rank: int, world_size: int, folder: Path) -> None:
    import tracing

    tracing.trace(PassAlong(), mlp_input(), capture="values", out=folder / "p2p.sft")


def fully_sharded(rank: int, world_size: int, folder: Path) -> None:
    """The MLP under FSDP2 (``fully_shard`` on each Linear and on the whole): a traced
    forward, then a traced SGD step (each rank its own batch) beside an untraced twin."""
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard

    import tracing

    traced, plain = mlp(), mlp()
    for model in (traced, plain):
        for layer in (model[0], model[2], model):
            fully_shard(layer)
    tracing.trace(traced, mlp_input(), capture="values", out=folder / "fsdp.sft")
    _twin_steps(traced, plain, rank, folder / "fsdp_step", save_file)


def fsdp1(rank: int, world_size: int, folder: Path) -> None:
    """The MLP under FSDP1 (``FullyShardedDataParallel``; on CPU it needs ``device_id``):
    a traced forward, then a traced SGD step beside an untraced twin."""
    from safetensors.torch import save_file
    from torch.distributed.fsdp import FullyShardedDataParallel

    import tracing

    cpu = torch.device("cpu")
    traced, plain = (FullyShardedDataParallel(mlp(), device_id=cpu) for _ in "ab")
    tracing.trace(traced, mlp_input() * (rank + 1), capture="values", out=folder / "fsdp1.sft")
    _twin_steps(traced, plain, rank, folder / "fsdp1_step", save_file)


def mlp_loss(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def _twin_steps(traced, plain, rank: int, stem: Path, save_file) -> None:
    """One SGD step of ``plain``, the same step of ``traced`` traced (``stem.rankN.sft``),
    both twins' gradients and weights saved (``stem_grads.rankN.safetensors``)."""
    import tracing

    x = mlp_input() * (rank + 1)  # each rank its own batch
    sgd = {id(m): torch.optim.SGD(m.parameters(), lr=0.1) for m in (traced, plain)}
    mlp_loss(plain(x)).backward()
    sgd[id(plain)].step()
    tracing.trace_step(traced, x, mlp_loss, sgd[id(traced)], capture="values",
                       out=stem.with_suffix(".sft"))  # fmt: skip
    _save_twins(stem.with_name(f"{stem.name}_grads.rank{rank}.safetensors"), traced, plain,
                save_file)  # fmt: skip


def cli_trace(rank: int, world_size: int, folder: Path) -> None:
    """``scratchformer trace --ddp`` as ``torchrun`` would run it on each rank (the group
    is up already, as after the command joins it)."""
    from app.cli import main
    from app.commands import ranks

    leave, ranks.leave = ranks.leave, lambda: None  # the spawner leaves the group
    try:
        code = main(["trace", "--ddp", "--quiet", "--preset", "demo", "--prompt", "abc|cba.",
                     "-o", str(folder / "cli.sft")])  # fmt: skip
    finally:
        ranks.leave = leave
    assert code == 0


USER_MODEL = '''
"""A user's tensor-parallel MLP: build() splits it over every rank of the default group."""
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def example_inputs():
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
'''


def cli_own_model(rank: int, world_size: int, folder: Path) -> None:
    """``scratchformer trace --model FILE.py:build`` on each rank: the user's factory
    parallelizes the model itself (the group is up before the file is imported)."""
    from app.cli import main
    from app.commands import ranks

    source = folder / "tp_model.py"
    if rank == 0:
        source.write_text(USER_MODEL)
    dist.barrier()
    leave, ranks.leave = ranks.leave, lambda: None  # the spawner leaves the group
    try:
        code = main(["trace", "--quiet", "--capture", "values", "--model", f"{source}:build",
                     "-o", str(folder / "own.sft")])  # fmt: skip
    finally:
        ranks.leave = leave
    assert code == 0


def every_scenario(rank: int, world_size: int, folder: Path) -> None:
    """All of the above in one pair of processes (starting them is the slow part)."""
    for scenario in (
        row_parallel,
        tensor_parallel,
        data_parallel,
        ddp_training_step,
        fully_sharded,
        fsdp1,
        point_to_point,
        cli_trace,
        cli_own_model,
    ):
        scenario(rank, world_size, folder)
