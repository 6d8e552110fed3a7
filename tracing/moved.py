"""Old import paths of the flat layout, mapped to their stage folders.

``tracing`` was once 39 flat modules; it is now split by stage (``file/``, ``capture/``,
``runs/``, ``analysis/``). Code written against the flat layout keeps working:
``from tracing.edits import Edit``, ``import tracing.trace_file`` and
``tracing.patching.sweep`` resolve to the module that now holds them, the very same module
object (so ``isinstance`` and monkeypatching agree). New code imports the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

MOVED: dict[str, str] = {
    # the file format
    "tracing.trace_file": "tracing.file",
    "tracing.container": "tracing.file.container",
    "tracing.crc32": "tracing.file.crc32",
    "tracing.source_files": "tracing.file.source_files",
    # capture
    "tracing.source": "tracing.capture.source",
    "tracing.tool_frames": "tracing.capture.tool_frames",
    "tracing.fused_attention": "tracing.capture.fused_attention",
    "tracing.distributed": "tracing.capture.distributed",
    "tracing.edits": "tracing.capture.edits",
    "tracing.values": "tracing.capture.value_sinks",
    "tracing.postmortem": "tracing.capture.postmortem",
    # runs built on the tracer
    "tracing.backward": "tracing.runs.backward",
    "tracing.backward_collectives": "tracing.runs.backward_collectives",
    "tracing.generation": "tracing.runs.generation",
    "tracing.watcher": "tracing.runs.watcher",
    "tracing.edit_run": "tracing.runs.edit_run",
    "tracing.patching": "tracing.runs.patching",
    # analysis
    "tracing.report": "tracing.analysis.report",
    "tracing.trace_diff": "tracing.analysis.trace_diff",
    "tracing.divergence": "tracing.analysis.divergence",
    "tracing.lens": "tracing.analysis.lens",
    "tracing.gradients": "tracing.analysis.gradients",
    "tracing.graph": "tracing.analysis.graph",
    "tracing.ranks": "tracing.analysis.ranks",
    "tracing.rank_report": "tracing.analysis.rank_report",
    "tracing.attention": "tracing.analysis.attention_maps",
}
"""Old module path -> the module that holds its code now."""


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and hands back the already-imported new module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """Nothing to run: the new module is imported already."""


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())


def submodules(package: str):
    """A stage folder's ``__getattr__``: its modules as attributes, each imported on first use.

    So every dotted path the docs show reads after a bare ``import tracing``
    (``tracing.analysis.lens.logit_lens``, ``tracing.runs.patching.sweep``), whatever was
    imported before, and a folder's ``__init__`` need not import what it does not use.
    """

    def __getattr__(name: str):
        if name.startswith("__"):  # dunder probes (``__path__``, ``__wrapped__``...) stay misses
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise  # the module exists and one of its own imports is missing
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__


def lazy_names(package: str, names: dict[str, str]):
    """A stage folder's ``__getattr__`` for the names its ``__init__`` offers: each name in
    ``names`` (name -> the module that defines it) imported on first use, then kept; any
    other name is one of its modules (:func:`submodules`). So importing one module of the
    folder (``tracing.file.loading``) does not import the others (the writers, and torch
    with them)."""
    module_attribute = submodules(package)

    def __getattr__(name: str):
        if name not in names:
            return module_attribute(name)
        value = getattr(importlib.import_module(names[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
