"""Axis names as proofs: the dims stage.

A trace's tensors have shapes; a person reads them as ``(B, H, T, D)``. Each such name is a
claim, so this stage names an axis only by what proves it, and says ``?`` otherwise:

- :mod:`~tracing.dims.evidence` — what is gathered, as plain data, before any naming: the
  letters' sizes and origins, the extra passes, what modules declare;
- :mod:`~tracing.dims.letters` — the one spelling table (:data:`~tracing.dims.letters.LETTERS`:
  each letter, the config and attribute spellings of its size) and the one size reader;
- :mod:`~tracing.dims.passes` — the model run again at other sizes (the inputs pass; a pass
  per config knob, rebuilt on ``meta``), through a runner the tracer hands in;
- :mod:`~tracing.dims.align` — each pass's steps paired with the real ones, linearly;
- :mod:`~tracing.dims.source` — what a source line writes (shape comments, numbers, slices);
- :mod:`~tracing.dims.rules` — what each op does to its input's axes, as a registry;
- :mod:`~tracing.dims.naming` — :func:`~tracing.dims.naming.name_axes`, a pure function of
  the records and the evidence;
- :mod:`~tracing.dims.prove` — :func:`~tracing.dims.prove.name_trace`, the stage as the
  tracer runs it.

The stage imports the record only (and ``torch``); the tracer imports it, never the reverse.
"""
