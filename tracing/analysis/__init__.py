"""Reading traces: reports, diffs and divergence, the lens, attention maps, gradients, graph, ranks.

Files: :mod:`~tracing.analysis.report` (shape and failure reports),
:mod:`~tracing.analysis.trace_diff` (``diff``: two traces step by step),
:mod:`~tracing.analysis.divergence` (one drift figure per step),
:mod:`~tracing.analysis.lens` (``logit_lens``, ``head_contributions``),
:mod:`~tracing.analysis.attention_maps` (every attention-weight tensor by module),
:mod:`~tracing.analysis.gradients` (gradient norms of a training step),
:mod:`~tracing.analysis.graph` (``Trace.graph``), :mod:`~tracing.analysis.ranks`
(``load_ranks``: one file per rank as a set), :mod:`~tracing.analysis.rank_report`,
:mod:`~tracing.analysis.postmortem` (a failure in a few lines),
:mod:`~tracing.analysis.phases` (a training step's forward, loss and backward),
:mod:`~tracing.analysis.find` (one search index over a trace),
:mod:`~tracing.analysis.compute` (the mult-adds a trace kept).

Reads the record and :mod:`tracing.file`; never imports :mod:`tracing.capture` or
:mod:`tracing.runs`, so a trace from anywhere can be read without the tracer.
"""

from tracing.moved import submodules

__getattr__ = submodules(__name__)
