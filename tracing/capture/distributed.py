"""Tracing under ``torch.distributed``: every rank records its own pass, collectives included.

When a process group is up (``torchrun``, ``torch.multiprocessing.spawn`` +
``init_process_group``), a :class:`~tracing.capture.Tracer` installs a :class:`RankCapture`
for the duration of the trace. Nothing is gathered across ranks: each rank keeps its own
``Trace`` and writes its own file (``trace.sft`` -> ``trace.rank0.sft``, ``trace.rank1.sft``,
see :func:`rank_path`); ``tracing.ranks`` opens a set of them as one.

What a rank's trace gains
-------------------------
- ``meta["rank"]``, ``meta["world_size"]``, ``meta["backend"]``, and
  ``meta["distributed"]`` with the host, the local rank, and two tables:
- ``collectives``: one entry per collective that ran inside the traced forward —
  ``{"index", "op", "api", "group", "ranks", ...}`` (``index``: its step's place in
  ``trace.steps``, 0-based; older files called it ``step``; ``reduce_op``, ``src``/``dst``,
  ``placements`` for a DTensor redistribution). Each is also an ordinary op step whose
  inputs are the tensors it sent and whose outputs are the tensors it wrote. A training
  step (``tracing.trace_step``) adds its backward's, DDP's gradient all-reduces included:
  ``"phase": "backward"``, see ``tracing.backward_collectives``.
- ``dtensors``: ``{tensor id: layout}`` for every ``DTensor`` the forward touched: its
  ``mesh`` (ranks, nested like the mesh), ``mesh_dims``, ``placements``
  (``[["shard", 0], ["replicate"], ["partial", "sum"]]``, one per mesh dim),
  ``local_shape`` and ``global_shape``. The tensor record's ``shape`` is the global shape
  (what the code sees); its statistics and kept value are of the local shard, so the
  shards of all ranks stitch back into the whole (``tracing.ranks``).

How collectives are seen
------------------------
``torch.distributed``'s collectives (``dist.all_reduce`` ...) are Python functions
calling into C++; most hand an active ``TorchFunctionMode`` the call, but the mode cannot
tell what they read from what they write (they write in place, often without bumping
``_version``, so a mode-only record loses the output). So they are wrapped, in
``torch.distributed`` and ``torch.distributed.distributed_c10d``, for the trace's duration
only (restored in ``finally``), and each wrapper records its call once, with the function
mode off inside it. Functional collectives
(``torch.distributed._functional_collectives``, which DTensor uses) reach the mode as
``torch.ops._c10d_functional`` ops: the tracer records them as usual and this module
adds their group. A DTensor redistribution (``Shard -> Replicate`` ...) is recorded as a
``redistribute`` step by wrapping ``redistribute_local_tensor`` where DTensor calls it.
An ``async_op=True`` collective is recorded when it is issued: its outputs keep their
shape but no statistics (they are not written yet).
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from tracing.capture.tracer import Tracer

from tracing.capture.op_names import FUNCTIONAL_COLLECTIVES
from tracing.file.rank_paths import (
    group_ready,
    output_path,
    rank_of_path,
    rank_path,
    rank_siblings,
)

# --------------------------------------------------------------------------- process group


def join_from_environment(backend: str | None = None) -> bool:
    """Join the process group that ``torchrun`` describes in the environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``...). True inside a group (joined now or before); False
    for a process not launched that way. ``backend`` defaults to ``nccl`` on a machine
    with CUDA, ``gloo`` otherwise."""
    dist = torch.distributed
    if group_ready():
        return True
    if not dist.is_available() or _int_env("WORLD_SIZE") is None or _int_env("RANK") is None:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(_int_env("LOCAL_RANK") or 0)
    dist.init_process_group(backend)
    return True


def process_info() -> dict[str, Any]:
    """Rank, world size, backend, local rank and host of this process's default group."""
    dist = torch.distributed
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": str(dist.get_backend()),
        "local_rank": _int_env("LOCAL_RANK"),
        "host": _host(),
    }


@functools.cache
def _host() -> str:
    return socket.gethostname()


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def group_description(group: Any) -> tuple[str, list[int]]:
    """``(name, global ranks)`` of a process group (None: the default one), a group
    name string (as functional collectives pass it), or a ``DeviceMesh``."""
    dist = torch.distributed
    c10d = dist.distributed_c10d
    try:
        if group is None:
            group = c10d._get_default_group()
        elif isinstance(group, str):
            group = c10d._resolve_process_group(group)
        elif not isinstance(group, c10d.ProcessGroup) and hasattr(group, "get_group"):
            group = group.get_group()  # a 1-D DeviceMesh
        return str(group.group_name), list(dist.get_process_group_ranks(group))
    except Exception:  # an unusual group: say what it is, never fail the trace
        return str(group), []


# --------------------------------------------------------------------------- DTensor


def _dtensor_type() -> type | None:
    """The DTensor class when something has imported it (never imported here: a model
    without DTensors pays nothing for it)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def placement_spec(p: Any) -> list:
    """``Shard(dim=1)`` -> ``["shard", 1]``, ``Replicate()`` -> ``["replicate"]``,
    ``Partial(sum)`` -> ``["partial", "sum"]`` (JSON-friendly, stable across versions)."""
    if p.is_shard():
        return ["shard", int(p.dim)]
    if p.is_replicate():
        return ["replicate"]
    if p.is_partial():
        return ["partial", str(getattr(p, "reduce_op", "sum"))]
    return [type(p).__name__]  # pragma: no cover - a placement added later


def dtensor_layout(t: Any) -> dict[str, Any]:
    """Mesh, placements, local and global shape of a DTensor (see the module docstring)."""
    mesh = t.device_mesh
    return {
        "mesh": mesh.mesh.tolist(),
        "mesh_dims": list(mesh.mesh_dim_names or ()),
        "coordinate": list(mesh.get_coordinate() or ()),
        "placements": [placement_spec(p) for p in t.placements],
        "local_shape": list(t._local_tensor.shape),
        "global_shape": list(t.shape),
    }


# --------------------------------------------------------------------------- collective table

# name -> (parameters that are read, parameters that are written), each a tensor or a list
_C10D_SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "all_reduce": (("tensor",), ("tensor",)),
    "all_reduce_coalesced": (("tensors",), ("tensors",)),
    "broadcast": (("tensor",), ("tensor",)),
    "reduce": (("tensor",), ("tensor",)),
    "all_gather": (("tensor",), ("tensor_list",)),
    "all_gather_into_tensor": (("input_tensor",), ("output_tensor",)),
    "all_gather_single": (("input_tensor",), ("output_tensor",)),  # FSDP2's unshard
    "gather": (("tensor",), ("gather_list",)),
    "scatter": (("scatter_list",), ("tensor",)),
    "reduce_scatter": (("input_list",), ("output",)),
    "reduce_scatter_tensor": (("input",), ("output",)),
    "reduce_scatter_single": (("input",), ("output",)),
    "all_to_all_single": (("input",), ("output",)),
    "all_to_all": (("input_tensor_list",), ("output_tensor_list",)),
    "send": (("tensor",), ()),
    "isend": (("tensor",), ()),
    "recv": ((), ("tensor",)),
    "irecv": ((), ("tensor",)),
    "barrier": ((), ()),
    "_broadcast_coalesced": (("tensors",), ("tensors",)),
}
C10D_COLLECTIVES = frozenset(_C10D_SIGNATURES)

# where DTensor calls redistribute_local_tensor from (each module bound the name itself)
_REDISTRIBUTE_USERS = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
)

_local = threading.local()  # .depth: collectives open on this thread (inner ones not recorded)


def in_collective() -> bool:
    """True inside a collective being recorded on this thread (the calls it makes, such
    as ``all_reduce`` inside ``all_reduce_coalesced``, are not recorded again)."""
    return bool(getattr(_local, "depth", 0))


_signatures: dict[Any, inspect.Signature | None] = {}


def _signature(func: Callable) -> inspect.Signature | None:
    """``inspect.signature`` of a collective, once per function (it costs ~0.1 ms, and a
    trace wraps every collective anew); None for a C++ function without one."""
    if func not in _signatures:
        try:
            _signatures[func] = inspect.signature(func)
        except (TypeError, ValueError):
            _signatures[func] = None
    return _signatures[func]


def _named_args(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return {}
    bound.apply_defaults()
    return bound.arguments


def _tensors_of(named: dict[str, Any], params: Sequence[str]) -> tuple[list, list[str]]:
    """The tensors among ``params`` (a tensor or a list of them), with their names."""
    tensors, names = [], []
    for p in params:
        v = named.get(p)
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            names.append(p)
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                if isinstance(item, torch.Tensor):
                    tensors.append(item)
                    names.append(f"{p}[{i}]")
    return tensors, names


def _scalar_detail(named: dict[str, Any]) -> dict[str, Any]:
    """The small arguments worth showing: reduce op, src/dst, async."""
    out: dict[str, Any] = {}
    for key in ("op", "src", "dst", "group_src", "group_dst", "async_op", "tag"):
        v = named.get(key)
        if v is None or (key == "tag" and v == 0) or (key == "async_op" and not v):
            continue
        out["reduce_op" if key == "op" else key] = _reduce_name(v) if key == "op" else v
    return out


def _reduce_name(op: Any) -> str:
    name = getattr(op, "name", None)
    return str(name if isinstance(name, str) else op).split(".")[-1].lower()


# --------------------------------------------------------------------------- the capture


class RankCapture:
    """What one rank's tracer adds while a process group is up (see module docstring).

    ``install()`` wraps the collectives, ``uninstall()`` puts the originals back (the
    tracer calls it in its cleanup, whatever happened); ``meta()`` is the rank's part
    of ``trace.meta``.
    """

    def __init__(self, tracer: Tracer):
        self.tracer = tracer
        self.info = process_info()
        self.collectives: list[dict[str, Any]] = []
        self.dtensors: dict[int, dict[str, Any]] = {}
        self._patched: list[tuple[Any, str, Any]] = []
        self._DTensor = _dtensor_type()

    # ---- install / uninstall

    def install(self) -> None:
        dist = torch.distributed
        for module in (dist, dist.distributed_c10d):
            for name in C10D_COLLECTIVES:
                original = getattr(module, name, None)
                if original is not None and not getattr(original, "_scratchformer", False):
                    self._patch(module, name, self._c10d_wrapper(name, original))
        for module_name in _REDISTRIBUTE_USERS:
            module = sys.modules.get(module_name)
            original = getattr(module, "redistribute_local_tensor", None)
            if original is not None and not getattr(original, "_scratchformer", False):
                self._patch(module, "redistribute_local_tensor", self._redistribute(original))

    def uninstall(self) -> None:
        while self._patched:
            module, name, original = self._patched.pop()
            setattr(module, name, original)

    def _patch(self, module: Any, name: str, wrapper: Callable) -> None:
        wrapper._scratchformer = True  # type: ignore[attr-defined]
        self._patched.append((module, name, getattr(module, name)))
        setattr(module, name, wrapper)

    # ---- recording

    def _c10d_wrapper(self, name: str, original: Callable) -> Callable:
        reads, writes = _C10D_SIGNATURES[name]
        signature = _signature(original)
        shown = name.lstrip("_")

        def collective(*args, **kwargs):
            if not self.active():
                return original(*args, **kwargs)  # nested in another, or outside the forward
            if signature is None:  # _broadcast_coalesced(group, tensors, size, src)
                named = dict(zip(("group", "tensors", "buffer_size", "src"), args))
            else:
                named = _named_args(signature, args, kwargs)
            ins, in_names = _tensors_of(named, reads)
            outs, out_names = _tensors_of(named, writes)
            group, ranks = group_description(named.get("group"))
            entry = {"op": shown, "api": "torch.distributed", "group": group, "ranks": ranks}
            entry.update(_scalar_detail(named))
            settled = not (named.get("async_op") or name in ("isend", "irecv"))

            def run():  # most of these hand a mode the call: recorded here, not twice
                with torch._C.DisableTorchFunction():
                    return original(*args, **kwargs)

            return self._record(entry, run, ins, in_names, outs, out_names, settled)

        collective.__wrapped__ = original  # type: ignore[attr-defined]
        return collective

    def _redistribute(self, original: Callable) -> Callable:
        def redistribute_local_tensor(local_tensor, current_spec, target_spec, *args, **kwargs):
            if not self.active():
                return original(local_tensor, current_spec, target_spec, *args, **kwargs)
            mesh = current_spec.mesh
            entry = {
                "op": "redistribute",
                "api": "DTensor",
                "group": ",".join(mesh.mesh_dim_names or ()) or "mesh",
                "ranks": mesh.mesh.flatten().tolist(),
                "placements": [
                    [placement_spec(p) for p in current_spec.placements],
                    [placement_spec(p) for p in target_spec.placements],
                ],
            }
            result: list = []

            def run():  # DTensor's own bookkeeping ops are not the model's: not recorded
                with torch._C.DisableTorchFunction():
                    out = original(local_tensor, current_spec, target_spec, *args, **kwargs)
                result.append(out)
                return out

            return self._record(entry, run, [local_tensor], ["local_tensor"], result, ["output"])

        redistribute_local_tensor.__wrapped__ = original  # type: ignore[attr-defined]
        return redistribute_local_tensor

    def active(self) -> bool:
        """Record a collective called now? Inside the traced forward, and not nested in
        another collective (which records it once)."""
        return not in_collective() and bool(self.tracer._stack)

    def record_op(self, entry, run, ins, in_names, outs, out_names, settled=True):
        """Run a collective and record it as one step: ``(step index, its result)``."""
        return self.tracer._record_external_op(
            entry["op"], run, ins, in_names, outs, out_names, settled
        )

    def _record(self, entry, run, ins, in_names, outs, out_names, settled=True):
        """Run a collective and record it as one op step (outputs read after it ran)."""
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            index, result = self.record_op(entry, run, ins, in_names, outs, out_names, settled)
        finally:
            _local.depth -= 1
        if index is not None:
            entry["index"] = index
            self.collectives.append(entry)
        return result

    def functional(self, index: int, func: Any, args: tuple, kwargs: dict | None) -> None:
        """Add the group of a functional collective the tracer recorded as step ``index``."""
        namespace = getattr(func, "namespace", None) or getattr(
            getattr(func, "overloadpacket", None), "namespace", None
        )
        if namespace != "_c10d_functional":
            return
        group_name = next((a for a in reversed(args) if isinstance(a, str)), None)
        if kwargs and isinstance(kwargs.get("group_name"), str):
            group_name = kwargs["group_name"]
        group, ranks = group_description(group_name)
        name = self.tracer._steps[index].op
        entry = {"op": name, "api": "functional", "group": group, "ranks": ranks, "index": index}
        reduce_op = next((a for a in args[1:] if isinstance(a, str) and a != group_name), None)
        if reduce_op is not None and "reduce" in name:
            entry["reduce_op"] = reduce_op
        self.collectives.append(entry)

    def local_view(self, rid: int, t: torch.Tensor) -> torch.Tensor | None:
        """For a DTensor: note its layout for record ``rid`` and return its local shard
        (statistics and kept values are of the shard); None for any other tensor."""
        if self._DTensor is None:
            self._DTensor = _dtensor_type()
            if self._DTensor is None:
                return None
        if not isinstance(t, self._DTensor):
            return None
        self.dtensors[rid] = dtensor_layout(t)
        return t._local_tensor

    def forget(self, first: int) -> None:
        """Drop layouts of records from ``first`` on (the tracer rolled them back)."""
        for rid in [r for r in self.dtensors if r >= first]:
            del self.dtensors[rid]

    def meta(self) -> dict[str, Any]:
        info = self.info
        return {
            "rank": info["rank"],
            "world_size": info["world_size"],
            "backend": info["backend"],
            "distributed": {
                "host": info["host"],
                "local_rank": info["local_rank"],
                "collectives": self.collectives,
                "dtensors": self.dtensors,
            },
        }


def capture_for(tracer: Tracer) -> RankCapture | None:
    """A :class:`RankCapture` for ``tracer`` inside a process group, else None."""
    return RankCapture(tracer) if group_ready() else None


__all__ = [
    "C10D_COLLECTIVES",
    "FUNCTIONAL_COLLECTIVES",
    "RankCapture",
    "capture_for",
    "dtensor_layout",
    "group_description",
    "group_ready",
    "join_from_environment",
    "output_path",
    "process_info",
    "rank_of_path",
    "rank_path",
    "rank_siblings",
]
