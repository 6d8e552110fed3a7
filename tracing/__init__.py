"""Record one forward pass of any ``nn.Module``: every module call and every tensor op.

>>> import tracing
>>> t = tracing.trace(model, tokens, capture="stats")   # doctest: +SKIP
>>> t.steps[10].op, t.tensor(t.steps[10].outputs[0]).shape   # doctest: +SKIP

The package by stage, each folder importing only the ones before it
(``tests/test_layering.py`` checks it)::

    record, errors, sites, stats, breakpoints, formatting   the record: what a trace is
    file/       the trace file: save, stream, encode, load, validate, lazy values
    capture/    the tracer: options, instruments, recorders, dims, edits, distributed
    runs/       built on the tracer: training steps, generation, watch, edited runs, sweeps
    analysis/   reading traces (never the tracer): report, diff, lens, attention, ranks
    show_app    ``tracing.show``: open the app on a trace, a file or a model

This package never imports Qt and never imports ``scratchformer``: it traces any module.
Every name below is imported on first use, so ``import tracing`` stays cheap; the old flat
module paths (``tracing.trace_file``, ``tracing.edits``...) still import (:mod:`tracing.moved`).
"""

from __future__ import annotations

import importlib
from typing import Any

from tracing import moved
from tracing.errors import ReentrantCheckpointError, TraceError, TraceFileError
from tracing.record import (
    CAPTURE_LEVELS,
    SCHEMA_VERSION,
    Failure,
    ModuleInfo,
    SourceLocation,
    Step,
    TensorRecord,
    TensorStats,
    Trace,
)

moved.install()

# public name -> (module that defines it, attribute; None: the name is the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    # --- the record
    "sites": ("tracing.sites", None),
    "breakpoints": ("tracing.breakpoints", None),
    "find_next": ("tracing.breakpoints", "find_next"),
    "first_nonfinite_gradient": ("tracing.breakpoints", "first_nonfinite_gradient"),
    # --- the file
    "file": ("tracing.file", None),
    "load": ("tracing.file.loading", "load"),
    "save": ("tracing.file.saving", "save"),
    "rank_path": ("tracing.file.rank_paths", "rank_path"),
    # --- capture
    "capture": ("tracing.capture", None),
    "trace": ("tracing.capture.tracer", "trace"),
    "Tracer": ("tracing.capture.tracer", "Tracer"),
    "CaptureOptions": ("tracing.capture.options", "CaptureOptions"),
    "edits": ("tracing.capture.edits", None),
    "Constructor": ("tracing.dims.constructor", "Constructor"),
    # --- runs
    "runs": ("tracing.runs", None),
    "trace_step": ("tracing.runs.backward", "trace_step"),
    "watch": ("tracing.runs.watcher", "watch"),
    "trace_generate": ("tracing.runs.generation", "trace_generate"),
    "load_generation": ("tracing.runs.generation", "load_generation"),
    "run_edited": ("tracing.runs.edit_run", "run_edited"),
    "patching": ("tracing.runs.patching", None),
    # --- analysis
    "analysis": ("tracing.analysis", None),
    "report": ("tracing.analysis.report", None),
    "diff": ("tracing.analysis.trace_diff", "diff"),
    "TraceDiff": ("tracing.analysis.trace_diff", "TraceDiff"),
    "logit_lens": ("tracing.analysis.lens", "logit_lens"),
    "head_contributions": ("tracing.analysis.lens", "head_contributions"),
    "load_ranks": ("tracing.analysis.ranks", "load_ranks"),
    "RankSet": ("tracing.analysis.ranks", "RankSet"),
    # --- the app, from Python
    "show": ("tracing.show_app", "show"),
}

__all__ = [
    "CAPTURE_LEVELS",
    "SCHEMA_VERSION",
    "Failure",
    "ModuleInfo",
    "ReentrantCheckpointError",
    "SourceLocation",
    "Step",
    "TensorRecord",
    "TensorStats",
    "Trace",
    "TraceError",
    "TraceFileError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    """``tracing.<name>``: a documented name, or an old flat module path."""
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attribute is None else getattr(module, attribute)
    elif f"tracing.{name}" in moved.MOVED:
        value = importlib.import_module(moved.MOVED[f"tracing.{name}"])
    else:  # any other module of the package (``tracing.token_names``...), on first use
        return _submodule(name)
    globals()[name] = value
    return value


_submodule = moved.submodules(__name__)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
