"""``tracing.show(obj)``: the ``breakpoint()`` of this tool. Look at a trace in the app, now.

>>> tracing.show(model, tokens)              # doctest: +SKIP  (traces it, a failure too)
>>> tracing.show(trace)                      # doctest: +SKIP
>>> tracing.show("run.sft")                  # doctest: +SKIP

It opens the desktop debugger on the trace and returns when the window is closed. The
app always runs in a child process (``python -m app.cli app FILE``) on a trace file (a
temporary one, removed afterwards, for a trace or a model): that works the same from a
script, from IPython and from Jupyter, whose own event loop a Qt window must not take
over, and it keeps ``tracing`` free of Qt (``tests/test_layering.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tracing.errors import TraceError
from tracing.record import Trace


def show(obj: Any, *inputs: Any, **trace_kwargs: Any) -> Trace | None:
    """Open the app on ``obj`` and wait until its window closes.

    ``obj`` is a :class:`Trace`, a trace file path, or a model: a model is traced first on
    ``inputs`` (with ``trace_kwargs``, e.g. ``capture="values"``), and a forward pass that
    raises opens the partial trace on its failing step instead of raising here. Returns
    the trace shown (``None`` for a path: it is not loaded here).
    """
    trace: Trace | None = None
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if not path.is_file():
            raise FileNotFoundError(f"no such trace file: {path}")
        _open_app(path)
        return None
    if isinstance(obj, Trace):
        trace = obj
    elif callable(obj) and hasattr(obj, "named_modules"):
        from tracing.capture.tracer import trace as run_trace

        trace_kwargs.setdefault("capture", "values")
        try:
            trace = run_trace(obj, *inputs, **trace_kwargs)
        except TraceError as e:
            trace = e.trace
            print(f"tracing.show: {e}", file=sys.stderr)
    else:
        raise TypeError(
            f"tracing.show takes a Trace, a trace file path or an nn.Module, not "
            f"{type(obj).__name__}"
        )
    with tempfile.TemporaryDirectory(prefix="scratchformer-show-") as folder:
        path = Path(folder) / "shown.sft"
        trace.save(path)
        _open_app(path)
    return trace


def app_command(path: Path) -> list[str]:
    """The child process's command line: this interpreter running the app on ``path``."""
    return [sys.executable, "-m", "app.cli", "app", str(path)]


def _open_app(path: Path) -> None:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])  # where ``app`` sits beside ``tracing``
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(app_command(path), env=env, check=False)
    if result.returncode not in (0, None):
        raise RuntimeError(
            f"the Scratchformer app exited with status {result.returncode} "
            f"(command: {' '.join(app_command(path))})"
        )
