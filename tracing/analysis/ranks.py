"""A set of rank files as one: stitched shards, collectives, and the rank that drifted.

Under ``torch.distributed`` every rank writes its own trace (``trace.rank0.sft``,
``trace.rank1.sft``, see ``tracing.distributed``). :func:`load_ranks` opens them together:

>>> ranks = tracing.load_ranks("trace.sft")          # doctest: +SKIP  (or the files)
>>> ranks.world_size, ranks[1].meta["rank"]          # doctest: +SKIP
>>> ranks.stitched(tensor_id)                        # doctest: +SKIP  the global tensor
>>> ranks.first_divergence()                         # doctest: +SKIP

Ranks run the same code, so their steps line up one to one; ``tracing.diff`` aligns them
anyway, so a rank that took a different branch is reported rather than misread.

What should agree across ranks
------------------------------
- outputs of collectives that leave every rank of the group the same result
  (``all_reduce``, ``broadcast``, ``all_gather``...; a redistribution to ``Replicate``);
- DTensors placed ``Replicate`` on every mesh dim;
- with ``replicas=True`` (the default for a ``DistributedDataParallel`` root whose ranks
  were fed equal inputs): every tensor, since replicas with equal weights and equal inputs
  compute the same thing. A rank whose weights drifted then shows at the first op that
  reads them.
Shards (``Shard``, ``Partial``) differ by design: they are compared as a whole, stitched.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracing.errors import TraceFileError
from tracing.file.rank_paths import rank_of_path, rank_siblings
from tracing.meta_checks import MAX_WORLD_SIZE
from tracing.record import TensorStats, Trace

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing.analysis.trace_diff import StepDiff, TraceDiff

AGREEING_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "broadcast",
        "broadcast_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced",
        "all_gather_single",
    }
)
"""Collectives after which every rank of the group holds the same tensor."""


# --------------------------------------------------------------------------- layout helpers


def layout_of(trace: Trace, tensor_id: int) -> dict[str, Any] | None:
    """The DTensor layout recorded for ``tensor_id`` on this rank (None: a plain tensor)."""
    dist = trace.meta.get("distributed") or {}
    return (dist.get("dtensors") or {}).get(tensor_id)


def collectives_of(trace: Trace) -> list[dict[str, Any]]:
    """The collectives this rank ran, in step order (see ``tracing.distributed``)."""
    dist = trace.meta.get("distributed") or {}
    return sorted(dist.get("collectives") or [], key=lambda c: c.get("index", 0))


def is_replicated(layout: dict[str, Any] | None) -> bool:
    return bool(layout) and all(p[0] == "replicate" for p in layout["placements"])


def stitch(shards: dict[tuple[int, ...], torch.Tensor], layout: dict[str, Any]) -> torch.Tensor:
    """The global tensor from each mesh coordinate's local shard.

    Mesh dims are taken outermost first, as DTensor lays shards out: ``Shard(d)``
    concatenates along tensor dim ``d`` in coordinate order, ``Partial(sum)`` adds (the
    pending reduction, done here), ``Replicate`` takes coordinate 0.
    """
    import torch

    mesh_shape = _mesh_shape(layout["mesh"])
    placements = layout["placements"]

    def combine(level: int, prefix: tuple[int, ...]) -> torch.Tensor:
        if level == len(mesh_shape):
            return shards[prefix]
        parts = [combine(level + 1, (*prefix, c)) for c in range(mesh_shape[level])]
        kind = placements[level]
        if kind[0] == "shard":
            return torch.cat(parts, dim=kind[1])
        if kind[0] == "partial":
            op = kind[1] if len(kind) > 1 else "sum"
            if op in ("max", "min"):
                return torch.stack(parts).amax(0) if op == "max" else torch.stack(parts).amin(0)
            total = torch.stack(parts).sum(0)
            return total / len(parts) if op in ("avg", "mean") else total
        return parts[0]

    return combine(0, ())


def _mesh_shape(mesh: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(mesh, list):
        shape.append(len(mesh))
        mesh = mesh[0] if mesh else None
    return tuple(shape)


def pooled_stats(parts: list[tuple[TensorStats, int]]) -> TensorStats | None:
    """Statistics of the concatenation of tensors from each one's ``(stats, numel)``: min
    of mins, max of maxes, the numel-weighted mean, the pooled (population) std."""
    parts = [(s, n) for s, n in parts if s is not None and n > 0]
    if not parts:
        return None
    total = sum(n for _, n in parts)
    mean = sum(s.mean * n for s, n in parts) / total
    # sum of squares about the global mean, from each part's (population) std and mean
    ss = sum(n * (s.std**2 + (s.mean - mean) ** 2) for s, n in parts)
    std = math.sqrt(ss / total)
    return TensorStats(
        min=min(s.min for s, _ in parts),
        max=max(s.max for s, _ in parts),
        mean=mean,
        std=std,
        nan=sum(s.nan for s, _ in parts),
        inf=sum(s.inf for s, _ in parts),
    )


# --------------------------------------------------------------------------- the set


@dataclass(frozen=True)
class RankDivergence:
    """A step whose outputs should agree across ranks but do not (``rank`` vs rank 0)."""

    rank: int
    entry: StepDiff  # the aligned pair: a_index on the first rank, b_index on ``rank``
    reason: str  # why they should agree: "all_reduce output", "Replicate", "replica"

    @property
    def step(self) -> int | None:
        return self.entry.a_index

    @property
    def label(self) -> str:
        return self.entry.label


class RankSet:
    """Traces of one run, one per rank, keyed by rank (see the module docstring)."""

    def __init__(self, traces: dict[int, Trace], paths: dict[int, Path] | None = None):
        if not traces:
            raise ValueError("a rank set needs at least one trace")
        self.traces = dict(sorted(traces.items()))
        self.paths = dict(paths or {})
        self._diffs: dict[int, TraceDiff] = {}

    # ---- access

    @property
    def ranks(self) -> list[int]:
        return list(self.traces)

    @property
    def world_size(self) -> int:
        """The run's rank count: its meta's (checked on load, at most
        ``meta_checks.MAX_WORLD_SIZE``), else the number of files; never below the
        highest rank present."""
        claimed = self.first.meta.get("world_size")
        if isinstance(claimed, bool) or not isinstance(claimed, int):
            claimed = len(self.traces)
        return max(min(claimed, MAX_WORLD_SIZE), max(self.traces) + 1)

    @property
    def first(self) -> Trace:
        return next(iter(self.traces.values()))

    def __getitem__(self, rank: int) -> Trace:
        return self.traces[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self.traces)

    def __len__(self) -> int:
        return len(self.traces)

    @property
    def missing(self) -> list[int]:
        """Ranks the run had but the set lacks (a file not copied back, a rank that died)."""
        return [r for r in range(self.world_size) if r not in self.traces]

    def diff(self, rank: int, against: int | None = None) -> TraceDiff:
        """``tracing.diff`` of rank ``against`` (default: the first) with ``rank``, cached."""
        a = self.ranks[0] if against is None else against
        found = self._diffs.get((a, rank))
        if found is None:
            from tracing.analysis.trace_diff import diff

            found = self._diffs[a, rank] = diff(self.traces[a], self.traces[rank])
        return found

    def agreement_diff(self, a: int, b: int, replicas: bool | None = None) -> TraceDiff:
        """The diff of ranks ``a`` and ``b`` restricted to what should agree: an aligned
        step that need not (a shard, a rank's own slice) keeps its shapes but loses its
        metrics and gets status ``"sharded"``, so it neither counts nor colours as a
        divergence. What the app's rank view shows."""
        from dataclasses import replace

        from tracing.analysis.trace_diff import TensorDiff

        if replicas is None:
            replicas = self.replicas_expected()
        full = self.diff(b, against=a)
        entries = []
        for e in full.entries:
            if e.one_sided or self.should_agree(e.a_index, replicas, rank=a) is not None:
                entries.append(e)
                continue
            outputs = tuple(TensorDiff(o.name, o.shape_a, o.shape_a, o.dtype_a, o.dtype_a)
                            for o in e.outputs)  # fmt: skip
            entries.append(replace(e, status="sharded", outputs=outputs))
        return replace(full, entries=entries)

    def counterpart(self, rank: int, tensor_id: int) -> int | None:
        """The id on ``rank`` of the first rank's tensor ``tensor_id``: the same output
        slot of the aligned step (None when that step is missing there)."""
        first = self.first
        producer = first.tensors[tensor_id].producer
        if rank == self.ranks[0]:
            return tensor_id
        if producer is None:  # an input or a parameter: the same position among them
            other = self.traces[rank]
            return tensor_id if tensor_id < len(other.tensors) else None
        entry = self.diff(rank).for_step_a(producer)
        if entry is None or entry.b_index is None:
            return None
        outputs_a = first.steps[producer].outputs
        outputs_b = self.traces[rank].steps[entry.b_index].outputs
        k = outputs_a.index(tensor_id)
        return outputs_b[k] if k < len(outputs_b) else None

    # ---- shards

    def stitched(self, tensor_id: int) -> torch.Tensor | None:
        """The global tensor of a DTensor whose shards every rank kept (None when it is not
        a DTensor, a rank is missing, or a rank kept no value)."""
        layout = layout_of(self.first, tensor_id)
        if layout is None or self.missing:
            return None
        shards = {}
        for rank, trace in self.traces.items():
            tid = self.counterpart(rank, tensor_id)
            own = layout_of(trace, tid) if tid is not None else None
            value = trace.value(tid) if tid is not None else None
            if own is None or value is None:
                return None
            shards[tuple(own["coordinate"])] = value
        try:
            return stitch(shards, layout)
        except (KeyError, RuntimeError, IndexError):  # shards that do not fit together
            return None

    def stitched_stats(self, tensor_id: int) -> TensorStats | None:
        """Statistics of the global tensor: from its stitched value when kept, else pooled
        from each shard's statistics (exact for ``Shard``, None for ``Partial``)."""
        value = self.stitched(tensor_id)
        if value is not None:
            from tracing.stats import tensor_stats

            return tensor_stats(value)
        layout = layout_of(self.first, tensor_id)
        if layout is None or self.missing:
            return None
        if any(p[0] == "partial" for p in layout["placements"]):
            return None
        if is_replicated(layout):
            return self.first.tensors[tensor_id].stats
        parts = []
        seen = set()
        for rank, trace in self.traces.items():
            tid = self.counterpart(rank, tensor_id)
            own = layout_of(trace, tid) if tid is not None else None
            if own is None:
                return None
            # replicated mesh dims hold copies: count each shard coordinate once
            key = tuple(c for c, p in zip(own["coordinate"], own["placements"]) if p[0] == "shard")
            if key in seen:
                continue
            seen.add(key)
            rec = trace.tensors[tid]
            parts.append((rec.stats, rec.numel))
        return pooled_stats(parts)

    # ---- divergence

    def replicas_expected(self) -> bool:
        """True for data-parallel replicas fed equal inputs (a DDP root, equal root inputs)."""
        first = self.first
        if not str(first.meta.get("model_class", "")).endswith("DistributedDataParallel"):
            return False
        if not first.steps:
            return False
        root_inputs = first.steps[0].inputs
        for rank in self.ranks[1:]:
            other = self.traces[rank]
            if not other.steps or len(other.steps[0].inputs) != len(root_inputs):
                return False
            for ta, tb in zip(root_inputs, other.steps[0].inputs):
                ra, rb = first.tensors[ta], other.tensors[tb]
                if ra.shape != rb.shape:
                    return False
                va, vb = first.value(ta), other.value(tb)
                if va is not None and vb is not None:
                    if not va.equal(vb):
                        return False
                elif ra.stats != rb.stats:
                    return False
        return True

    def should_agree(self, step_index: int, replicas: bool, rank: int | None = None) -> str | None:
        """Why step ``step_index`` of ``rank`` (default: the first) should agree across
        ranks (None: it need not: a shard, a rank's own slice)."""
        rank = self.ranks[0] if rank is None else rank
        trace = self.traces[rank]
        step = trace.steps[step_index]
        collective = self._collective_steps(rank).get(step_index)
        if collective is not None:
            if collective["op"] in AGREEING_COLLECTIVES:
                return f"{collective['op']} output"
            if collective["op"] == "redistribute" and all(
                p[0] == "replicate" for p in collective["placements"][1]
            ):
                return "redistributed to Replicate"
        layouts = [layout_of(trace, t) for t in step.outputs]
        if layouts and all(is_replicated(lay) for lay in layouts):
            return "Replicate"
        if replicas and not any(lay is not None for lay in layouts):
            return "replica"
        return None

    def _collective_steps(self, rank: int) -> dict[int, dict[str, Any]]:
        cache = self.__dict__.setdefault("_collective_cache", {})
        found = cache.get(rank)
        if found is None:
            found = {c["index"]: c for c in collectives_of(self.traces[rank]) if "index" in c}
            cache[rank] = found
        return found

    def divergences(self, atol: float = 0.0, replicas: bool | None = None) -> list[RankDivergence]:
        """Every step, on every rank, that should agree with the first rank but does not,
        in execution order (earliest first)."""
        if replicas is None:
            replicas = self.replicas_expected()
        found = []
        for rank in self.ranks[1:]:
            for entry in self.diff(rank).divergent(atol):
                if entry.a_index is None:
                    found.append(RankDivergence(rank, entry, "step missing on the first rank"))
                    continue
                if entry.one_sided:
                    found.append(RankDivergence(rank, entry, f"step missing on rank {rank}"))
                    continue
                reason = self.should_agree(entry.a_index, replicas)
                if reason is not None:
                    found.append(RankDivergence(rank, entry, reason))
        found.sort(key=lambda d: (d.entry.order, d.rank))
        return found

    def first_divergence(self, atol: float = 0.0, replicas: bool | None = None):
        """The earliest :class:`RankDivergence`, or None when the ranks agree."""
        found = self.divergences(atol, replicas)
        return found[0] if found else None


# --------------------------------------------------------------------------- opening


def load_ranks(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> RankSet:
    """Open rank files as one :class:`RankSet`.

    ``paths`` is a list of files, or one path: ``trace.sft`` or ``trace.rank0.sft`` opens
    every ``trace.rank<N>.sft`` beside it. A file's rank is read from its ``meta["rank"]``
    (its name when the meta has none). Two files of one rank, or files of different runs
    (world sizes disagree), raise ``TraceFileError``.
    """
    from tracing.file.loading import load

    if isinstance(paths, (str, os.PathLike)):
        files = rank_siblings(paths)
        if not files:
            if Path(paths).is_file():
                files = [Path(paths)]
            else:
                raise TraceFileError(f"{paths}: no such trace, and no rank files beside it")
    else:
        files = [Path(p) for p in paths]
    if not files:
        raise TraceFileError("no trace files given")
    traces: dict[int, Trace] = {}
    where: dict[int, Path] = {}
    sizes = set()
    for position, path in enumerate(files):
        trace = load(path)
        rank = trace.meta.get("rank")
        if not isinstance(rank, int):
            rank = rank_of_path(path)
        if rank is None:
            rank = position
        if not 0 <= rank < MAX_WORLD_SIZE:  # a name like t.rank99999999999.sft
            raise TraceFileError(f"{path}: rank {str(rank)[:40]} is out of range")
        world = trace.meta.get("world_size")
        if world is not None and rank >= world:
            raise TraceFileError(f"{path}: rank {rank} is not below meta.world_size {world}")
        if rank in traces:
            raise TraceFileError(f"{path}: rank {rank} is also {where[rank]}")
        traces[rank], where[rank] = trace, path
        if trace.meta.get("world_size") is not None:
            sizes.add(trace.meta["world_size"])
    if len(sizes) > 1:
        raise TraceFileError(
            "these files come from different runs: world sizes "
            + ", ".join(str(s) for s in sorted(sizes))
        )
    return RankSet(traces, where)


__all__ = [
    "AGREEING_COLLECTIVES",
    "RankDivergence",
    "RankSet",
    "collectives_of",
    "layout_of",
    "load_ranks",
    "pooled_stats",
    "stitch",
]
