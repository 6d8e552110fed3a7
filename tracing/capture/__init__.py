"""Capture one forward pass of any ``nn.Module``: every module call and every tensor op.

Two instruments work together:

- **Module instruments.** Every module in ``named_modules()`` gets its ``forward``
  wrapped for the trace (an instance attribute, removed on exit; see
  :meth:`Tracer._instrument_all`). A module that already has forward hooks (the user's,
  or global ones) gets a forward pre-hook and a forward hook (with kwargs) instead,
  registered after the user's, so its step shows what the hooks made of its inputs and
  output. Entering opens a *module step* (so its index comes before the ops that ran
  inside it) with the inputs named by the forward's parameters (``q``, ``k``, ``mask``);
  leaving closes it with the outputs (``output``, ``output[1]``, ``output['logits']``).
  Wrappers rather than hooks everywhere, because on a small model two hooks per module
  cost several times what a wrapper does (``Module._call_impl``'s slow path, and two
  handles to register and remove per module per trace).
- **A TorchFunctionMode.** Every torch function and tensor method called while a module
  runs (``matmul``, ``transpose``, ``view``, ``softmax``, the residual ``+`` as ``add``,
  ``F.linear`` inside ``nn.Linear``) becomes an *op step*, attributed to the innermost
  running module and to the user source line that called it. While the mode handles a
  call it is popped from torch's mode stack, so a torch function implemented with other
  torch functions is one step, not many.

Tensor identity: the same tensor object passed along keeps one record (weak references,
so a ``shapes`` trace keeps no activation alive); an in-place op bumps ``_version`` and so
makes a new record.

How a trace is built, file by file:

1. **Options** (:mod:`~tracing.capture.options`): one :class:`CaptureOptions` that every
   entry point that captures (``trace``, ``Tracer``, ``trace_step``, ``trace_generate``...)
   takes its keyword arguments into, so an option added once is available everywhere.
2. **Per model** (:mod:`~tracing.capture.structure`, ``Structure``, weakly keyed by the
   model): module specs, parameter and buffer names, which modules are attention, the
   cached forward wrappers, the ``ModuleInfo`` table and the config as JSON. Made once,
   freed with the model.
3. **Names** (:mod:`~tracing.capture.op_names`): what an op, its inputs and its outputs
   are called.
4. **Drafts** (:mod:`~tracing.capture.drafts`, ``StepDraft``, ``TensorDraft``): mutable
   steps and tensor records with ``Step``'s and ``TensorRecord``'s field names, filled
   while the forward runs; ``freeze()`` makes the frozen record, once, in
   :meth:`Tracer._finish`.
5. **Recorders** (:mod:`~tracing.capture.recorders`, ``op_recorder``,
   ``module_recorder``): the closures the op mode and the forward wrappers call on every
   op and module call.
6. **The Tracer** (:mod:`~tracing.capture.tracer`): lifecycle (enter, exit, cleanup),
   then tensor records, instruments, attention maps, breakpoints, failure, and
   :meth:`Tracer._finish`; and :func:`trace`.

Beside them: :mod:`~tracing.capture.value_sinks` (where kept copies go),
:mod:`~tracing.capture.source` and :mod:`~tracing.capture.tool_frames` (the user's source
line of each step), :mod:`~tracing.capture.frames`
(the spec and frame the recorders pass around),
:mod:`~tracing.capture.fused_attention` (the map a fused kernel never returns),
:mod:`~tracing.capture.edits` (values changed as the model runs),
:mod:`~tracing.capture.distributed` (collectives under ``torch.distributed``),
:mod:`~tracing.capture.postmortem` (the failure and source text a trace keeps).

Axis names are their own stage, :mod:`tracing.dims`, which the tracer calls after the forward.
May import the record, :mod:`tracing.file` and :mod:`tracing.dims`; never :mod:`tracing.runs` or
:mod:`tracing.analysis`.

Extension points (methods of :class:`Tracer`; keep new behaviour there, not in the
recorders):

- :meth:`Tracer._op_done` sees every op's tensor outputs once its step holds their ids;
- :meth:`Tracer._module_done` sees every module call's output tensors, likewise;
- :meth:`Tracer._op_failed` makes the step of an op that raised;
- :meth:`Tracer._edit_op` replaces an op's result (``tracing.edits``; module outputs are
  replaced in ``leave`` of :func:`~tracing.capture.recorders.module_recorder`);
- :meth:`Tracer._record_external_op` records a call the mode cannot see (a collective);
- :meth:`Tracer._new_tensor` makes every tensor record (stats, kept value);
- :meth:`Tracer._store_value` is the one place a kept copy enters ``trace.values``;
- :meth:`Tracer._finish` assembles the :class:`Trace` and its ``meta``.

>>> t = trace(model, tokens, capture="shapes")          # doctest: +SKIP
>>> with Tracer(model, capture="stats") as tracer:      # doctest: +SKIP
...     logits = model(tokens)
>>> tracer.trace.steps[3].label                          # doctest: +SKIP

"""

from tracing.moved import lazy_names

# imported on first use: importing one module of this folder (``tracing.capture.tool_frames``,
# which ``app`` does) then imports no torch, so ``scratchformer report`` never pays for it
__getattr__ = lazy_names(
    __name__,
    {
        "DEFAULT_VALUE_CAP": "tracing.capture.options",
        "CaptureOptions": "tracing.capture.options",
        "config_dict": "tracing.capture.structure",
        "module_infos": "tracing.capture.structure",
        "Tracer": "tracing.capture.tracer",
        "trace": "tracing.capture.tracer",
    },
)

__all__ = ["DEFAULT_VALUE_CAP", "CaptureOptions", "Tracer", "config_dict", "module_infos", "trace"]
