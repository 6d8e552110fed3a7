"""``tracing.show(obj)``: the ``breakpoint()`` of this tool. Look at a trace in the app, now.

>>> tracing.show(model, tokens)              # doctest: +SKIP  (traces it, a failure too)
>>> tracing.show(trace)                      # doctest: +SKIP
>>> tracing.show("run.sft")                  # doctest: +SKIP

A model opens in *this* process when an in-process viewer is found (``app.windows.live_show``,
via its entry point or a registration) and a Qt window can run here: edits, re-trace and
Mean-ablate then work on the very object passed. Otherwise (no display, a notebook
kernel without ``%gui qt``) it says so, and the app runs in a child process (``python -m
app.cli app FILE``) on a temporary trace file, where edit actions are disabled with the
reason. ``tracing`` stays free of Qt (``tests/test_layering.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
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
        viewer, why = _live_viewer()
        if viewer is not None and why is None:
            return viewer(obj, inputs, {}, trace_kwargs)
        from tracing.capture.tracer import trace as run_trace

        if why:
            print(
                f"tracing.show: opening a saved copy in a separate app: {why}. Edits need "
                "the live model: run from a script, or %gui qt in IPython/Jupyter.",
                file=sys.stderr,
            )
        meta = dict(trace_kwargs.pop("meta", None) or {})
        meta.update(shown_by="tracing.show", shown_why=why or "no in-process viewer installed")
        trace_kwargs["meta"] = meta

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


_VIEWERS: list[tuple[Callable, Callable[[], str | None]]] = []


def register_viewer(show_live: Callable, why_not: Callable[[], str | None]) -> None:
    """Register an in-process viewer: ``show_live(model, args, kwargs, trace_kwargs)``
    opens it on the live model and returns the trace when it closes; ``why_not()`` says
    why it cannot run now (no display, a kernel without a Qt loop), or None."""
    _VIEWERS.insert(0, (show_live, why_not))


def _live_viewer() -> tuple[Callable | None, str | None]:
    """The viewer to use and why it cannot run now (None: it can); found at call time:
    registered ones first, then the ``scratchformer.viewers`` entry points."""
    if not _VIEWERS:
        from importlib.metadata import entry_points

        for entry in entry_points(group="scratchformer.viewers"):
            try:
                entry.load()  # registers itself
            except Exception:  # no Qt here, a broken install: the separate app instead
                continue
    if not _VIEWERS:
        return None, None
    show_live, why_not = _VIEWERS[0]
    return show_live, why_not()


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
