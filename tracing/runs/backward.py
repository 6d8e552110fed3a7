"""Record one training step: the forward as usual, the loss, then the backward pass.

>>> t = tracing.trace_step(model, tokens, loss_fn, optimizer=opt, targets=labels)  # doctest: +SKIP
>>> t.grad(t.steps[40].outputs[0]).stats            # doctest: +SKIP
>>> t.param_grad("blocks.0.attn.q_proj.weight")     # doctest: +SKIP

How the backward is seen
------------------------
The forward is recorded by the ordinary :class:`tracing.capture.Tracer`, which here also
notes, for every tensor it records, the autograd node that made it (``grad_fn``) and which
of that node's outputs it is (``output_nr``). Before ``loss.backward()`` the graph is
walked from ``loss.grad_fn`` and every node gets a *pre-hook*
(``torch.autograd.graph.Node.register_prehook``): autograd calls it just before the node
runs, with the gradients of the node's outputs — which are the gradients of the forward
tensors that node made. So each hook call is one backward step, in execution order, and
its gradients are those ``retain_grad()`` would keep (tensor hooks, the user's included,
run before node pre-hooks; ``retain_grad`` runs last among those). Hooks only read: the
gradients, ``.grad`` of the parameters and the optimizer state are those of an untraced
step, bit for bit. Every handle is removed in ``finally``.

The loss: a ``loss_fn`` given to :func:`trace_step` is called inside the same tracer, as
a module-like step ``loss`` of its own after the model's call (``trace.modules["loss"]``
says which function), so its ops are forward steps and the backward starts at them.

Which forward step a node belongs to: the one whose output it made. A node no recorded
tensor came from (the inside of one op, such as the weight transpose of ``F.linear``)
belongs to the node that passed it its gradient (``forward`` is then that node's step),
or to no step (``module == ""``: a loss computed outside the trace, by
:func:`record_step`'s ``loss_of`` without ``loss_type``). Such internal gradients keep
their shape only; gradients of recorded tensors and of parameters get statistics and
values as the capture level says, kept the way the forward keeps its values: in memory,
or (``out=PATH``) written to the file as each is produced.

What cannot be recorded is refused before anything changes: a reentrant
``torch.utils.checkpoint`` block (its inside runs without autograd) shows as a
``CheckpointFunctionBackward`` node in the graph walk, which raises
:class:`tracing.ReentrantCheckpointError` before any hook, backward or optimizer step,
and puts back the buffers and random state the forward moved.

Under ``torch.distributed`` the backward's collectives are steps too, where they ran:
``DistributedDataParallel``'s gradient all-reduces (one per bucket) and whatever a backward
hook runs through ``torch.distributed`` (see ``tracing.backward_collectives``).

The parameters' gradients are the ``AccumulateGrad`` steps (one per parameter, whatever
the number of uses: tied weights arrive summed). They are *this step's* gradient: if
``.grad`` already held something (no ``zero_grad()``), ``.grad`` is the sum and the
record is the new part.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from tracing.capture import distributed as distributed_mod
from tracing.capture.frames import ModuleSpec
from tracing.capture.options import DEFAULT_VALUE_CAP, CaptureOptions
from tracing.capture.tracer import Tracer
from tracing.errors import ReentrantCheckpointError, TraceError
from tracing.record import ModuleInfo, Step, TensorRecord, Trace
from tracing.runs.backward_collectives import backward_collectives
from tracing.stats import tensor_stats

_ACCUMULATE = "AccumulateGrad"
_REENTRANT = "CheckpointFunctionBackward"
_REENTRANT_NODE = getattr(
    getattr(torch.utils.checkpoint, "CheckpointFunction", None), "_backward_cls", None
)  # the class of a reentrant checkpoint's autograd node

REENTRANT_MESSAGE = (
    "trace_step cannot record a reentrant torch.utils.checkpoint block: with "
    "use_reentrant=True (the default when use_reentrant is not given) the block runs "
    "without autograd, so its gradients cannot be traced. Pass use_reentrant=False to "
    "checkpoint() (the same gradients, and PyTorch's recommended form; for a Hugging Face "
    "model: gradient_checkpointing_enable(gradient_checkpointing_kwargs="
    '{"use_reentrant": False})). Nothing was changed: no backward ran, no optimizer step '
    "was taken, .grad, the model's buffers and the random state are as they were."
)


def _is_reentrant(node: Any) -> bool:
    return type(node) is _REENTRANT_NODE or _node_name(node) == _REENTRANT


class _StepTracer(Tracer):
    """A :class:`Tracer` for a training step: it notes each recorded tensor's autograd
    node, records the loss function's call as a step of its own (:meth:`record_loss`),
    and leaves a streamed file open for the backward (:meth:`close_file`)."""

    def _reset(self) -> None:
        super()._reset()
        self.nodes: list[tuple[int, Any, int]] = []  # (record id, grad_fn, output_nr)
        self.loss_info: ModuleInfo | None = None  # the loss step's module, once it ran

    def _new_tensor(self, t, producer, version, source=None) -> int:
        rid = super()._new_tensor(t, producer, version, source)
        fn = t.grad_fn
        if fn is not None:
            self.nodes.append((rid, fn, t.output_nr))
        return rid

    def record_loss(self, type_name: str, loss_of: Callable, output: Any, inputs: tuple) -> Any:
        """``loss_of(output)`` as a forward step of its own, like a module call: a step
        ``loss`` (``loss_fn`` if the model has a ``loss``) with ``inputs`` as its inputs,
        the loss as its output and the loss function's ops inside it."""
        taken = {path for path, _ in self._named}
        path = next(p for p in ("loss", "loss_fn", "<loss>") if p not in taken)
        spec = ModuleSpec(path, type_name, False, ("output", "targets"))
        with torch._C.DisableTorchFunction():  # our own calls: not the loss's ops
            frame = self._enter_module(spec, loss_of, inputs, {})
        self.loss_info = ModuleInfo(path, type_name, None)
        loss = loss_of(output)
        with torch._C.DisableTorchFunction():
            return self._exit_module(frame, loss)

    def _finish(self, error: str | None) -> Trace:
        trace = super()._finish(error)
        if self.loss_info is not None:
            trace.modules[self.loss_info.path] = self.loss_info
        return trace

    def _close_file(self, trace: Trace) -> None:
        """Not yet: the backward's gradients stream into the same file."""

    def close_file(self, trace: Trace) -> None:
        """Finish the kept values (and a streamed file: its header, then ``trace.values``
        reads from it lazily)."""
        self._sink.finish()
        if self.out is not None and not self._sink.aborted:
            Tracer._close_file(self, trace)

    def abort_file(self) -> None:
        """No file (not even a partial one): the step was refused."""
        if not self._sink.aborted:
            self._sink.abort()


def _node_name(node: Any) -> str:
    """``MmBackward0``; ``AccumulateGrad`` without its C++ namespace."""
    return node.name().rsplit("::", 1)[-1]


def _graph_nodes(root: Any) -> list[tuple[Any, Any]]:
    """Every node reachable from ``root``, with the node it was first reached from
    (breadth first, so the parent is the nearest consumer toward the loss)."""
    seen = {id(root)}
    order = [(root, None)]
    i = 0
    while i < len(order):
        node = order[i][0]
        i += 1
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in seen:
                seen.add(id(nxt))
                order.append((nxt, node))
    return order


def _call(model: nn.Module, inputs: Any) -> Any:
    """``model(*inputs)`` for a tuple or list, ``model(**inputs)`` for a dict, else
    ``model(inputs)``."""
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(inputs)


def loss_from_output(output: Any) -> Any:
    """The loss in a model's output: the output itself, ``.loss``, ``["loss"]``, or the
    last element of a tuple ``(logits, loss)``."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and "loss" in output:
        return output["loss"]
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)) and output:
        loss = output[-1]
    return loss


def _compute_loss(output: Any, loss_fn: Callable | None, targets: Any) -> Any:
    if loss_fn is None:
        return loss_from_output(output)
    return loss_fn(output) if targets is None else loss_fn(output, targets)


def _check_loss(loss: Any) -> None:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            "trace_step needs a loss tensor: pass loss_fn (called as loss_fn(output) or "
            f"loss_fn(output, targets)), got {type(loss).__name__}"
        )
    if loss.numel() != 1:
        raise ValueError(
            f"the loss must be one number (a scalar tensor), got shape {tuple(loss.shape)}"
        )
    if loss.grad_fn is None:
        raise ValueError(
            "the loss does not require grad: no parameter took part in it (the model ran "
            "under torch.no_grad(), or every parameter has requires_grad=False)"
        )


# --------------------------------------------------------------------------- the recorder


class _BackwardRecorder:
    """Appends a backward step (and its gradient records) to ``trace`` per node that runs."""

    def __init__(self, trace: Trace, tracer: _StepTracer, capture: str, break_on: Any):
        self.trace = trace
        self.capture = capture
        self.value_cap = tracer.value_cap
        self.value_dtype = tracer.value_dtype
        self.sink = tracer._sink  # the forward's: memory, or the file being streamed
        self.param_names = tracer._param_names  # id(parameter) -> dotted name
        self.param_rids = {name: rid for rid, name in tracer._param_rids.items()}
        self.first_use: dict[int, int] = {}  # parameter record id -> first step using it
        for step in trace.steps:
            for rid in step.inputs:
                if rid in tracer._param_rids:
                    self.first_use.setdefault(rid, step.index)
        self.param_grads: dict[str, int] = {}
        self.skipped_values = 0
        self.hit = None  # the BreakHit that stopped the recording, if any
        self.condition = None
        if break_on:
            from tracing.breakpoints import as_condition

            self.condition = as_condition(break_on)
        # id(node) -> {output_nr: forward record id}, and the forward step of the node
        self.made: dict[int, dict[int, int]] = {}
        self.link: dict[int, int | None] = {}
        # who passes whom a gradient: id(node) -> ids of the nodes that consume its
        # outputs; id(node) -> its step once it ran; step -> the steps that passed it one
        self.consumers: dict[int, list[int]] = {}
        self.step_of: dict[int, int] = {}
        self.senders: dict[str, list[int]] = {}
        self.nonfinite: dict[int, tuple[bool, bool]] = {}  # step -> its gradients' (NaN, Inf)
        tensors = trace.tensors
        for rid, node, nr in tracer.nodes:
            outs = self.made.setdefault(id(node), {})
            outs.setdefault(nr, rid)
            if id(node) not in self.link:
                self.link[id(node)] = tensors[rid].producer

    def instrument(self, loss: torch.Tensor) -> list:
        """Pre-hooks on every node of the loss's graph; returns their handles."""
        nodes = _graph_nodes(loss.grad_fn)
        if any(_is_reentrant(node) for node, _ in nodes):  # its inside ran without autograd
            raise ReentrantCheckpointError(REENTRANT_MESSAGE)
        handles = []
        link = self.link
        consumers = self.consumers
        for node, parent in nodes:
            if id(node) not in link:  # inside one op, or the loss: its consumer's step
                link[id(node)] = None if parent is None else link.get(id(parent))
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    consumers.setdefault(id(nxt), []).append(id(node))
            handles.append(node.register_prehook(self._hook(node)))
        return handles

    def _hook(self, node: Any):
        def prehook(grad_outputs):
            if self.hit is None:  # (autograd runs hooks with grad mode off)
                self._record(node, grad_outputs)

        return prehook

    def _record(self, node: Any, grads: tuple) -> None:
        trace = self.trace
        steps = trace.steps
        index = len(steps)
        op = _node_name(node)
        forward = self.link.get(id(node))
        fstep = steps[forward] if forward is not None else None
        made = self.made.get(id(node), {})
        module, source, depth, parent = "", None, 0, None
        if fstep is not None:
            module, source, depth, parent = fstep.module, fstep.source, fstep.depth, fstep.parent
        param = None
        if op == _ACCUMULATE:
            param = self.param_names.get(id(node.variable))
            if param is not None:  # belongs where the parameter was first used
                of = self.param_rids.get(param)
                made = {} if of is None else {0: of}
                forward = self.first_use.get(of) if of is not None else None
                fstep = steps[forward] if forward is not None else None
                source = depth = parent = None
                if fstep is not None:
                    source, depth, parent = fstep.source, fstep.depth, fstep.parent
                module, depth = param.rpartition(".")[0], depth or 0
        self.step_of[id(node)] = index
        step_of = self.step_of
        self.senders[str(index)] = sorted(
            step_of[c] for c in self.consumers.get(id(node), ()) if c in step_of
        )
        ids, names, live = [], [], []
        for nr, g in enumerate(grads):
            if g is None:
                continue
            of = made.get(nr)
            rid = self._grad_record(g, index, of, True)  # every gradient: stats, values
            ids.append(rid)
            names.append("grad" if len(grads) == 1 else f"grad[{nr}]")
            live.append(g)
            if param is not None:
                self.param_grads[param] = rid
        step = Step(
            index=index, kind="backward", module=module, op=op, source=source,
            outputs=tuple(ids), output_names=tuple(names), depth=depth, parent=parent,
            forward=forward,
        )  # fmt: skip
        steps.append(step)
        if self.condition is not None:
            self._check(step, live)

    def _grad_record(self, g: torch.Tensor, producer: int, of: int | None, full: bool) -> int:
        tensors = self.trace.tensors
        rid = len(tensors)
        dims = None
        if of is not None:
            fwd = tensors[of]
            dims = fwd.dims if fwd.shape == tuple(g.shape) else None
        stats = key = None
        if full and self.capture != "shapes":
            stats = tensor_stats(g)
            if self.capture == "values":
                key = self._keep(rid, g)
        record = TensorRecord(
            id=rid, shape=tuple(g.shape), dtype=str(g.dtype).removeprefix("torch."),
            device=str(g.device), dims=dims, stats=stats, value_key=key,
            producer=producer, role="grad", grad_of=of,
        )  # fmt: skip
        tensors.append(record)
        return rid

    def _keep(self, rid: int, g: torch.Tensor) -> str | None:
        """A copy of ``g`` the way the forward keeps its values: into the arena, or
        written to the streamed file at once (then nothing stays in memory)."""
        dtype = self.value_dtype if self.value_dtype is not None else g.dtype
        if not g.is_floating_point():
            dtype = g.dtype
        if self.value_cap is not None and g.numel() * dtype.itemsize > self.value_cap:
            self.skipped_values += 1
            return None
        key, kept = self.sink.keep(f"t{rid}", g, dtype)
        if key is None:  # streaming, and the file cannot hold this dtype
            self.skipped_values += 1
        elif kept is not None:
            self.trace.values[key] = kept
        return key

    def _check(self, step: Step, live: list[torch.Tensor]) -> None:
        """Check the conditions on the gradients ``step`` received. Where they are the
        first non-finite ones, the hit is at the node that sent them (see
        ``tracing.breakpoints.NonFinite``)."""
        from tracing.breakpoints import Output, make_hit, nonfinite_counts, sender_hit

        senders = self.senders.get(str(step.index), [])
        got = [self.nonfinite[i] for i in senders if i in self.nonfinite]
        came_in = (any(n for n, _ in got), any(i for _, i in got))
        outputs = [
            Output(self.trace.tensors[rid], g, name, came_in=came_in)
            for rid, g, name in zip(step.outputs, live, step.output_names)
        ]
        counts = [nonfinite_counts(o) for o in outputs]
        nan, inf = any(n for n, _ in counts), any(i for _, i in counts)
        if nan or inf:
            self.nonfinite[step.index] = (nan, inf)
        reason = self.condition.check(step, "exit", outputs)
        if not reason:
            return
        if (nan or inf) and not any(came_in) and senders:
            self.hit = sender_hit(self.trace.steps, step, reason, senders)
        else:
            self.hit = make_hit(step, "exit", reason)


# --------------------------------------------------------------------------- updates


def update_ratios(model: nn.Module, before: dict[int, torch.Tensor]) -> dict[str, float]:
    """|Δw| / |w| per module (its own parameters, L2 norms), from copies taken before the
    optimizer step (used up: they become the deltas). A module whose weights did not move
    has ratio 0."""
    owned = [
        (path, p)
        for path, module in model.named_modules()
        for p in module.parameters(recurse=False)
        if id(p) in before
    ]
    if not owned:
        return {}
    unique = {id(p): p for _, p in owned}  # a tied parameter once
    old = [before[k] for k in unique]
    with torch.no_grad():  # fused passes; the copies become the deltas in place
        size = dict(zip(unique, _norms(old)))
        torch._foreach_sub_(old, list(unique.values()))
        moved = dict(zip(unique, _norms(old)))
    sums: dict[str, list[float]] = {}
    for path, p in owned:
        acc = sums.setdefault(path, [0.0, 0.0])
        acc[0] += moved[id(p)] ** 2
        acc[1] += size[id(p)] ** 2
    return {path: math.sqrt(m) / math.sqrt(s) for path, (m, s) in sums.items() if s > 0}


def _norms(tensors: list[torch.Tensor]) -> list[float]:
    """L2 norm of each tensor; of the whole tensor for a sharded DTensor parameter (FSDP2,
    tensor parallel: every rank reduces its shard's part, a collective all ranks make)."""
    norms = torch._foreach_norm(tensors)
    norms = [n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]
    return torch.stack(norms).tolist()


# --------------------------------------------------------------------------- entry point


def trace_step(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    targets: Any = None,
    before_step: Callable[[], Any] | None = None,
    capture: str = "stats",
    break_on: Any = None,
    value_cap: int | None = DEFAULT_VALUE_CAP,
    value_dtype: torch.dtype | None = None,
    dims: Mapping[str, int] | None = None,
    meta: Mapping[str, Any] | None = None,
    out: str | os.PathLike | None = None,
    ops: bool = True,
    edits: Any = None,
    naming: str = "proven",
    rebuild: Any = None,
    options: CaptureOptions | None = None,
) -> Trace:
    """Run one training step — forward, loss, backward, and ``optimizer.step()`` if given —
    and return it as one :class:`Trace` whose backward steps follow the forward ones.

    Args:
        model: any ``nn.Module``, in the mode it is in (``model.train()`` for dropout).
        inputs: what the model is called with: a tensor, a tuple (``model(*inputs)``) or a
            dict (``model(**inputs)``, e.g. a Hugging Face batch with ``labels``).
        loss_fn: ``loss_fn(output)`` or, with ``targets``, ``loss_fn(output, targets)``;
            its call is recorded as a forward step of its own, ``loss`` (after the model's
            call, like a module: its ops inside, the backward of those ops linked to them).
            None when the model's output is the loss, has ``.loss`` / ``["loss"]``, or
            is a ``(logits, loss)`` tuple (the loss is then among the model's steps).
        optimizer: stepped after the backward (the caller's training goes on); at
            ``stats`` and ``values`` the trace keeps each module's update ratio |Δw|/|w|
            in ``meta["update_ratios"]`` (a copy of the weights is taken before the step;
            ``shapes`` keeps no statistics, so none). Call ``zero_grad()`` before, as a
            training loop does.
        before_step: called between the backward and ``optimizer.step()`` (gradient
            clipping: ``lambda: clip_grad_norm_(model.parameters(), 1.0)``).
        capture, value_cap, value_dtype, dims, meta, ops, edits, options: as for
            :func:`tracing.trace` (one :class:`~tracing.capture.options.CaptureOptions`);
            the gradients follow the same level, cap and dtype, and an edit changes the
            forward the backward then runs through.
        out: write the trace to this file as it records: every kept value, forward and
            gradient, goes to the file when it is produced (memory stays flat), the header
            last, and ``trace.values`` then reads lazily from the file. A step that raises
            leaves the partial trace in the file (with its error).
        break_on: breakpoint conditions. Forward ones stop the forward (no backward then);
            gradient ones (``NonFinite()``, ``GradNormAbove(1e3)``...) end the recording at
            the first backward step that meets one. The backward still completes (``.grad``
            is whole) but the optimizer step is *not* taken. ``meta["stopped_at"]`` says where.

    Raises:
        TraceError: the forward, the loss or the backward raised (``.trace`` holds the
            step so far).
        ReentrantCheckpointError: the model uses ``torch.utils.checkpoint`` with
            ``use_reentrant=True`` (or without ``use_reentrant``), whose gradients cannot
            be recorded; raised before any backward, with the model, its buffers,
            ``.grad``, the optimizer and the CPU random state as they were.
        TypeError / ValueError: no scalar loss that requires grad.
    """
    opts = CaptureOptions.of(
        options, capture=capture, break_on=break_on, value_cap=value_cap,
        value_dtype=value_dtype, dims=dims, meta=meta, out=out, ops=ops, edits=edits,
        naming=naming, rebuild=rebuild,
    )  # fmt: skip
    return record_step(
        model,
        lambda: _call(model, inputs),
        lambda output: _compute_loss(output, loss_fn, targets),
        optimizer,
        loss_type=None if loss_fn is None else loss_fn_name(loss_fn),
        before_step=before_step,
        loss_targets=targets,
        options=opts,
    )


def loss_fn_name(loss_fn: Callable) -> str:
    """What the ``loss`` step calls its loss function: ``CrossEntropyLoss`` for a module,
    ``cross_entropy`` for a named function, ``loss_fn`` for a lambda."""
    if isinstance(loss_fn, nn.Module):
        return type(loss_fn).__name__
    name = getattr(loss_fn, "__name__", "")
    return name if name.isidentifier() else "loss_fn"


def record_step(
    model: nn.Module,
    run: Callable[[], Any],
    loss_of: Callable[[Any], Any],
    optimizer: torch.optim.Optimizer | None = None,
    *,
    loss_type: str | None = None,
    loss_targets: Any = None,
    before_step: Callable[[], Any] | None = None,
    capture: str = "stats",
    break_on: Any = None,
    value_cap: int | None = DEFAULT_VALUE_CAP,
    value_dtype: torch.dtype | None = None,
    dims: Mapping[str, int] | None = None,
    meta: Mapping[str, Any] | None = None,
    out: str | os.PathLike | None = None,
    ops: bool = True,
    edits: Any = None,
    naming: str = "proven",
    rebuild: Any = None,
    options: CaptureOptions | None = None,
) -> Trace:
    """:func:`trace_step` for a forward given as a function: ``run()`` calls the model,
    ``loss_of(output)`` returns the loss (``tracing.watch`` replays a user's step so).
    With ``loss_type`` (the loss function's name) the ``loss_of`` call is recorded as the
    step ``loss``, with ``loss_targets`` among its inputs; without, it only looks the
    loss up in the output."""
    opts = CaptureOptions.of(
        options, capture=capture, break_on=break_on, value_cap=value_cap,
        value_dtype=value_dtype, dims=dims, meta=meta, out=out, ops=ops, edits=edits,
        naming=naming, rebuild=rebuild,
    )  # fmt: skip
    if opts.out is not None:  # one file per rank under torch.distributed
        opts = opts.replace(out=distributed_mod.output_path(opts.out))
    capture, break_on = opts.capture, opts.break_on
    forward_breaks = [c for c in _as_list(break_on) if not _gradient_only(c)] or None
    tracer = _StepTracer(model, train=model.training, options=opts.replace(break_on=forward_breaks))
    undo = _Undo(model)
    try:
        trace = _run_step(tracer, run, loss_of, optimizer, before_step, capture, break_on,
                          loss_type, loss_targets)  # fmt: skip
    except BaseException as e:
        if isinstance(e, ReentrantCheckpointError):  # refused: nothing kept, nothing changed
            tracer.abort_file()
            undo.restore()
            raise
        trace = getattr(e, "trace", None) or tracer.trace
        if trace is not None and not isinstance(e, GeneratorExit):  # sys.exit() too
            trace.error = trace.error or f"{type(e).__name__}: {e}"
            tracer.close_file(trace)  # a streamed file keeps the step so far
        else:
            tracer.abort_file()
        raise
    tracer.close_file(trace)
    return trace


class _Undo:
    """What a refused step puts back: the model's buffers (a forward moves BatchNorm's
    running statistics) and the CPU random state (dropout drew from it). Boolean buffers
    (masks) are never written by a forward, so they are not copied."""

    def __init__(self, model: nn.Module):
        self.rng = torch.get_rng_state()
        self.buffers = [(b, b.detach().clone()) for b in model.buffers() if b.dtype != torch.bool]

    def restore(self) -> None:
        with torch.no_grad():
            for b, kept in self.buffers:
                b.copy_(kept)
        torch.set_rng_state(self.rng)


def _run_step(tracer, run, loss_of, optimizer, before_step, capture, break_on, loss_type,
              loss_targets) -> Trace:  # fmt: skip
    """The step itself: forward (and loss) under ``tracer``, backward, optimizer step."""
    model = tracer.model
    with torch.enable_grad():
        with tracer:
            output = run()
            if loss_type is not None:
                inputs = (output,) if loss_targets is None else (output, loss_targets)
                loss = tracer.record_loss(loss_type, loss_of, output, inputs)
        trace = tracer.trace
        assert trace is not None
        trace.meta["phase"] = "training step"
        if "stopped_at" in trace.meta:
            return trace  # a forward breakpoint: no loss, no backward
        if loss_type is None:
            try:
                loss = loss_of(output)
            except Exception as e:
                trace.error = f"{type(e).__name__}: {e}"
                raise TraceError(f"the loss could not be computed: {trace.error}", trace) from e
        _check_loss(loss)
        trace.meta["loss"] = float(loss.detach())
        trace.meta["forward_steps"] = len(trace.steps)
        recorder = _BackwardRecorder(trace, tracer, capture, break_on)
        trace.meta["param_grads"] = recorder.param_grads  # filled as the backward runs
        trace.meta["grad_senders"] = recorder.senders  # step -> the steps passing it grads
        handles: list = []
        try:
            handles = recorder.instrument(loss)
            with backward_collectives(recorder, model) or nullcontext():
                loss.backward()
        except ReentrantCheckpointError:
            raise
        except Exception as e:
            trace.error = f"{type(e).__name__}: {e}"
            raise TraceError(f"the backward pass failed: {trace.error}", trace) from e
        finally:
            for h in handles:
                h.remove()
            tracer.nodes = []  # no autograd node outlives the step
    if recorder.skipped_values:
        trace.meta["values_skipped"] = trace.meta.get("values_skipped", 0) + recorder.skipped_values
    if recorder.hit is not None:
        trace.meta["stopped_at"] = recorder.hit.to_meta()
        return trace
    if before_step is not None:
        before_step()
    if optimizer is not None:
        trace.meta["optimizer"] = type(optimizer).__name__
        if capture == "shapes":  # no statistics at this level, so no copy of the weights
            optimizer.step()
            return trace
        params = [p for group in optimizer.param_groups for p in group["params"]]
        before = {id(p): p.detach().clone() for p in params}
        optimizer.step()
        trace.meta["update_ratios"] = update_ratios(model, before)
    return trace


def _as_list(break_on: Any) -> list:
    if not break_on:
        return []
    from tracing.breakpoints import Condition

    return [break_on] if isinstance(break_on, Condition) else list(break_on)


def _gradient_only(condition: Any) -> bool:
    """Conditions that can only hold at a backward step (not worth checking in the forward)."""
    return bool(getattr(condition, "gradient_only", False))


__all__ = ["loss_fn_name", "loss_from_output", "record_step", "trace_step", "update_ratios"]
