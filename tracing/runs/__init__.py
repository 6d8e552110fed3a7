"""Runs built on the tracer: training steps, generation, watching a loop, edited runs, sweeps.

Files: :mod:`~tracing.runs.backward` (``trace_step``: forward, loss and backward),
:mod:`~tracing.runs.backward_collectives` (the backward's collectives under DDP/FSDP),
:mod:`~tracing.runs.generation` (``trace_generate``, ``load_generation``),
:mod:`~tracing.runs.watcher` (``watch``: a user's own loop), :mod:`~tracing.runs.edit_run`
(``run_edited``: edits without recording), :mod:`~tracing.runs.patching` (``sweep``),
:mod:`~tracing.runs.compute` (mult-adds per module from ``torchinfo``, on meta where it can).

May import the record, :mod:`tracing.file` and :mod:`tracing.capture`.
"""

from tracing.moved import submodules

__getattr__ = submodules(__name__)
