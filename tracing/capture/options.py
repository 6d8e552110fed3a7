"""What a capture records and where it goes: one :class:`CaptureOptions` for every entry point.

``tracing.trace``, ``Tracer``, ``trace_step``, ``record_step`` and ``trace_generate`` take
the same keyword arguments (``capture=``, ``value_cap=``, ``break_on=``, ``out=``...) and
turn them into one ``CaptureOptions``, checked once here and passed down whole. An option
added to the dataclass is then one more keyword of each entry point (``tests`` check that
every one of them takes every field, with the same default), never five copies to keep
in step. Callers can also build the options once and pass them as ``options=``.

>>> opts = CaptureOptions(capture="values", value_dtype=torch.float16)  # doctest: +SKIP
>>> tracing.trace(model, ids, options=opts)                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tracing.record import CAPTURE_LEVELS

NAMING_LEVELS = ("full", "proven", "inputs", "ops", "off")
"""``CaptureOptions.naming``, from the most evidence to none."""

DEFAULT_VALUE_CAP = 64 * 2**20
"""Bytes: a tensor larger than this (after any ``value_dtype`` downcast) keeps no copy."""


@dataclass(frozen=True)
class CaptureOptions:
    """The options of one capture (see :class:`tracing.Tracer` for how each acts)."""

    capture: str = "stats"
    """``"shapes"``, ``"stats"`` (min/max/mean/std, NaN and Inf counts) or ``"values"``."""
    dims: Mapping[str, int] | None = None
    """Sizes for symbolic axis names, e.g. ``{"B": 1, "T": 12, "C": 64}``."""
    value_cap: int | None = DEFAULT_VALUE_CAP
    """At ``values``, tensors larger than this many bytes keep no copy (None: all do)."""
    value_dtype: torch.dtype | None = None
    """At ``values``, floating copies are stored in this dtype (e.g. ``torch.float16``)."""
    ops: bool = True
    """Also record tensor ops, not only module calls."""
    meta: Mapping[str, Any] | None = None
    """Extra entries for ``trace.meta`` (``tokens``, ``text``...)."""
    break_on: Any = None
    """Breakpoint conditions (``tracing.breakpoints``): the capture stops at the first hit."""
    edits: Any = None
    """Edits applied while the model runs (``tracing.edits``)."""
    out: str | os.PathLike | None = None
    """Write the trace to this file while it records (values streamed, memory flat)."""
    naming: str = "proven"
    """How axes are named (``tracing.dims.prove``): ``"full"`` runs the inputs pass and a
    pass per config size knob of a model that can be rebuilt; ``"proven"`` the inputs pass
    and a knob pass only where two names still tie; ``"inputs"`` the inputs pass only;
    ``"ops"`` no extra pass (what the ops carry from the inputs, config, declarations);
    ``"off"`` no names at all."""
    rebuild: Any = None
    """``config -> model``: how a knob pass rebuilds the model with one size moved (on the
    meta device). By default a model whose class takes its ``.config`` is rebuilt so. For a
    model built from arguments, ``tracing.Constructor(Cls, **the_arguments)``: its integer
    arguments are the knobs."""

    def __post_init__(self) -> None:
        if self.capture not in CAPTURE_LEVELS:
            raise ValueError(
                f"capture must be one of {', '.join(CAPTURE_LEVELS)}; got {self.capture!r}"
            )
        for letter, value in (self.dims or {}).items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"dims[{letter!r}] must be an int size, got {value!r}")
        if self.naming not in NAMING_LEVELS:
            raise ValueError(
                f"naming must be one of {', '.join(NAMING_LEVELS)}; got {self.naming!r}"
            )
        if self.value_dtype is not None and not isinstance(self.value_dtype, torch.dtype):
            raise TypeError(f"value_dtype must be a torch.dtype, got {self.value_dtype!r}")
        if self.value_cap is not None:
            object.__setattr__(self, "value_cap", int(self.value_cap))
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))

    @classmethod
    def of(cls, options: CaptureOptions | None = None, **given: Any) -> CaptureOptions:
        """``options`` (or the defaults) with the keyword arguments an entry point was
        given. Only arguments that differ from the default count, so ``options=`` and
        explicit keywords combine; naming an unknown option is a ``TypeError``."""
        unknown = sorted(set(given) - FIELDS)
        if unknown:
            raise TypeError(f"unknown capture option(s): {', '.join(unknown)}")
        base = options if options is not None else cls()
        if not isinstance(base, CaptureOptions):
            raise TypeError(f"options must be a CaptureOptions, got {type(base).__name__}")
        changed = {k: v for k, v in given.items() if not _is_default(k, v)}
        return dataclasses.replace(base, **changed) if changed else base

    def replace(self, **changes: Any) -> CaptureOptions:
        """A copy with some options changed."""
        return dataclasses.replace(self, **changes)


FIELDS = frozenset(f.name for f in dataclasses.fields(CaptureOptions))
"""The option names, as every entry point spells its keyword arguments."""

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CaptureOptions)}


def _is_default(name: str, value: Any) -> bool:
    default = _DEFAULTS[name]
    return value is default or (type(value) is type(default) and value == default)
