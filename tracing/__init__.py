"""Record one forward pass of any ``nn.Module``: every module call and every tensor op.

>>> import tracing
>>> t = tracing.trace(model, tokens, capture="stats")   # doctest: +SKIP
>>> t.steps[10].op, t.tensor(t.steps[10].outputs[0]).shape   # doctest: +SKIP

This package never imports Qt and never imports ``scratchformer``: it traces any module.
Heavy submodules are imported on first use, so ``import tracing`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

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

# public name -> submodule that defines it (imported lazily)
_LAZY = {
    "trace": "tracing.capture",
    "Tracer": "tracing.capture",
    "load": "tracing.trace_file",
    "save": "tracing.trace_file",
    "report": "tracing.report",
    "diff": "tracing.trace_diff",
    "TraceDiff": "tracing.trace_diff",
    "find_next": "tracing.breakpoints",
    "logit_lens": "tracing.lens",
    "head_contributions": "tracing.lens",
    "trace_step": "tracing.backward",
    "watch": "tracing.watcher",
    "first_nonfinite_gradient": "tracing.breakpoints",
    "trace_generate": "tracing.generation",
    "load_generation": "tracing.generation",
    "show": "tracing.show_app",
    "load_ranks": "tracing.ranks",
    "RankSet": "tracing.ranks",
    "rank_path": "tracing.distributed",
    "edits": "tracing.edits",
    "sites": "tracing.sites",
    "run_edited": "tracing.edit_run",
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
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tracing' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    # `tracing.report` is the module itself; the others are functions/classes in one
    value = module if module_name.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value
