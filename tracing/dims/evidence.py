"""What names an axis, gathered as plain data before any naming: :class:`Evidence`.

- **Letters** (:mod:`tracing.dims.letters`): each letter's size and where it came from — the
  caller's ``dims=``, a config attribute in one of its spellings, a module attribute, a
  layer's shape, the first input's shape, a name the source passes as a size.
- **Passes** (:mod:`tracing.dims.passes`): the model run again, shapes only, at other sizes.
  The *inputs pass* changes the batch and token counts (``B``, ``T``); a *knob pass* rebuilds
  the model on the ``meta`` device with one config size moved (``num_attention_heads`` 64 ->
  128). Each pass keeps the letter sizes it ran with and, per tensor of the real trace, its
  shape there (:mod:`tracing.dims.align`). An axis is what moves with it.
- **Declarations**: per module path, the letter sizes its own attributes declare
  (``self.num_heads = 4``); each parameter's path; and, for torch's own layers, which of
  the layer's attributes sizes each axis of its parameters (:mod:`tracing.dims.contracts`).

Gathering runs the model (the passes); naming (:func:`tracing.dims.naming.name_axes`) only
reads what is gathered here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tracing.dims.contracts import Contract
from tracing.dims.letters import Sized


@dataclass
class Subject:
    """What gathering needs from the tracer: the model, its config, the root call."""

    model: Any
    config: Any
    call: tuple[tuple, dict] | None  # the forward's arguments; None: it did not complete
    param_paths: Mapping[int, str]
    given: Mapping[str, int] | None  # the caller's dims=
    train: bool = False
    ops: bool = True
    distributed: bool = False
    first_input_shape: tuple[int, ...] | None = None
    rebuild: Callable[[Any], Any] | None = None  # config -> model (a knob pass's twin)


@dataclass
class Pass:
    """One extra run: what it moved, the letter sizes it ran with, each tensor's shape."""

    what: str  # "inputs" (B and T) or "config.<knob>"
    how: str  # "device" (a real run), "meta"
    sizes: dict[str, int]
    shapes: list[tuple[int, ...] | None]  # per tensor id of the real trace; None: unpaired
    seconds: float = 0.0


@dataclass
class Evidence:
    """Everything :func:`~tracing.dims.naming.name_axes` reads, and nothing else."""

    letters: dict[str, Sized]
    inputs: Pass | None = None  # the inputs pass, if it ran
    knobs: list[Pass] = field(default_factory=list)  # one pass per config knob moved
    attributes: dict[str, dict[str, int]] = field(default_factory=dict)
    contracts: dict[str, tuple[Contract | None, ...]] = field(default_factory=dict)
    param_paths: Mapping[int, str] = field(default_factory=dict)
    unread: dict[str, Sized] = field(default_factory=dict)  # whose knob passes moved no axis
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # meta["dims_evidence"]
