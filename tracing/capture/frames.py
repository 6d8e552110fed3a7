"""The two small records the hot path passes around: a module's spec and a running call.

Both are ``NamedTuple``s: fields read by name where the code is read by people
(``frame.index``, ``spec.path``), and still unpacked in one go where it runs on every op
(``parent, _, source, path = stack[-1]``), at the cost of a plain tuple.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tracing.record import SourceLocation


class ModuleSpec(NamedTuple):
    """What the recorders need of one module, made once per model (``Structure.specs``)."""

    path: str
    """Its name in ``named_modules()`` (``blocks.0.attn``)."""
    type_name: str
    """Its class name (``MultiHeadAttention``)."""
    is_torch: bool
    """One of torch's own modules: its ops are attributed to the line that called it."""
    positional: tuple[str, ...]
    """The names of its ``forward``'s positional parameters (``q``, ``k``, ``mask``)."""


class Frame(NamedTuple):
    """A module call that is running, on the tracer's stack (innermost last)."""

    index: int
    """Its module step's index."""
    module: Any
    """The ``nn.Module`` itself."""
    source: SourceLocation | None
    """The line its ops get, for one of torch's modules (the caller's); else None."""
    path: str
    """Its module path, as in the spec."""
