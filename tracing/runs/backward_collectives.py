"""Collectives of a traced training step's backward: DDP's gradient all-reduces, and every
``torch.distributed`` call a backward hook makes (FSDP's reduce-scatters, a comm hook's).

Under ``torch.distributed``, :func:`tracing.trace_step` opens a :class:`BackwardCollectives`
around ``loss.backward()``. Each collective that runs becomes a backward step (``kind ==
"backward"``) where it ran, among the autograd nodes' steps, and an entry of
``meta["distributed"]["collectives"]`` with ``"phase": "backward"``.

DDP's all-reduce
----------------
``DistributedDataParallel`` reduces gradients from C++: its ``Reducer`` calls the process
group's ``allreduce`` once per *bucket* (a flat buffer holding several parameters'
gradients, scaled by ``1 / world size``) as soon as the bucket's last gradient is ready.
No Python function runs, so nothing can be wrapped. What the reducer does allow is
``Reducer._update_process_group`` (DDP's own hook for changing the group of a live model):
for the backward only, the reducer is handed a :class:`_ReducerGroup`, a Python
``ProcessGroup`` that records each call and passes it on, unchanged, to DDP's real group;
the real group is handed back in ``finally``. The reducer's own code path runs as always
(no comm hook is registered, its built-in scaling and sum are used), so gradients,
``.grad`` and the optimizer's state are those of an untraced step bit for bit, and nothing
stays attached to the model. (``register_comm_hook`` would also see the buckets, but the
reducer accepts one hook per model, for good, and replaces its built-in path.)

A bucket's step names its parameters: its inputs are what this rank sends (each
gradient as the bucket holds it, already divided by the world size), its outputs the
averaged gradients every rank receives, which is what ``.grad`` holds after the step
(read when the backward has finished: the all-reduce runs asynchronously).
``meta["distributed"]["reduced_grads"]`` maps each parameter to its averaged gradient's
record (``meta["param_grads"]`` keeps this rank's own gradient).

Its cost: the buckets' layout is read before the backward
(``Reducer._get_zeros_like_grad_buckets``, which also allocates a zeroed copy of the
buckets for a moment: memory the size of the gradients), and kept until the reducer
rebuilds its buckets (see :func:`_bucket_layout`); each bucket's gradients are read twice
(sent, received) at the capture level's cost.

FSDP (``fully_shard``, and ``FullyShardedDataParallel``, which on CPU needs
``device_id=torch.device("cpu")``) gathers and reduce-scatters through
``torch.distributed``'s functions: those are the wrapped ones, recorded where they ran.

What is not seen
----------------
- DDP with a communication hook of its own (``register_comm_hook``, mixed precision):
  the reducer calls the hook instead, so only what the hook runs through
  ``torch.distributed``'s functions is recorded (a built-in C++ hook, such as
  ``FP16_COMPRESS``, is not seen); ``meta["notes"]`` says so.
- ``no_sync()``: DDP reduces nothing in that backward (gradients accumulate locally and
  the next synchronized step reduces their sum); ``meta["notes"]`` says so.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tracing.capture.distributed import RankCapture, group_description, group_ready, in_collective
from tracing.capture.source import caller_location
from tracing.record import Step, TensorRecord
from tracing.stats import tensor_stats

if TYPE_CHECKING:  # pragma: no cover
    from tracing.runs.backward import _BackwardRecorder


def _ddp_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every ``DistributedDataParallel`` in ``model`` (usually the model itself)."""
    from torch.nn.parallel import DistributedDataParallel

    return [(p, m) for p, m in model.named_modules() if isinstance(m, DistributedDataParallel)]


class _Bucket:
    """One DDP bucket: its parameters' names, shapes and offsets in the flat buffer."""

    def __init__(self, index: int, params: list, names: dict[int, str]):
        self.index = index
        self.names = [names.get(id(p), f"parameter {i}") for i, p in enumerate(params)]
        self.shapes = [tuple(p.shape) for p in params]
        # the reducer's layout: one after another, each in its parameter's strides when
        # those are dense, else row-major
        self.strides = [p.stride() if _dense(p) else None for p in params]
        self.offsets, offset = [], 0
        for p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.numel = offset

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's gradient in the bucket's flat buffer, as the reducer views it."""
        views = []
        for shape, stride, offset in zip(self.shapes, self.strides, self.offsets):
            if stride is not None:
                views.append(flat.as_strided(shape, stride, offset))
            else:
                views.append(flat.narrow(0, offset, math.prod(shape)).view(shape))
        return views


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some order of its dims is row-major (size-1 dims aside)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP -> (key, buckets)


def _bucket_layout(ddp: Any, names: dict[int, str]) -> list[_Bucket]:
    """The buckets of ``ddp``'s reducer, in order. Reading them allocates a zeroed copy of
    every bucket (the size of the gradients: ~0.4 s for gpt2-small), so the layout is kept,
    beside the model rather than on it, until the reducer rebuilds its buckets (once, after
    the first step) or gets another group; a bucket whose size does not match when it is
    reduced is recorded without names."""
    key = (id(ddp.reducer), getattr(ddp, "_has_rebuilt_buckets", None), id(ddp.process_group))
    kept = _LAYOUTS.get(ddp)
    if kept is None or kept[0] != key:
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
        kept = _LAYOUTS[ddp] = (key, [_Bucket(b.index(), b.parameters(), names) for b in buckets])
    return kept[1]


class _ReducerGroup(torch.distributed.ProcessGroup):
    """What a DDP reducer is handed during a traced backward: DDP's group, recording each
    ``allreduce`` the reducer makes (see the module docstring). Every call goes to the real
    group unchanged, with the same tensors and options."""

    def __init__(self, real: Any, ddp: _DDPState):
        super().__init__(real.rank(), real.size())
        self._real = real
        self._ddp = ddp

    def allreduce(self, tensors, opts=None):
        return self._ddp.all_reduce(self._real, tensors, opts)

    def broadcast(self, tensors, opts=None):
        real = self._real
        return real.broadcast(tensors, opts) if opts is not None else real.broadcast(tensors)

    def getBackendName(self) -> str:
        return self._real.name()


class _DDPState:
    """One DDP module during the traced backward: its buckets and the reducer's group."""

    def __init__(self, owner: BackwardCollectives, path: str, ddp: nn.Module):
        self.owner = owner
        self.path = path
        self.ddp = ddp
        names = owner.recorder.param_names
        self.buckets = _bucket_layout(ddp, names)
        self.reduced = 0  # buckets reduced so far in this backward
        self.recording: _ReducerGroup | None = None  # what the reducer holds meanwhile
        self.group, self.ranks = group_description(ddp.process_group)

    def all_reduce(self, real: Any, tensors: list, opts: Any) -> Any:
        """The reducer's ``allreduce``: a bucket (or, with ``find_unused_parameters``, the
        map of parameters each rank used), recorded, then run on the real group."""

        def run():
            return real.allreduce(tensors, opts) if opts is not None else real.allreduce(tensors)

        owner = self.owner
        if not owner.recording() or len(tensors) != 1:
            return run()
        flat = tensors[0]
        entry: dict[str, Any] = {
            "op": "all_reduce", "api": "DDP", "group": self.group, "ranks": self.ranks,
            "reduce_op": "sum", "phase": "backward",
        }  # fmt: skip
        if not flat.is_floating_point():  # find_unused_parameters: who used what
            entry["what"] = "unused-parameter map"
            return owner.record(entry, run, [flat], ["used"], [flat], ["used"], self.path)
        bucket = self.buckets[self.reduced] if self.reduced < len(self.buckets) else None
        self.reduced += 1
        if bucket is None or bucket.numel != flat.numel() or flat.layout != torch.strided:
            entry["what"] = "gradient bucket"
            return owner.record(entry, run, [flat], ["bucket"], [flat], ["bucket"], self.path)
        entry.update(
            what="gradient bucket", bucket=bucket.index, params=bucket.names,
            prescale=f"1/{real.size()}",
        )  # fmt: skip
        views = bucket.views(flat)
        return owner.record(
            entry, run, views, bucket.names, views, bucket.names, self.path, grads=bucket.names
        )


class BackwardCollectives(RankCapture):
    """Records the collectives of one traced backward (see the module docstring): a context
    manager around ``loss.backward()``; the trace gains its steps, entries and notes."""

    def __init__(self, recorder: _BackwardRecorder, model: nn.Module):
        super().__init__(tracer=None)  # type: ignore[arg-type] - records through the recorder
        self.recorder = recorder
        self.trace = recorder.trace
        distributed = self.trace.meta.setdefault("distributed", {})
        self.collectives = distributed.setdefault("collectives", [])
        self.reduced_grads: dict[str, int] = {}
        self._pending: list[tuple[int, torch.Tensor]] = []  # outputs not written yet
        self._ddps: list[_DDPState] = []
        for path, ddp in _ddp_modules(model):
            self._prepare(path, ddp)

    def _note(self, text: str) -> None:
        """Say in ``meta["notes"]`` what this trace cannot show."""
        notes = self.trace.meta.setdefault("notes", [])
        if text not in notes:
            notes.append(text)

    def _prepare(self, path: str, ddp: Any) -> None:
        hook = ddp._get_ddp_logging_data().get("comm_hook")
        if hook:
            self._note(
                f"DDP has a communication hook ({hook}): its gradient buckets show only "
                "where the hook calls torch.distributed's collectives (a built-in C++ hook "
                "is not seen)"
            )
            return
        if not ddp.require_backward_grad_sync:
            self._note(
                "DDP's no_sync(): this backward reduces no gradients (they accumulate "
                "locally; the next synchronized step all-reduces their sum)"
            )
            return
        self._ddps.append(_DDPState(self, path, ddp))

    # ---- context

    def __enter__(self) -> BackwardCollectives:
        self.install()
        try:
            for state in self._ddps:  # (kept alive here: the reducer holds the C++ half)
                state.recording = _ReducerGroup(state.ddp.process_group, state)
                state.ddp.reducer._update_process_group(state.recording)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._restore()
        if exc_type is None:
            self._settle()
        if self.reduced_grads:
            self.trace.meta["distributed"]["reduced_grads"] = self.reduced_grads

    def _restore(self) -> None:
        for state in self._ddps:
            if state.recording is not None:
                state.ddp.reducer._update_process_group(state.ddp.process_group)
                state.recording = None
        self.uninstall()

    # ---- recording

    def recording(self) -> bool:
        return self.recorder.hit is None

    def active(self) -> bool:
        return self.recording() and not in_collective()

    def record_op(self, entry, run, ins, in_names, outs, out_names, settled=True):
        """A ``torch.distributed`` function called during the backward (a comm hook's,
        FSDP's): a step under no module, at the user's line that called it."""
        entry["phase"] = "backward"
        source = caller_location(1)
        return self._step(entry, run, ins, in_names, outs, out_names, "", source, settled)

    def record(self, entry, run, ins, in_names, outs, out_names, module, grads=None):
        """Record a collective of the reducer's: run it, note its entry, return its work."""
        index, work = self._step(
            entry, run, ins, in_names, outs, out_names, module, None, False, grads
        )
        entry["index"] = index
        self.collectives.append(entry)
        return work

    def _step(self, entry, run, ins, in_names, outs, out_names, module, source, settled,
              grads=None):  # fmt: skip
        """Append the step: inputs read before ``run()`` (it may write into them at once),
        outputs after it, or once the backward has finished when not ``settled``."""
        trace = self.trace
        index = len(trace.steps)
        of = [self._param_rid(n) for n in grads] if grads else [None] * len(ins)
        in_ids = [self._new_record(t, None, rid, True) for t, rid in zip(ins, of)]
        result = run()
        of = [self._param_rid(n) for n in grads] if grads else [None] * len(outs)
        out_ids = [self._new_record(t, index, rid, settled) for t, rid in zip(outs, of)]
        if grads:
            self.reduced_grads.update(zip(grads, out_ids))
        step = Step(
            index=index, kind="backward", module=module, op=entry["op"],
            source=source, inputs=tuple(in_ids),
            outputs=tuple(out_ids), input_names=tuple(in_names), output_names=tuple(out_names),
        )  # fmt: skip
        trace.steps.append(step)
        return index, result

    def _param_rid(self, name: str) -> int | None:
        return self.recorder.param_rids.get(name)

    def _new_record(self, t: torch.Tensor, producer: int | None, grad_of, settled: bool) -> int:
        """A record of ``t``: statistics (and value) as the capture level says, now when
        ``settled``, else when the backward has finished (:meth:`_settle`)."""
        tensors = self.trace.tensors
        rid = len(tensors)
        record = TensorRecord(
            id=rid, shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."),
            device=str(t.device), producer=producer, role="grad" if grad_of is not None else None,
            grad_of=grad_of,
        )  # fmt: skip
        tensors.append(record)
        if settled:
            self._fill(rid, t)
        else:
            self._pending.append((rid, t))
        return rid

    def _fill(self, rid: int, t: torch.Tensor) -> None:
        capture = self.recorder.capture
        if capture == "shapes" or t.layout != torch.strided:
            return
        stats = tensor_stats(t)
        key = self.recorder._keep(rid, t) if capture == "values" else None
        tensors = self.trace.tensors
        tensors[rid] = replace(tensors[rid], stats=stats, value_key=key)

    def _settle(self) -> None:
        """Outputs of the asynchronous all-reduces, read now that the backward waited on
        them (what ``.grad`` holds)."""
        for rid, t in self._pending:
            self._fill(rid, t)
        self._pending = []


def backward_collectives(recorder: _BackwardRecorder, model: nn.Module):
    """A :class:`BackwardCollectives` inside a process group, else None."""
    return BackwardCollectives(recorder, model) if group_ready() else None


__all__ = ["BackwardCollectives", "backward_collectives"]
