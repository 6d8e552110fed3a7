"""The Tracer (a context manager that owns every hook and instrument) and :func:`trace`."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tracing.attention_flow import MIXES, MapFinder, returned_weights
from tracing.capture.attention_roles import proven_maps
from tracing.capture.drafts import StepDraft, TensorDraft
from tracing.capture.frames import Frame
from tracing.capture.op_names import (
    UNSUPPORTED,
    force_eager,
    mha_signature,
    op_input_names,
    tensor_kind,
)
from tracing.capture.options import DEFAULT_VALUE_CAP, CaptureOptions
from tracing.capture.postmortem import embed_sources, failure_of
from tracing.capture.recorders import COLLECTIVE_OPS, NOTED_OPS, OpMode, module_recorder
from tracing.capture.source import caller_location, location_from_traceback
from tracing.capture.structure import IDLE_CALLS, global_hooks, structure_of, wrap_forward
from tracing.capture.value_sinks import StreamedValues, ValueArena
from tracing.dims.evidence import Subject
from tracing.dims.prove import name_trace
from tracing.errors import TraceError, TraceFileError
from tracing.file.rank_paths import group_ready, output_path
from tracing.record import (
    Failure,
    SourceLocation,
    Step,
    TensorRecord,
    Trace,
)
from tracing.safe_text import exception_text
from tracing.stats import StatsCollector

if TYPE_CHECKING:  # pragma: no cover
    from tracing.capture.distributed import RankCapture

_Disable = torch._C.DisableTorchFunction
_Tensor = torch.Tensor


# --------------------------------------------------------------------------- tracer


META_NOTE = (
    "meta tensors: recorded by shape only (meta device): values, stats and attention maps "
    "not computed"
)
"""The note a trace of a model on the meta device carries: shapes are real, data is not."""


class Tracer:
    """Context manager that records every module call and tensor op of the model's forward.

    >>> with Tracer(model, capture="stats") as tracer:   # doctest: +SKIP
    ...     logits = model(tokens)
    >>> tracer.trace                                      # doctest: +SKIP

    While active, the model runs in eval mode (``train=True`` keeps training mode). On
    exit, whatever happened, every hook handle is removed, the function mode is exited and
    each module's ``training`` flag is restored. If the forward raised, the exception is
    re-raised as :class:`tracing.TraceError` (``from`` the original) whose ``.trace`` holds
    everything recorded up to the failing step. A ``KeyboardInterrupt`` goes on up as it
    is, with the partial trace (``complete`` False) as its ``.trace``.

    What is recorded, and what is not:

    - only the thread that entered the tracer: another thread calling the same model
      meanwhile runs normally and is not mixed into the trace;
    - never the tracer's own work (its statistics and copies), also when tracers nest;
    - tensors with no data or no dense form here (``meta``, sparse, ``MaskedTensor``...)
      are recorded by shape only, and ``trace.meta["notes"]`` says so;
    - a ``torch.compile``d model (or part) runs eagerly while traced, with a note.

    Args:
        model: any ``nn.Module``.
        capture: ``"shapes"``, ``"stats"`` or ``"values"``.
        dims: sizes for symbolic axis names, e.g. ``{"B": 1, "T": 12, "C": 64}``; missing
            letters are read from ``model.config`` and the first input's shape.
        value_cap: at ``"values"``, tensors larger than this many bytes keep no copy
            (``None``: every tensor keeps one; with ``out``, memory stays flat anyway).
        value_dtype: at ``"values"``, store floating copies in this dtype (e.g. float16).
        train: trace in training mode (dropout active) instead of eval mode.
        ops: also record tensor ops (not only module calls).
        meta: extra entries for ``trace.meta`` (e.g. ``tokens``, ``text``).
        break_on: breakpoint conditions (``tracing.breakpoints``: ``NonFinite()``,
            ``AbsAbove(1e4)``, ``ModuleIs("blocks.2")``...). The forward stops at the first
            step that meets one; the trace ends there, with ``meta["stopped_at"]``.
        edits: edits applied while the model runs (``tracing.edits``); the trace records
            where each applied in ``meta["edits"]``. An edit that matched nothing raises
            :class:`tracing.edits.EditError`.
        out: write the trace to this file while it records: each kept value goes to the
            file as it is produced (memory stays flat whatever the trace size), the
            header when the trace finishes, and ``trace.values`` then reads lazily from
            the file. An interrupted capture leaves no complete-looking file; a forward
            that raises leaves the partial trace in it.
        options: a :class:`~tracing.capture.options.CaptureOptions` holding any of the
            above (the keywords given beside it take precedence where not the default).
    """

    def __init__(
        self,
        model: nn.Module,
        capture: str = "stats",
        *,
        dims: Mapping[str, int] | None = None,
        value_cap: int | None = DEFAULT_VALUE_CAP,
        value_dtype: torch.dtype | None = None,
        train: bool = False,
        ops: bool = True,
        meta: Mapping[str, Any] | None = None,
        break_on: Any = None,
        edits: Any = None,
        out: str | os.PathLike | None = None,
        naming: str = "proven",
        rebuild: Any = None,
        options: CaptureOptions | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"Tracer needs an nn.Module, got {type(model).__name__}")
        opts = CaptureOptions.of(
            options, capture=capture, dims=dims, value_cap=value_cap, value_dtype=value_dtype,
            ops=ops, meta=meta, break_on=break_on, edits=edits, out=out, naming=naming,
            rebuild=rebuild,
        )  # fmt: skip
        self.options = opts
        self.model = model
        self.capture = opts.capture
        self.dims = dict(opts.dims) if opts.dims else None
        self.value_cap = opts.value_cap
        self.out = opts.out
        self.value_dtype = opts.value_dtype
        self.train = train
        self.ops = opts.ops
        self.extra_meta = dict(opts.meta) if opts.meta else {}
        self._breaker = None
        if opts.break_on:
            from tracing.breakpoints import LiveBreaker

            self._breaker = LiveBreaker(opts.break_on)
        self._edits = None
        if opts.edits:
            from tracing.capture.edits import EditPlan

            self._edits = EditPlan.of(opts.edits)
            self._edits.check_model(model)
            if self._edits.op_names and not opts.ops:
                raise ValueError("op sites need ops=True: module-only tracing sees no ops")
        self.trace: Trace | None = None
        self.output: Any = None  # the root module's last output, when it returned
        self._active = False
        self._gc_paused = False
        self._holds_cache = False

    # ---- lifecycle

    def __enter__(self) -> Tracer:
        if self._active:
            raise RuntimeError("this Tracer is already active")
        self._reset()
        self._thread = threading.get_ident()  # only this thread's calls are recorded
        self._enter_module, self._exit_module = module_recorder(self)
        model = self.model
        want = self.train
        # remember only the flags we change; model.train() is skipped when none differ
        self._training = [(m, m.training) for _, m in self._named if m.training != want]
        if self._training:
            model.train(want)
        self._handles = []
        self._wrapped = []
        # A trace makes thousands of small containers and keeps every one of them: the
        # cyclic collector would scan them again and again for nothing (as ``timeit``
        # does, it is paused while recording; reference counting still frees memory).
        # Paused before the wrappers are made: a full collection that the objects made
        # before the trace (the model's) have made due would otherwise fall on them, the
        # first thing here that allocates. On exit the trace's objects are made old at once,
        # so that neither this call nor the caller's next allocation walks them (see
        # __exit__).
        self._gc_paused = gc.isenabled()
        gc.disable()
        try:
            self._instrument_all()
            # torch.distributed: collectives wrapped for the trace's duration (the stage
            # that does it is imported inside a process group only)
            if group_ready():
                from tracing.capture.distributed import RankCapture

                self._ranks = RankCapture(self)
                self._ranks.install()
            self._eager = force_eager(self._named)
            if self._eager is not None:
                self._notes.setdefault(
                    "the model is torch.compile'd: it ran eagerly while traced (compiled "
                    "code cannot be followed op by op)"
                )
            if self.ops:
                self._mode = OpMode(self)
                self._mode.__enter__()
        except BaseException:
            if self._gc_paused:
                self._gc_paused = False
                gc.enable()
            self._cleanup()
            self._sink.abort()
            raise
        self._active = True
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            return self._exit(exc, tb)
        finally:
            # the recorders close over this tracer: dropped, no cycle keeps the trace (and
            # the arena chunk of its values) alive until the next full collection; the
            # drafts, frozen into the trace now, go before the collection below walks them
            self._enter_module = self._exit_module = None
            if self.trace is not None:
                self._steps, self._tensors, self._ids = [], [], {}
            if self._gc_paused:
                self._gc_paused = False
                # the trace's new objects go straight to the oldest generation (freeze,
                # then unfreeze: two list splices): a young collection would walk every
                # one of them now, or on the caller's next allocation, for nothing — the
                # trace keeps them. A full collection sees them as it sees any old object.
                # Where a heap is kept frozen already (the app's long_lived), they join it:
                # unfreezing would thaw what its owner froze.
                frozen = gc.get_freeze_count() > 0
                gc.freeze()
                if not frozen:
                    gc.unfreeze()
                gc.enable()

    def _exit(self, exc: BaseException | None, tb) -> bool:
        self._cleanup()
        self._active = False
        if self._breaker is not None and isinstance(exc, self._breaker.Stop):
            last = len(self._steps) - 1
            for index, *_ in self._stack:  # close the module calls the stop interrupted
                self._steps[index].end = last
            self._stack.clear()
            self.trace = self._finish_kept(None)
            self.trace.meta["stopped_at"] = exc.hit.to_meta()
            return True  # stopped on purpose: the trace so far, no error
        error = None
        failed_inside = exc is not None and (self._stack or self._failed_step is not None)
        if failed_inside and isinstance(exc, Exception):
            error = self._mark_failure(exc, tb)
        elif failed_inside and not isinstance(exc, GeneratorExit):  # Ctrl-C, SystemExit...
            # interrupted: the trace so far is partial, and says so; Ctrl-C goes on up
            # with it attached (``exc.trace``), so a caller may still save it (a streamed
            # file is closed with it: a valid trace that says it was interrupted)
            stop = self._mark_failure(exc, tb)
            self._second_pass_ok = False  # the user asked it to stop: run nothing more
            if isinstance(exc, KeyboardInterrupt):
                stop = "KeyboardInterrupt: interrupted before the forward ended"
            self.trace = self._finish_kept(stop)
            exc.trace = self.trace  # type: ignore[union-attr]
            return False
        if (exc is not None and not isinstance(exc, Exception)) or isinstance(exc, TraceFileError):
            self._second_pass_ok = False
        if exc is not None and not isinstance(exc, (Exception, KeyboardInterrupt)):
            self._sink.abort()  # stopped from outside (exit...): no file that looks complete
        self.trace = self._finish_kept(error)
        if isinstance(exc, KeyboardInterrupt):  # after the forward returned: all of it kept
            exc.trace = self.trace  # type: ignore[attr-defined]
            return False
        if isinstance(exc, TraceFileError):  # the streamed file could not grow: named as is
            exc.trace = self.trace  # type: ignore[attr-defined]
            raise exc
        if error is not None:
            module = getattr(exc, "head_module", None)
            if module is not None:  # head= where there is no heads axis: name the site
                from tracing.capture.heads import head_site_hint

                error += head_site_hint(self.trace, module)
            raise TraceError(error, self.trace) from exc
        if self._edits is not None and exc is None:
            self._edits.check_matched()
        return False

    def _cleanup(self) -> None:
        """Remove every hook, leave the function mode, restore every training flag."""
        for handle in getattr(self, "_handles", ()):
            handle.remove()
        self._handles = []
        for module, previous in getattr(self, "_wrapped", ()):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = previous
        self._wrapped = []
        ranks = getattr(self, "_ranks", None)
        if ranks is not None:
            ranks.uninstall()
        if getattr(self, "_holds_cache", False):
            self._holds_cache = False
            self._structure.calls[:] = IDLE_CALLS  # no reference to this tracer is kept
            self._structure.busy = False
        mode = getattr(self, "_mode", None)
        if mode is not None:
            self._mode = None
            with contextlib.suppress(Exception):  # the mode stack changed under us
                mode.__exit__(None, None, None)
        for module, flag in getattr(self, "_training", ()):
            module.training = flag
        self._training = []
        eager, self._eager = getattr(self, "_eager", None), None
        if eager is not None:
            eager.__exit__(None, None, None)

    def _reset(self) -> None:
        # Mutable drafts while recording; frozen records are built once, in _finish().
        self._steps: list[StepDraft] = []
        self._tensors: list[TensorDraft] = []  # by record id
        self._values: dict[str, torch.Tensor] = {}
        self._stats = StatsCollector()  # on an accelerator: read back once, in _finish
        self._sink = ValueArena()
        self._journal_at = None
        if self.out is not None:  # the file stage is imported by the traces that write one
            from tracing.file import journal as journal_mod
            from tracing.file.writer import TraceWriter

            self._sink = StreamedValues(TraceWriter(self.out))
            self._journal_at = time.perf_counter() + journal_mod.JOURNAL_SECONDS
        self._ids: dict[int, tuple] = {}  # id(tensor) -> (weakref, version, record id)
        structure = self._structure = structure_of(self.model)
        self._named = [("", self.model), *structure.modules]
        self._param_names = structure.param_names  # id(parameter or buffer) -> dotted name
        self._buffer_ids = structure.buffer_ids
        # open module calls, innermost last: frames (see module_recorder)
        self._stack: list[tuple[int, nn.Module, SourceLocation | None, str]] = []
        self._param_rids: dict[int, str] = {}  # record id -> parameter or buffer name
        self._param_steps: list[int] = []  # op steps with a parameter among their inputs
        self._shapes_only = self.capture == "shapes"
        self._keep_values = self.capture == "values"
        self._calls: dict[str, int] = {}
        self._failed_step: int | None = None
        self._failure: Failure | None = None
        self._first_input_shape: tuple[int, ...] | None = None
        self._root_call: tuple | None = None  # the root call's (args, kwargs): dims evidence
        self._second_pass_ok = True  # False once interrupted (Ctrl-C, exit): no dims pass
        self._input_shapes: list[tuple[str, list[int]]] = []
        self._flat_maps: list[int] = []  # rank-3 maps: shown with heads if (B·H, ...)
        self._maps = MapFinder(self._steps, self._tensors)  # softmaxes until contracted
        self._mode = None
        self._skipped_values = 0
        self._notes: dict[str, None] = {}  # what could not be recorded fully, in order
        self._ranks: RankCapture | None = None
        if self._edits is not None:
            self._edits.reset()

    # ---- extension points: where steps open and where outputs are seen

    def _open_op(self, func, name: str, in_ids: list[int], out_names: tuple) -> tuple:
        """Append the step of an op call (outputs still empty); returns (index, draft)."""
        steps, stack = self._steps, self._stack
        index = len(steps)
        parent, _, source, path = stack[-1]
        if source is None:
            source = caller_location(2)
        if not self._param_rids.keys().isdisjoint(in_ids):  # parameters are named in _finish
            self._param_steps.append(index)
        names = op_input_names(func, len(in_ids))
        step = StepDraft("op", path, name, source, in_ids, (), names, out_names, len(stack), parent)
        steps.append(step)
        return index, step

    def _op_done(self, index: int, name: str, func, args: tuple, kwargs, outs: tuple) -> None:
        """Every op's tensor outputs, once its step holds their records: attention maps
        (a softmax its contraction with the values proves one, a fused attention call),
        the group of a functional collective (under torch.distributed), then breakpoints."""
        if name in NOTED_OPS:
            if name not in COLLECTIVE_OPS:
                outs = self._attention_op(index, name, func, args, kwargs, outs)
            elif self._ranks is not None:
                self._ranks.functional(index, func, args, kwargs)
        if self._breaker is not None:
            self._check_outputs(index, outs)

    def _module_done(self, frame: Frame, tensors) -> None:
        """Every module call's output tensors, once its step holds their records: without
        ops recorded, attention weights a module returns beside its output; breakpoints,
        then the journal of a streamed file."""
        index = frame.index
        if not self.ops and len(tensors) >= 2 and returned_weights(tensors[1]):
            self._mark_attention(self._steps[index].outputs[1], tensors[1])
        if self._breaker is not None:
            self._check_outputs(index, tensors)
        if self._journal_at is not None and time.perf_counter() >= self._journal_at:
            self._checkpoint()

    def _record_external_op(self, name, run, ins, in_names, outs, out_names, settled=True):
        """Run ``run()`` and record it as op ``name``: a call the function mode cannot see
        (a ``torch.distributed`` collective, see ``tracing.distributed``). ``ins`` are read
        before it runs, ``outs`` (tensors it writes into; a list may be filled by ``run``)
        after; unsettled outputs (an async collective) keep their shape only. Returns
        ``(step index, result)``, the index None outside the traced forward."""
        if not self._stack:
            return None, run()
        with _Disable():  # reading a tensor runs torch ops the mode must not record
            in_ids = [self._tensor_id(t, None) for t in ins]
        source = caller_location(1)
        parent, _, _, path = self._stack[-1]
        step = StepDraft(
            "op", path, name, source, in_ids, [], tuple(in_names), tuple(out_names),
            len(self._stack), parent,
        )  # fmt: skip
        try:
            result = run()
        except Exception as e:
            step.error = f"{type(e).__name__}: {e}"
            self._failed_step = len(self._steps)
            self._steps.append(step)
            raise
        index = len(self._steps)
        self._steps.append(step)
        # always new records: a collective writes in place, sometimes keeping _version
        with _Disable():
            step.outputs = [self._new_tensor(t, index, t._version if settled else -1) for t in outs]
        if not self._param_rids.keys().isdisjoint(in_ids):
            self._param_steps.append(index)
        return index, result

    def _op_failed(self, func, name: str, in_ids: list[int], exc: Exception) -> None:
        """The step of an op call that raised, with its error (and no outputs)."""
        index, step = self._open_op(func, name, in_ids, ())
        step.error = f"{type(exc).__name__}: {exc}"
        self._failed_step = index

    # ---- tensor records

    def _tensor_id(
        self,
        t: torch.Tensor,
        producer: int | None,
        version: int | None = None,
        source: tuple[torch.Tensor, int] | None = None,
    ) -> int:
        """Record id of ``t``: the existing one if this exact tensor was seen unchanged.

        ``source`` is ``(input tensor, its record id)`` for an op's output: when the output
        is a view of that input (``view``, ``transpose``, ``split``, ``x[i]``), its stats
        and kept value are derived from the input's instead of computed again.
        """
        entry = self._ids.get(id(t))
        if version is None:
            version = t._version
        if entry is not None and entry[1] == version and entry[0]() is t:
            return entry[2]
        return self._new_tensor(t, producer, version, source)

    def _new_tensor(
        self,
        t: torch.Tensor,
        producer: int | None,
        version: int,
        source: tuple[torch.Tensor, int] | None = None,
    ) -> int:
        """A new record for ``t`` as it is now (``version`` is its ``_version`` as seen)."""
        key = id(t)
        rid = len(self._tensors)
        record = TensorDraft(t.shape, t.dtype, t.device, producer)
        self._tensors.append(record)
        try:  # noqa: SIM105 - try/except costs nothing here; suppress() is a call
            self._ids[key] = (weakref.ref(t), version, rid)
        except TypeError:  # pragma: no cover - tensor subclasses without weakref support
            pass
        if self._ranks is not None:  # a DTensor is recorded as its local shard
            local = self._ranks.local_view(rid, t)
            if local is not None:
                t, source, record.shape = local, None, local.shape
        name = self._param_names.get(key)
        if name is not None:  # a parameter or buffer: no stats, no copy
            record.producer = None
            # a set lookup: isinstance(t, nn.Parameter) runs a Python metaclass check
            record.role = "buffer" if key in self._buffer_ids else "param"
            self._param_rids[rid] = name
            return rid
        if self._shapes_only or version != t._version:
            return rid
        # our own tensor calls: no function mode (an outer tracer's included) may see them
        with _Disable():
            try:
                view = _view_of(t, source[0]) if source is not None and source[0] is not t else None
                if view is not None:
                    self._derive_from_view(record, rid, t, view, *source)
                # stats first: they are what raises for a tensor kind without data here
                # (before a copy or a streamed write reads its memory). A small CPU tensor's
                # wait for the batch in _finish, from a copy that its kept value then shares;
                # on an accelerator: pending, no sync
                if record.stats is None:
                    record.stats = self._stats.add(t)
                if self._keep_values and record.value_key is None:
                    self._keep_value(rid, t)
            except TraceFileError:  # the streamed file cannot grow (a full disk): stop
                raise
            except UNSUPPORTED as e:  # meta, sparse, masked... tensors: shapes only
                record.stats = None
                self._note_unsupported(t, e)
        return rid

    def _note_unsupported(self, t: torch.Tensor, e: BaseException) -> None:
        """Remember (once per kind) that tensors of this kind were recorded by shape only."""
        kind = tensor_kind(t)
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        note = f"{kind} tensors: recorded by shape only, no stats or values ({reason})"
        self._notes.setdefault(note)

    def _derive_from_view(self, record, rid: int, t, view: str, src_t, src_rid: int) -> None:
        """Stats and kept value of ``t``, a view of ``src_t``, taken from ``src_t``'s record:
        the same stats when it views all of it, its copy viewed the same way."""
        src = self._tensors[src_rid]
        if view == "all":  # same elements, so the same statistics
            record.stats = src.stats
        kept = None if src.value_key is None else self._values.get(src.value_key)
        # (None too when it was streamed to the file: the view is then written itself)
        if kept is not None and kept.is_contiguous() and src_t.is_contiguous():
            offset = t.storage_offset() - src_t.storage_offset()
            value = kept.as_strided(t.shape, t.stride(), kept.storage_offset() + offset)
            self._store_value(rid, value)

    def _keep_value(self, rid: int, t: torch.Tensor, force: bool = False) -> None:
        """Keep a copy of ``t`` (record ``rid``), unless over the size cap (``force``:
        whatever its size, as for attention maps) or one is kept already."""
        if self._tensors[rid].value_key is not None:
            return
        if t.device.type == "meta":  # no data to copy (a model built on the meta device)
            self._notes.setdefault(META_NOTE)
            return
        dtype = t.dtype
        if self.value_dtype is not None and t.is_floating_point():
            dtype = self.value_dtype
        cap = self.value_cap
        if cap is not None and t.numel() * dtype.itemsize > cap and not force:
            self._skipped_values += 1
            return
        # a small CPU tensor's stats copy (contiguous, private) serves as its kept value
        copy = getattr(self._tensors[rid].stats, "copy", None)  # PendingStats.copy
        if copy is not None and copy.dtype == dtype and self.out is None:
            self._store_value(rid, copy)
            return
        # into the arena, or straight to the file when streaming (then nothing is held)
        key, kept = self._sink.keep(f"t{rid}", t, dtype)
        if key is None:  # streaming, and the file cannot hold this dtype
            self._skipped_values += 1
            return
        self._store_value(rid, kept, key)

    def _store_value(self, rid: int, value: torch.Tensor | None, key: str | None = None) -> None:
        """The one place a kept value goes into the trace (``trace.values``); ``None``:
        it went to the file under ``key``."""
        key = key or f"t{rid}"
        if value is not None:
            self._values[key] = value
        self._tensors[rid].value_key = key

    def _mark_attention(self, rid: int, t: torch.Tensor) -> None:
        """Record ``rid`` is an attention map: its role says so and its value is kept."""
        rec = self._tensors[rid]
        if rec.role is None:
            rec.role = "attention"
        self._keep_value(rid, t, force=True)

    def _root_inputs(self, ids: list[int], names: tuple, tensors) -> None:
        """The root call's tensors are the trace's inputs (first call: also their shapes)."""
        for rid in ids:
            record = self._tensors[rid]
            if record.producer is None and record.role is None:
                record.role = "input"
        if self._first_input_shape is None:
            for n, t in zip(names, tensors):
                self._input_shapes.append((n, list(t.shape)))
            if tensors:
                self._first_input_shape = tuple(tensors[0].shape)

    def _forget_records(self, first: int) -> None:
        """Drop the records from ``first`` on (made for an op that made no step)."""
        del self._tensors[first:]
        for key in [k for k, entry in self._ids.items() if entry[2] >= first]:
            del self._ids[key]
        for rid in [r for r in self._param_rids if r >= first]:
            del self._param_rids[rid]
        for key in [k for k in self._values if int(k[1:]) >= first]:
            del self._values[key]
        if self._ranks is not None:
            self._ranks.forget(first)

    # ---- module instruments

    def _instrument_all(self) -> None:
        """Wrap each module's ``forward`` for this trace (an instance attribute, removed on
        exit), or hook it.

        A wrapper is the cheapest way to see a module call begin and end: a module with
        forward hooks takes ``Module._call_impl``'s slow path (a closure and two hook loops
        per call), and registering and removing two hook handles per module costs more
        than a small model's whole forward. The wrappers of submodules are made once per
        model and reused (they call whichever tracer is running).

        A module that already has forward hooks (its own, or global ones) is on that slow
        path anyway, and a wrapper would sit *inside* those hooks: it would record the
        inputs before a user's pre-hook rewrote them and the output before a user's hook
        rewrote it. Such a module gets a pre-hook and a hook of ours instead, registered
        after the user's, so the step shows what the module really received and returned.
        Script modules, whose ``forward`` cannot be replaced, get hooks too.
        """
        structure = self._structure
        specs, scripts = structure.specs, structure.scripts
        if structure.busy:  # another tracer holds the cached wrappers: make our own
            calls, cache = [self._enter_module, self._exit_module], None
        else:
            structure.busy = True
            self._holds_cache = True
            calls = structure.calls
            calls[:] = (self._enter_module, self._exit_module)
            cache = structure.wrappers
        hooked = global_hooks()
        pre, post = self._pre_hook, self._post_hook
        wrapped = self._wrapped
        for path, module in self._named:
            key = id(module)
            if hooked or module._forward_hooks or module._forward_pre_hooks or key in scripts:
                self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(module.register_forward_hook(post, with_kwargs=True))
                continue
            own = module.__dict__
            previous = own.get("forward")
            found = cache.get(key) if cache is not None else None
            if found is not None and found[1] is previous and found[2] is type(module).forward:
                wrapper = found[0]
            else:
                wrapper = wrap_forward(specs[key], module, calls)
                if cache is not None and path:  # never the root: it would keep it alive
                    cache[key] = (wrapper, previous, type(module).forward)
            wrapped.append((module, previous))
            own["forward"] = wrapper

    def _edit_op(self, name: str, result: Any, inputs: list) -> tuple[Any, tuple]:
        """Apply the edits for op ``name`` in the running module call (``tracing.edits``);
        returns the result and its tensors. An in-place op's tensor is edited in place."""
        index, _, _, path = self._stack[-1]
        call = self._steps[index].call
        new = self._edits.on_op(path, call, name, result, len(self._steps), inputs)
        if isinstance(new, _Tensor):
            return new, (new,)
        return new, tuple([r for r in new if isinstance(r, _Tensor)])

    def _edit_call(self, func, name: str, args: tuple, kwargs) -> Any:
        """Run op ``name`` with the edits that replace its call in the running module call
        (``head=`` on an ``nn.MultiheadAttention``: ``tracing.capture.heads``)."""
        index, _, _, path = self._stack[-1]
        call = self._steps[index].call
        return self._edits.on_call(path, call, name, func, args, kwargs, len(self._steps))

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        with _Disable():  # our own tensor calls must not reach the op mode
            self._enter_module(self._structure.specs[id(module)], module, args, kwargs)

    def _post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        with _Disable():
            for frame in reversed(self._stack):
                if frame.module is module:
                    new = self._exit_module(frame, output)
                    return None if new is output else new  # an edit replaces the output
        return None

    # ---- attention maps

    def _attention_op(self, index: int, name: str, func, args, kwargs, outs: tuple) -> tuple:
        """Attention maps made by op ``index``, recognised by what they do
        (``tracing.attention_flow``): a softmax is a candidate, proven a map by the
        contraction that sums its key axis with the values; a fused attention call makes
        one. Returns the op's outputs with any rebuilt map added."""
        if name == "softmax" or name == "_softmax":
            stack = self._stack  # held until the call around the softmax's module ends
            holder = stack[-2].index if len(stack) > 1 else stack[-1].index
            self._maps.softmax(self._steps[index].outputs[0], outs[0], args, kwargs, holder)
            return outs
        if name in MIXES:
            for rid, t in self._maps.contraction(name, args, kwargs, self._steps[index].inputs):
                if t.dim() == 4:  # named later: its role stands unless the names disprove it
                    self._mark_attention(rid, t)
                else:  # (B·H, T, S) once its names prove it: kept, its role given in _finish
                    self._flat_maps.append(rid)
                    self._keep_value(rid, t, force=True)
            return outs
        if name == "scaled_dot_product_attention":
            weights = self._fused_attention_map(args, kwargs)
        else:
            edited = self._edits.take_heads() if self._edits is not None else None
            weights, heads = self._mha_rebuilt(index, func, args, kwargs, outs, edited is None)
            heads = edited if edited is not None else heads
            if heads is not None:  # before the map, so the map stays the last output
                self._add_output(index, heads, "head_outputs")
                outs = (*outs, heads)
        if weights is None:
            return outs
        self._add_attention_output(index, weights)
        return (*outs, weights)

    def _add_output(self, index: int, t: torch.Tensor, name: str) -> int:
        """Add a tensor the op did not return (rebuilt by the tracer) to op ``index``'s
        outputs; returns its record id."""
        step = self._steps[index]
        rid = self._tensor_id(t, index)
        step.outputs = (*step.outputs, rid)
        step.output_names = (*step.output_names, name)
        return rid

    def _add_attention_output(self, index: int, weights: torch.Tensor) -> None:
        """Add rebuilt attention weights to op ``index``'s outputs, as an attention map."""
        self._mark_attention(self._add_output(index, weights, "attention_weights"), weights)

    def _fused_attention_map(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """``F.scaled_dot_product_attention`` returns no weights: rebuild them from its
        query, key and mask (``tracing.fused_attention``); None if the call is unusual."""
        from tracing.capture.fused_attention import weights_from_call

        try:
            return weights_from_call(args, kwargs)  # (B, H, T, T)
        except (TypeError, ValueError, RuntimeError):
            return None

    def _mha_rebuilt(self, index: int, func, args: tuple, kwargs: dict, outs, heads: bool):
        """(weights, heads) of an ``nn.MultiheadAttention`` call
        (``F.multi_head_attention_forward``) that it did not return, each None when not
        rebuilt. The call returns per-head weights only when asked (``need_weights=True,
        average_attn_weights=False``), and its per-head output ``(B, H, T, D)`` never: it
        merges and projects the heads inside. So the call runs once more from the same
        arguments (the model's own result untouched; dropout off, so no random numbers
        drawn) with an identity output projection, asking for the weights when they were
        not returned (:func:`tracing.capture.heads.mha_head_outputs`): a saved trace then
        holds what a head edit there changes (``Patch``, ``MeanAblate`` from a trace).
        With ``heads`` False (an edit supplied them) only the weights are rebuilt. The
        call receives ``(T, B, C)`` tensors whatever ``batch_first`` says, so both come
        back batch first; an unbatched call gives neither. Weights returned per head
        already are marked here as the attention map."""
        from tracing.capture.heads import mha_head_outputs

        returned = len(outs) >= 2 and outs[1].dim() == 4
        if returned:  # already per head: mark it
            self._mark_attention(self._steps[index].outputs[1], outs[1])
            if not heads:
                return None, None
        try:
            if heads:
                found, weights = mha_head_outputs(func, args, kwargs, weights=not returned)
            else:
                bound = mha_signature(func).bind(*args, **kwargs)
                bound.arguments.update(
                    need_weights=True, average_attn_weights=False, training=False
                )
                found, (_, weights) = None, func(*bound.args, **bound.kwargs)
        except (TypeError, ValueError, RuntimeError):
            return None, None
        if returned or not isinstance(weights, _Tensor) or weights.dim() != 4:
            weights = None  # unbatched input: (H, T, S) has no batch axis to show
        return weights, found

    # ---- breakpoints (tracing.breakpoints)

    def _step_record(self, index: int) -> Step:
        """Step ``index`` as it stands now, frozen (what a breakpoint condition sees)."""
        return self._steps[index].freeze(index, self._input_names(self._steps[index]))

    def _check_outputs(self, index: int, tensors) -> None:
        """Raise the breaker's stop if a condition holds for this step's outputs."""
        records = [self._tensors[rid].freeze(rid) for rid in self._steps[index].outputs]
        self._breaker.exit(self._step_record(index), records, list(tensors))

    # ---- failure

    def _mark_failure(self, exc: BaseException, tb) -> str:
        """Set ``error`` on the failing step and every enclosing module step; return msg."""
        detail = exception_text(exc)  # safe when exc's __str__ itself raises
        last = len(self._steps) - 1
        failed = self._failed_step
        if failed is None and self._stack:
            failed = self._stack[-1].index
        for index, *_ in self._stack:
            step = self._steps[index]
            step.error = step.error or detail
            step.end = last
        if failed is None:  # pragma: no cover - nothing ran
            return f"forward pass failed: {detail}"
        step = self._steps[failed]
        step.error = step.error or detail
        source: SourceLocation | None = step.source
        if step.kind == "module":
            source = location_from_traceback(tb) or source
        self._failure = failure_of(failed, exc, tb, source)
        where = f"{step.module or '<root>'} · {step.op}"
        at = ""
        if source is not None:
            at = f" at {source.file}:{source.line}"
            if source.text:
                at += f" `{source.text}`"
        self._stack.clear()
        return f"forward pass failed in {where}{at}: {detail}"

    # ---- building the record

    def _input_names(self, step: StepDraft) -> tuple[str, ...]:
        """An op's input names with each parameter or buffer named by its path."""
        names, rids = step.input_names, self._param_rids
        if step.kind != "op" or rids.keys().isdisjoint(step.inputs):
            return names
        return tuple([rids.get(r) or d for r, d in zip(step.inputs, names)])

    def _config(self) -> Any:
        """The model's config (``model.config``; DDP / DataParallel wrap the model)."""
        config = getattr(self.model, "config", None)
        if config is None:
            config = getattr(getattr(self.model, "module", None), "config", None)
        return config

    def _meta(self) -> dict[str, Any]:
        """The trace's ``meta`` as it stands (``dims`` and the letters: :mod:`tracing.dims`)."""
        model = self.model
        config = self._config()
        meta = {
            "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
            "config": self._structure.config_dict(config),
            "capture": self.capture,
            "torch_version": torch.__version__,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "input_shapes": dict(self._input_shapes),
            "training": self.train,
            "capture_seconds": round(time.perf_counter() - self._t0, 6),
        }
        if self.capture == "values":
            meta["value_cap"] = self.value_cap
            meta["value_dtype"] = None if self.value_dtype is None else str(self.value_dtype)[6:]
            meta["values_skipped"] = self._skipped_values
        if self._ranks is not None:
            meta.update(self._ranks.meta())
        if self._edits is not None:
            meta["edits"] = self._edits.to_meta()
        if self._notes:
            meta["notes"] = list(self._notes)
        meta.update(self.extra_meta)
        return meta

    def _finish(self, error: str | None) -> Trace:
        model = self.model
        steps = self._steps
        self._maps.pending.clear()  # softmaxes never contracted: no map, nothing held
        for index in self._param_steps:
            steps[index].input_names = self._input_names(steps[index])
        meta = self._meta()
        self._stats.finish()  # statistics still on a device: read back at once, here
        self._sink.finish()  # copies from a device: waited for once, here
        records = [step.seal(index) for index, step in enumerate(steps)]
        tensors = [
            draft.seal(rid, None, tuple(draft.shape)) for rid, draft in enumerate(self._tensors)
        ]
        named = name_trace(
            self._dims_subject(), records, tensors, meta, _shapes_pass, self.options.naming
        )
        trace = Trace(
            steps=records,
            modules=self._structure.module_infos(model),
            tensors=proven_maps(named, self._flat_maps),
            meta=meta,
            values=self._values,
            error=error,
            failure=self._failure,
            sources=embed_sources(records, self._failure),
        )
        if self.out is not None and not self._sink.aborted:
            self._close_file(trace)
        return trace

    def _finish_kept(self, error: str | None) -> Trace:
        """``_finish``; Ctrl-C or SIGTERM while it runs (naming the axes, checking, closing
        a streamed file) keeps the trace all the same: the records as they are, axes not
        named, the file closed with them; the interrupt goes on up with it as ``.trace``."""
        try:
            return self._finish(error)
        except KeyboardInterrupt as stop:
            if self.trace is None:  # before the file was closed (_close_file sets it)
                self.trace = self._unnamed_trace(error)
                if self.out is not None and not self._sink.aborted:
                    self._close_file(self.trace)
            stop.trace = self.trace  # type: ignore[attr-defined]
            raise

    def _unnamed_trace(self, error: str | None) -> Trace:
        """The trace of what was recorded, without the work after the forward that an
        interrupt cut short: no axis names, no embedded sources."""
        self._stats.finish()
        self._sink.finish()
        meta = self._meta()
        steps = [s if isinstance(s, Step) else s.seal(i) for i, s in enumerate(self._steps)]
        tensors = [
            t if isinstance(t, TensorRecord) else t.seal(rid, None, tuple(t.shape))
            for rid, t in enumerate(self._tensors)
        ]
        stop = "interrupted after the forward, while the trace was being finished"
        return Trace(
            steps=steps, modules=self._structure.module_infos(self.model), tensors=tensors,
            meta=meta, values=self._values, error=error or stop, failure=self._failure,
        )  # fmt: skip

    def _dims_subject(self, passes: bool = True) -> Subject:
        """What :mod:`tracing.dims` needs to prove each axis name: the root call for its
        passes (after a forward that raised too, whose passes then prove the steps before
        the failure; not after an interrupt or a full disk, nor for a journal checkpoint)."""
        call = self._root_call if passes and self._second_pass_ok else None
        if passes:
            self._root_call = None
        config = self._config()
        if config is None:  # a Constructor's arguments are the config of a model with none
            config = getattr(self.options.rebuild, "config", None)
        return Subject(
            self.model, config, call, dict(self._param_rids), self.dims, self.train,
            self.ops, self._ranks is not None, self._first_input_shape, self.options.rebuild,
        )  # fmt: skip

    # ---- the journal of a streamed file (tracing.file.journal)

    def _checkpoint(self) -> None:
        """Journal the steps recorded so far (between two module calls: every op step
        is complete; the calls still open end at the last step). The next one waits
        ``JOURNAL_SECONDS`` and at least ``JOURNAL_COST_RATIO`` times what this one
        took, so checkpoints cost a bounded share of the capture."""
        t0 = time.perf_counter()
        try:
            self._stats.finish()  # small tensors' stats, rows from a device
            self._sink.finish()  # copies from a device: written first
            last = len(self._steps) - 1
            open_calls = {frame.index for frame in self._stack}
            steps = []
            for index, draft in enumerate(self._steps):
                step = draft.freeze(index, self._input_names(draft))
                if index in open_calls:
                    step = dataclasses.replace(step, end=last)
                steps.append(step)
            meta = self._meta()
            tensors = [d.freeze(rid, None, tuple(d.shape)) for rid, d in enumerate(self._tensors)]
            naming = "off" if self.options.naming == "off" else "ops"  # no pass mid-capture
            tensors = name_trace(self._dims_subject(passes=False), steps, tensors, meta,
                                 _shapes_pass, naming)  # fmt: skip
            trace = Trace(
                steps=steps,
                modules=self._structure.module_infos(self.model),
                tensors=tensors,
                meta=meta,
                values={},
                error=(
                    f"the capture did not finish: this is its last checkpoint ({len(steps)} "
                    f"steps, {meta['capture_seconds']:.1f} s in)"
                ),
            )
            self._sink.writer.checkpoint(trace)
        except TraceFileError:
            raise
        except Exception:  # pragma: no cover - a journal is a help, never a failure
            pass
        from tracing.file import journal as journal_mod

        now = time.perf_counter()
        self._journal_at = now + max(
            journal_mod.JOURNAL_SECONDS, journal_mod.JOURNAL_COST_RATIO * (now - t0)
        )

    def _close_file(self, trace: Trace) -> None:
        """A streamed trace's header, then the file takes its name and ``trace.values``
        reads from it lazily. (``tracing.backward`` closes it later: the backward streams
        into the same file.)"""
        from tracing import file as trace_file

        try:
            self._sink.writer.close(trace)
        except BaseException as e:  # a full disk, Ctrl-C...: the writer kept what it could
            kept = getattr(e, "kept", None)
            if kept is not None:
                with contextlib.suppress(Exception):
                    trace.values = trace_file.load(kept).values
            e.trace = self.trace = trace  # type: ignore[attr-defined]
            raise
        trace.values = trace_file.load(self.out).values


# --------------------------------------------------------------------------- helpers


def _shapes_pass(model: nn.Module, run: Callable[[], Any], train: bool, ops: bool):
    """A shapes-only run of ``model`` under a tracer of its own, unnamed: what
    :mod:`tracing.dims`' extra passes record (its steps and each tensor's shape)."""
    tracer = Tracer(model, "shapes", train=train, ops=ops, naming="off")
    with tracer:
        run()
    trace = tracer.trace
    return list(trace.steps), [r.shape for r in trace.tensors]


def _view_of(t: torch.Tensor, src: torch.Tensor) -> str | None:
    """``"all"`` if ``t`` views exactly the elements of ``src``, ``"part"`` if a subset of
    them, ``None`` if it is not a view into ``src``'s elements (or ``src`` is strided).
    """
    base = t._base  # first: most outputs are not views
    if base is None or (base is not src and base is not src._base):
        return None
    if t.dtype != src.dtype or not src.is_contiguous():
        return None
    low = t.storage_offset()
    high = low
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return None
        if stride < 0:
            return None
        high += (size - 1) * stride
    start = src.storage_offset()
    if low < start or high >= start + src.numel():
        return None
    if t.numel() == src.numel() and 0 not in t.stride():
        return "all"
    return "part"


def trace(
    model: nn.Module,
    *args: Any,
    capture: str = "stats",
    dims: Mapping[str, int] | None = None,
    value_cap: int | None = DEFAULT_VALUE_CAP,
    value_dtype: torch.dtype | None = None,
    train: bool = False,
    grad: bool = False,
    ops: bool = True,
    meta: Mapping[str, Any] | None = None,
    break_on: Any = None,
    out: str | os.PathLike | None = None,
    edits: Any = None,
    naming: str = "proven",
    rebuild: Any = None,
    options: CaptureOptions | None = None,
    **kwargs: Any,
) -> Trace:
    """Run ``model(*args, **kwargs)`` once and return everything it did as a :class:`Trace`.

    Runs in eval mode and without autograd (``train=True`` / ``grad=True`` to change
    that). If the forward raises, :class:`tracing.TraceError` is raised ``from`` the
    original exception, with the partial trace as ``.trace``. With ``break_on``, it stops
    at the first step that meets a condition and returns the trace up to there, with
    ``meta["stopped_at"]``. With ``edits`` (``tracing.edits``), values are changed as the
    model runs and ``meta["edits"]`` says where. With ``out``, the trace is written to that
    file as it records (values streamed, memory flat; a partial trace too) and its values
    are read from it; under ``torch.distributed`` each rank writes its own file
    (``out=trace.sft`` -> ``trace.rank0.sft``, ``trace.rank1.sft``...). See
    :class:`Tracer` for the rest.
    """
    opts = CaptureOptions.of(
        options, capture=capture, dims=dims, value_cap=value_cap, value_dtype=value_dtype,
        ops=ops, meta=meta, break_on=break_on, edits=edits, out=out, naming=naming,
        rebuild=rebuild,
    )  # fmt: skip
    if opts.out is not None:
        opts = opts.replace(out=output_path(opts.out))
    plan = None
    if opts.edits:
        from tracing.capture.edits import EditPlan

        plan = EditPlan.of(opts.edits)
        opts = opts.replace(edits=plan)
    for _ in range(len(plan.edits) + 1 if plan is not None else 1):
        tracer = Tracer(model, train=train, options=opts)
        try:
            with torch.set_grad_enabled(grad), tracer:
                model(*args, **kwargs)
            break
        except Exception as e:
            if plan is None or not _resolve_heads(plan, e, tracer.trace):
                raise
    assert tracer.trace is not None
    return tracer.trace


def _resolve_heads(plan, error: Exception, failed: Trace | None) -> bool:
    """After a forward that failed on ``head=`` at a module whose output has no heads axis
    (an attention module): readdress that edit to the per-head output the failed run
    recorded inside the module (:meth:`~tracing.edits.EditPlan.resolve_heads`); True when
    the run should go again. When the module holds none, or several, the error names
    them (a :class:`TraceError` with the failed run's trace)."""
    from tracing.capture.edits import EditError

    cause = error.__cause__ if isinstance(error, TraceError) else error
    module = getattr(cause, "head_module", None)
    if module is None or failed is None:
        return False
    try:
        return plan.resolve_heads(failed, module)
    except EditError as e:
        raise TraceError(str(e), failed) from e
